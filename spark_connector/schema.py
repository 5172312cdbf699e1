"""The row shape of the "amqp" format, and conversions between AMQP messages and rows.

The source emits one flat row per message; the sink reads the same column names, so a stream read
from one broker can be written to another unchanged (apart from the columns listed in
`SINK_IGNORED_COLUMNS`).
"""

from __future__ import annotations

import datetime
import functools
import operator
from collections.abc import Iterator, Mapping
from typing import Any

import pika
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

ARROW_BATCH_ROWS = 10_000  # rows a source task hands Spark at a time (one Arrow record batch)

# Message properties carried in columns of the same name, in AMQP's property order.
STRING_PROPERTIES = ("content_type", "content_encoding")
LATER_STRING_PROPERTIES = ("correlation_id", "reply_to", "expiration", "message_id")
TRAILING_STRING_PROPERTIES = ("type", "user_id", "app_id")

# Source columns the sink does not copy into the published message: where the message came from,
# the per-delivery flag, the decoded body, and properties the sink sets itself (message_id is
# replaced by a stable id, delivery_mode follows the `persistent` option, and user_id must name the
# publishing connection's user or the broker closes the channel).
SINK_IGNORED_COLUMNS = frozenset(
    {"exchange", "routing_key", "redelivered", "text", "message_id", "delivery_mode", "user_id"}
)


def source_schema(with_text: bool) -> StructType:
    """Columns of the source; `text` only when the `bodyEncoding` option is set."""
    fields = [StructField("body", BinaryType(), nullable=False)]
    if with_text:
        fields.append(StructField("text", StringType()))
    fields += [
        StructField("exchange", StringType(), nullable=False),
        StructField("routing_key", StringType(), nullable=False),
        StructField("redelivered", BooleanType(), nullable=False),
        *(StructField(name, StringType()) for name in STRING_PROPERTIES),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("delivery_mode", IntegerType()),
        StructField("priority", IntegerType()),
        *(StructField(name, StringType()) for name in LATER_STRING_PROPERTIES),
        StructField("timestamp", TimestampType()),
        *(StructField(name, StringType()) for name in TRAILING_STRING_PROPERTIES),
    ]
    return StructType(fields)


def _header_pairs(table: Mapping[str, Any], without: str | None = None) -> list[tuple[str, str | None]]:
    """A headers table as the (key, text) pairs of a map<string,string> column (``without`` left out)."""
    return [(str(key), _header_text(value)) for key, value in table.items() if key != without]


def _header_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id")
_property_values = operator.attrgetter(*PROPERTY_NAMES)  # a message's properties as a tuple, in that order


class QueueRows:
    """The queue source's unacknowledged deliveries, kept column by column in arrival order: a batch's rows leave the
    driver as one Arrow IPC stream (a task only reads it back), and no pika object outlives its callback, so the
    garbage collector has few containers to walk however many deliveries the prefetch window holds."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.exchanges: list[str] = []
        self.routing_keys: list[str] = []
        self.redelivered: list[bool] = []
        self.properties: list[tuple] = []  # each delivery's properties, in PROPERTY_NAMES order

    def __len__(self) -> int:
        return len(self.bodies)

    def add(self, method: pika.spec.Basic.Deliver, properties: pika.BasicProperties, body: bytes) -> None:
        self.bodies.append(body)
        self.exchanges.append(method.exchange)
        self.routing_keys.append(method.routing_key)
        self.redelivered.append(method.redelivered)
        self.properties.append(_property_values(properties))

    def drop(self, count: int) -> None:
        """Forget the first `count` rows (acknowledged)."""
        for column in self._columns():
            del column[:count]

    def copy(self, start: int, stop: int) -> QueueRows:
        """Rows start..stop-1, apart from these (which keep growing)."""
        rows = QueueRows()
        rows.bodies, rows.exchanges, rows.routing_keys, rows.redelivered, rows.properties = (
            column[start:stop] for column in self._columns())
        return rows

    def _columns(self) -> tuple[list, ...]:
        return self.bodies, self.exchanges, self.routing_keys, self.redelivered, self.properties

    def arrow_stream(self, encoding: str | None) -> bytes:
        """The rows as an Arrow IPC stream of `source_schema`, in record batches of ARROW_BATCH_ROWS."""
        schema = _arrow_schema(source_schema(encoding is not None))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for start in range(0, len(self), ARROW_BATCH_ROWS):
                writer.write_batch(self._batch(start, start + ARROW_BATCH_ROWS, encoding, schema))
        return sink.getvalue().to_pybytes()

    def _batch(self, start: int, stop: int, encoding: str | None, schema: pa.Schema) -> pa.RecordBatch:
        bodies = self.bodies[start:stop]
        (content_types, content_encodings, headers, delivery_modes, priorities, correlation_ids, reply_tos,
         expirations, message_ids, timestamps, types, user_ids, app_ids) = zip(*self.properties[start:stop])
        columns: list = [bodies]
        if encoding is not None:
            columns.append([body.decode(encoding, errors="replace") for body in bodies])
        columns += [self.exchanges[start:stop], self.routing_keys[start:stop], self.redelivered[start:stop],
                    content_types, content_encodings,
                    [None if table is None else _header_pairs(table) for table in headers],
                    delivery_modes, priorities, correlation_ids, reply_tos, expirations, message_ids,
                    [None if stamp is None else stamp * 1_000_000 for stamp in timestamps], types, user_ids, app_ids]
        return pa.RecordBatch.from_arrays([pa.array(column, field.type) for column, field in zip(columns, schema)],
                                          schema=schema)


def read_arrow_stream(data: bytes) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow IPC stream (QueueRows.arrow_stream), without copying their buffers."""
    yield from pa.ipc.open_stream(data)


