"""Parsing and validation of the options given to the "amqp" format.

Spark hands options to a Python data source with lower-cased keys, so every lookup here is by the
lower-cased name while error messages use the documented camelCase spelling.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The queue source's window (the most messages unacknowledged, all held by the driver). Spark's fixed cost per
# micro-batch (about 150 ms here, a no-op source's) is paid per batch, so batches are large: a third of the window,
# which keeps the next two batches coming while one runs (measured: docs/spark.md)
DEFAULT_PREFETCH = 180_000
MAX_PREFETCH = 65535  # basic.qos's prefetch-count is an unsigned short (the queue source consumes more than once)
DEFAULT_CONFIRM_WINDOW = 1000
DEFAULT_STREAM_PREFETCH = 1000


class AmqpOptionError(ValueError):
    """An option of the "amqp" format is missing, malformed or contradicts another one."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None or value == "" else value


def _required(options: Mapping[str, str], name: str, role: str) -> str:
    value = _get(options, name)
    if value is None:
        raise AmqpOptionError(f"amqp {role}: option '{name}' is required")
    return value


def _int_at_least(options: Mapping[str, str], name: str, role: str, default: int | None, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        kind = "positive" if minimum > 0 else "non-negative"
        raise AmqpOptionError(f"amqp {role}: option '{name}' must be a {kind} integer, got {raw!r}")
    return value


def _positive_int(options: Mapping[str, str], name: str, role: str, default: int | None) -> int | None:
    return _int_at_least(options, name, role, default, 1)


def _prefetch(options: Mapping[str, str], role: str, default: int) -> int:
    prefetch = _positive_int(options, "prefetch", role, default)
    if prefetch > MAX_PREFETCH:
        raise AmqpOptionError(f"amqp {role}: option 'prefetch' must be at most {MAX_PREFETCH} "
                              f"(AMQP's prefetch count is 16 bits), got {prefetch}")
    return prefetch


def consumer_windows(prefetch: int) -> tuple[int, int]:
    """A window of `prefetch` unacknowledged messages as (consumers, the prefetch count of each): basic.qos counts per
    consumer in 16 bits, so a larger window is several consumers on one channel, whose delivery tags (and so its
    multiple acks) are common to them."""
    consumers = -(-prefetch // MAX_PREFETCH)
    return consumers, -(-prefetch // consumers)


def _bool(options: Mapping[str, str], name: str, role: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise AmqpOptionError(f"amqp {role}: option '{name}' must be 'true' or 'false', got {raw!r}")
    return lowered == "true"


def _uri(options: Mapping[str, str], role: str) -> str:
    uri = _required(options, "uri", role)
    if not uri.startswith(("amqp://", "amqps://")):
        raise AmqpOptionError(f"amqp {role}: option 'uri' must start with amqp:// or amqps://, got {uri!r}")
    return uri


def body_encoding(options: Mapping[str, str]) -> str | None:
    """The source's `bodyEncoding` option: a text codec the body is decoded with, or None."""
    encoding = _get(options, "bodyEncoding")
    if encoding is not None:
        try:
            b"?".decode(encoding, errors="replace")  # also refuses codecs that do not make text (hex, zlib...)
        except LookupError:
            raise AmqpOptionError(f"amqp source: option 'bodyEncoding' names no known text codec: {encoding!r}") from None
    return encoding


@dataclass(frozen=True)
class SourceOptions:
    """What `spark.readStream.format("amqp")` consumes and how."""

    uri: str
    queue: str | None  # queue to consume; declared durable and bound when `exchange` is also given
    exchange: str | None  # exchange to bind `queue` (or a private server-named queue) to
    binding_key: str  # binding key used with `exchange`
    prefetch: int  # the most messages held unacknowledged at once (above MAX_PREFETCH: several consumers)
    max_messages_per_batch: int  # most messages in one micro-batch (the default read limit)
    body_encoding: str | None  # when set, a `text` column holds the body decoded with this codec

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        role = "source"
        queue = _get(options, "queue")
        exchange = _get(options, "exchange")
        if queue is None and exchange is None:
            raise AmqpOptionError("amqp source: option 'queue' or 'exchange' is required")
        binding_key = _get(options, "bindingKey")
        if binding_key is not None and exchange is None:
            raise AmqpOptionError("amqp source: option 'bindingKey' needs option 'exchange'")
        prefetch = _positive_int(options, "prefetch", role, DEFAULT_PREFETCH)
        return cls(
            uri=_uri(options, role),
            queue=queue,
            exchange=exchange,
            binding_key=binding_key or "",
            prefetch=prefetch,
            max_messages_per_batch=_positive_int(options, "maxMessagesPerBatch", role, max(1, prefetch // 3)),
            body_encoding=body_encoding(options),
        )


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def _duration_seconds(options: Mapping[str, str], name: str, role: str, default: float) -> float:
    """A duration such as '15m', '30s', '500ms' or a bare number of seconds (Kafka's maxTriggerDelay format)."""
    raw = _get(options, name)
    if raw is None:
        return default
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)", raw.strip().lower())
    if match is None or (match.group(2) or "s") not in DURATION_UNITS:
        raise AmqpOptionError(f"amqp {role}: option '{name}' must be a duration such as '15m' or '30s', got {raw!r}")
    return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]


@dataclass(frozen=True)
class StreamSourceOptions:
    """What `spark.readStream.format("amqp").option("stream", ...)` reads and how; the option names are those of
    Spark's Kafka source wherever one exists."""

    uri: str
    stream: str  # the stream queue to read
    starting_offsets: str  # "earliest", "latest" or a JSON object {stream: offset}
    starting_timestamp: int | None  # ms since the epoch: start at the first chunk written then or later
    max_offsets_per_trigger: int | None  # most offsets one micro-batch covers
    min_offsets_per_trigger: int | None  # fewest offsets worth a micro-batch, until max_trigger_delay passed
    max_trigger_delay: float  # seconds a micro-batch waits for min_offsets_per_trigger
    min_partitions: int  # fewest Spark tasks (offset ranges) per micro-batch
    max_records_per_partition: int | None  # most offsets one task reads
    fail_on_data_loss: bool  # a range retention already dropped fails the query (else it is logged)
    prefetch: int  # basic.qos prefetch count of the tasks' (and the tail follower's) consumers

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamSourceOptions:
        role = "source"
        if _get(options, "queue") is not None or _get(options, "exchange") is not None:
            raise AmqpOptionError("amqp source: option 'stream' excludes options 'queue' and 'exchange'")
        starting = (_get(options, "startingOffsets") or "latest").strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        elif not starting.startswith("{"):
            raise AmqpOptionError("amqp source: option 'startingOffsets' must be 'earliest', 'latest' or a JSON "
                                  f"object such as {{\"stream\": 42}}, got {starting!r}")
        timestamp = _int_at_least(options, "startingTimestamp", role, None, 0)
        if timestamp is not None and _get(options, "startingOffsets") is not None:
            raise AmqpOptionError("amqp source: options 'startingOffsets' and 'startingTimestamp' exclude each other")
        return cls(
            uri=_uri(options, role),
            stream=_required(options, "stream", role),
            starting_offsets=starting,
            starting_timestamp=timestamp,
            max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger", role, None),
            min_offsets_per_trigger=_positive_int(options, "minOffsetsPerTrigger", role, None),
            max_trigger_delay=_duration_seconds(options, "maxTriggerDelay", role, 15 * 60.0),
            min_partitions=_positive_int(options, "minPartitions", role, 1),
            max_records_per_partition=_positive_int(options, "maxRecordsPerPartition", role, None),
            fail_on_data_loss=_bool(options, "failOnDataLoss", role, True),
            prefetch=_prefetch(options, role, DEFAULT_STREAM_PREFETCH),
        )


@dataclass(frozen=True)
class SinkOptions:
    """Where and how `df.write(Stream).format("amqp")` publishes."""

    uri: str
    exchange: str  # exchange every row is published to ("" is the default exchange)
    routing_key: str  # fixed routing key, used when `routing_key_column` is None
    routing_key_column: str | None  # column whose value is each row's routing key
    body_column: str  # column holding the message body (binary or string)
    mandatory: bool  # publish with the mandatory flag: an unroutable message fails the task
    persistent: bool  # delivery_mode 2 (persistent) rather than 1
    confirm_window: int  # most publishes awaiting a broker confirm at once

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        role = "sink"
        routing_key = _get(options, "routingKey")
        routing_key_column = _get(options, "routingKeyColumn")
        if routing_key is not None and routing_key_column is not None:
            raise AmqpOptionError("amqp sink: options 'routingKey' and 'routingKeyColumn' exclude each other")
        return cls(
            uri=_uri(options, role),
            exchange=_get(options, "exchange") or "",
            routing_key=routing_key or "",
            routing_key_column=routing_key_column,
            body_column=_get(options, "bodyColumn") or "body",
            mandatory=_bool(options, "mandatory", role, False),
            persistent=_bool(options, "persistent", role, True),
            confirm_window=_positive_int(options, "confirmWindow", role, DEFAULT_CONFIRM_WINDOW),
        )