def _arrow_schema(schema: StructType) -> pa.Schema:
    """A source schema as Spark expects record batches of it (the schema it checks them against)."""
    return to_arrow_schema(schema, timezone="UTC")


def sink_property_columns(schema: StructType, body_column: str, routing_key_column: str | None) -> list[str]:
    """Columns of `schema` the sink copies into message properties (same names as the source's)."""
    known = set(STRING_PROPERTIES + LATER_STRING_PROPERTIES + TRAILING_STRING_PROPERTIES)
    known |= {"headers", "priority", "timestamp"}
    used = {body_column, routing_key_column}
    return [name for name in schema.fieldNames() if name in known - SINK_IGNORED_COLUMNS and name not in used]


def row_properties(values: Mapping[str, Any], message_id: str, persistent: bool) -> pika.BasicProperties:
    """Message properties for one sink row, from its property columns (see `sink_property_columns`)."""
    properties = pika.BasicProperties(message_id=message_id, delivery_mode=2 if persistent else 1)
    for name, value in values.items():
        if value is None:
            continue
        if name == "timestamp":
            value = int(value.timestamp()) if isinstance(value, datetime.datetime) else int(value)
        elif name == "headers":
            value = dict(value)
        elif name == "priority":
            value = int(value)
        else:
            value = str(value)
        setattr(properties, name, value)
    return properties


# Message properties a stream row carries in its `properties` map (headers and timestamp have columns of their own)
STREAM_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                     "expiration", "message_id", "type", "user_id", "app_id")
_stream_property_values = operator.attrgetter(*STREAM_PROPERTIES)  # a stream message's, as a tuple in that order
OFFSET_HEADER = "x-stream-offset"  # the header the broker adds to every delivery from a stream


def stream_schema() -> StructType:
    """Columns of the stream source: one row per message, keyed by (stream, offset)."""
    return StructType([
        StructField("stream", StringType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("body", BinaryType(), nullable=False),
        StructField("routing_key", StringType(), nullable=False),
        StructField("exchange", StringType(), nullable=False),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("timestamp", TimestampType()),
    ])


class StreamRows:
    """Rows of the stream source gathered column by column, for Spark as Arrow record batches: Spark would convert
    tuples one value at a time, which costs a task more than reading its messages. Messages of a stream mostly
    carry the same properties and no header but their offset: a row whose properties are the previous row's shares
    its map, and a row without other headers shares one empty map (Arrow copies them; nothing mutates them)."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.offsets: list[int] = []
        self.bodies: list[bytes] = []
        self.routing_keys: list[str] = []
        self.exchanges: list[str] = []
        self.properties: list[list[tuple[str, str]]] = []  # each row's map, as (key, value) pairs
        self.headers: list[list[tuple[str, str | None]]] = []
        self.timestamps: list[int | None] = []  # microseconds since the epoch
        self._last_values: tuple | None = None  # the latest row's property values, in STREAM_PROPERTIES order
        self._last_pairs: list[tuple[str, str]] = []  # and its map

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, method: pika.spec.Basic.Deliver, properties: pika.BasicProperties,
            body: bytes) -> None:
        """One message's row (its offset header is the `offset` column)."""
        self.offsets.append(offset)
        self.bodies.append(body)
        self.routing_keys.append(method.routing_key)
        self.exchanges.append(method.exchange)
        values = _stream_property_values(properties)
        if values != self._last_values:
            self._last_values = values
            self._last_pairs = [(name, _header_text(value)) for name, value in zip(STREAM_PROPERTIES, values)
                                if value is not None]
        self.properties.append(self._last_pairs)
        headers = properties.headers
        self.headers.append(_NO_PAIRS if headers is None or len(headers) == 1 and OFFSET_HEADER in headers
                            else _header_pairs(headers, without=OFFSET_HEADER))
        timestamp = properties.timestamp
        self.timestamps.append(None if timestamp is None else timestamp * 1_000_000)

    def take(self) -> pa.RecordBatch:
        """The rows gathered so far, which are then forgotten."""
        schema = _stream_arrow_schema()
        gathered = [self.offsets, self.bodies, self.routing_keys, self.exchanges, self.properties, self.headers,
                    self.timestamps]
        streams = pa.array([self.stream] * len(self.offsets), pa.string())
        batch = pa.RecordBatch.from_arrays(
            [streams, *(pa.array(column, field.type) for column, field in zip(gathered, list(schema)[1:]))],
            schema=schema)
        for column in gathered:
            column.clear()
        return batch


_NO_PAIRS: list = []  # the map of a row without headers (shared: never mutated)


@functools.cache
def _stream_arrow_schema() -> pa.Schema:
    return _arrow_schema(stream_schema())
