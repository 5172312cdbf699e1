"""A dynamic shovel's definition: the value of its runtime parameter (component "shovel"), checked with RabbitMQ's
keys, defaults and texts (rabbit_shovel_parameters, rabbit_amqp091_shovel), and what the shovel makes of it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from broker.shovel.uri import Address, UriError, parse, without_credentials
from protocol.erlang_terms import erlang_term, pretty

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp091", "amqp10", "local")
DEFAULT_RECONNECT_DELAY = 5  # seconds (rabbit_shovel.hrl)
DEFAULT_PREFETCH = 1000
STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                     "type", "user_id", "app_id", "cluster_id")
NUMBER_PROPERTIES = ("delivery_mode", "priority", "timestamp")
# key -> its check: "binary", "queue" (a binary of 255 bytes at most), "number", "boolean", "uri", "delete-after",
# "table", "properties", "ack-mode" and "protocol" (one of ACK_MODES, PROTOCOLS)
KEYS = {
    "ack-mode": "ack-mode", "reconnect-delay": "number", "src-protocol": "protocol", "dest-protocol": "protocol",
    "src-uri": "uri", "src-exchange": "binary", "src-exchange-key": "binary", "src-queue": "binary",
    "src-queue-args": "table", "src-consumer-args": "table", "src-consumer-name": "binary",
    "prefetch-count": "number", "src-prefetch-count": "number", "delete-after": "delete-after",
    "src-delete-after": "delete-after", "src-predeclared": "boolean",
    "dest-uri": "uri", "dest-exchange": "binary", "dest-exchange-key": "binary", "dest-queue": "queue",
    "dest-queue-args": "table", "add-forward-headers": "boolean", "add-timestamp-header": "boolean",
    "dest-add-forward-headers": "boolean", "dest-add-timestamp-header": "boolean",
    "publish-properties": "properties", "dest-publish-properties": "properties", "dest-predeclared": "boolean",
}
MANDATORY = ("src-uri", "dest-uri")


class ShovelDefinitionError(ValueError):
    """The value is not a shovel's definition: RabbitMQ's "Validation failed" text, each reason on a line."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("Validation failed\n\n" + "".join(f"{reason}\n" for reason in reasons))
        self.reasons = reasons


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One end of a shovel: where it connects, and what it reads from or publishes to."""

    uris: tuple[str, ...]  # as given (tried in turn)
    exchange: str | None
    exchange_key: str | None
    queue: str | None
    queue_args: dict
    predeclared: bool

    def addresses(self) -> list[Address]:
        return [parse(uri) for uri in self.uris]

    def shown(self, prefix: str) -> dict:
        """Its queue or exchange keys, as the status and the x-shovelled header show them."""
        if prefix == "src":
            if self.queue is not None:
                return {"src_queue": self.queue}
            return {"src_exchange": self.exchange, "src_exchange_key": self.exchange_key or ""}
        return {f"dest_{key}": value for key, value in (("exchange", self.exchange),
                                                       ("exchange_key", self.exchange_key),
                                                       ("queue", self.queue)) if value is not None}


@dataclasses.dataclass(frozen=True)
class Shovel:
    """What a shovel does, from its checked definition."""

    vhost: str
    name: str
    source: Endpoint
    destination: Endpoint
    ack_mode: str
    reconnect_delay: float  # seconds; 0: a failed shovel is not started again
    prefetch: int
    delete_after: str | int  # "never", "queue-length", or a count of messages
    consumer_args: dict
    consumer_name: str
    add_forward_headers: bool
    add_timestamp_header: bool
    publish_properties: dict

    @property
    def exchange_queue(self) -> str:
        """The durable queue an exchange source is read through: kept while the shovel is down (a server-named
        exclusive one, as RabbitMQ's, would lose what the exchange routes meanwhile), deleted with the shovel. Its
        name holds a digest of (vhost, name), so no two shovels share one."""
        digest = hashlib.sha256(json.dumps([self.vhost, self.name]).encode()).hexdigest()[:16]
        return f"shovel-{self.name[:100]}-{digest}"

    @property
    def src_uri(self) -> str:
        return without_credentials(self.source.uris[0])

    @property
    def dest_uri(self) -> str:
        return without_credentials(self.destination.uris[0])


def checked(vhost: str, name: str, value: Any) -> Shovel:
    """The shovel a parameter value defines; ShovelDefinitionError with every reason it does not."""
    if not isinstance(value, dict):
        raise ShovelDefinitionError([f"{name} should be a JSON object, actually was {write_value(value)}"])
    reasons = _across_keys(value)
    unknown = [(key, item) for key, item in value.items() if key not in KEYS]
    if unknown:
        terms = "[" + ",".join(f"{{{write_value(key)},{write_value(item)}}}" for key, item in unknown) + "]"
        reasons.append(f"Unrecognised terms {terms} in {name}")
    for key in MANDATORY:
        if key not in value:
            reasons.append(f'Key "{key}" not found in {name}')
    for key, check in KEYS.items():
        if key in value:
            reason = _check(key, check, value[key])
            if reason:
                reasons.append(reason)
    if reasons:
        raise ShovelDefinitionError(reasons)
    return _shovel(vhost, name, value)


def _across_keys(value: dict) -> list[str]:
    reasons = []
    sources = ("src-exchange" in value) + ("src-queue" in value)
    if not sources:
        reasons.append("Must specify 'src-exchange' or 'src-queue'")
    elif sources == 2:
        reasons.append("Cannot specify 'src-exchange' and 'src-queue'")
    delete_after = value.get("src-delete-after", value.get("delete-after"))
    if value.get("ack-mode") == "no-ack" and isinstance(delete_after, int) and not isinstance(delete_after, bool):
        reasons.append("Cannot specify 'no-ack' and numerical 'delete-after'")
    if "dest-exchange" in value and "dest-queue" in value:
        reasons.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    return reasons


def _check(key: str, check: str, item: Any) -> str | None:
    if check in ("binary", "queue", "ack-mode", "protocol") and not isinstance(item, str):
        return f"{key} should be binary, actually was {write_value(item)}"
    if check == "queue" and len(item.encode()) > 255:
        return f"{key} should be less than 255 bytes, actually was {write_value(item)}"
    if check == "ack-mode" and item not in ACK_MODES:
        return f"{key} should be one of {write_value(list(ACK_MODES))}, actually was {write_value(item)}"
    if check == "protocol":
        if item not in PROTOCOLS:
            return f"{key} should be one of {write_value(list(PROTOCOLS))}, actually was {write_value(item)}"
        if item != "amqp091":
            return f"{key}: Warren's shovels speak amqp091 only, not {item}"
    if check == "number" and (isinstance(item, bool) or not isinstance(item, (int, float)) or item < 0):
        return f"{key} should be a number, actually was {write_value(item)}"
    if check == "boolean" and not isinstance(item, bool):
        return f"{key} should be boolean, actually was {write_value(item)}"
    if check == "delete-after" and not (item in ("never", "queue-length") or (
            isinstance(item, int) and not isinstance(item, bool) and item >= 0)):
        return (f'{key} should be a number greater than or equal to 0, "never" or "queue-length", actually was '
                f"{write_value(item)}")
    if check == "table" and not isinstance(item, dict) and item != []:  # ([]: an empty proplist, as RabbitMQ takes)
        return f"{key} should be a JSON object, actually was {write_value(item)}"
    if check == "properties":
        return _check_properties(key, item)
    if check == "uri":
        return _check_uris(key, item)
    return None


def _check_properties(key: str, item: Any) -> str | None:
    if item == []:  # (an empty proplist, as RabbitMQ takes it)
        return None
    if not isinstance(item, dict):
        return f"{key} should be a JSON object, actually was {write_value(item)}"
    for name, value in item.items():
        if name in STRING_PROPERTIES and not isinstance(value, str):
            return f"{name} should be binary, actually was {write_value(value)}"
        if name in NUMBER_PROPERTIES and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name} should be a number, actually was {write_value(value)}"
        if name not in STRING_PROPERTIES and name not in NUMBER_PROPERTIES:
            return f"Unrecognised terms [{{{write_value(name)},{write_value(value)}}}] in {key}"
    return None


def _check_uris(key: str, item: Any) -> str | None:
    uris = item if isinstance(item, list) else [item]
    if not uris or not all(isinstance(uri, str) for uri in uris):
        return f"{key} should be list, actually was {write_value(item)}"
    for uri in uris:
        try:
            parse(uri)
        except UriError as error:
            return f'"{without_credentials(uri)}" not a valid URI: {error}'
    return None


def _shovel(vhost: str, name: str, value: dict) -> Shovel:
    def uris(key: str) -> tuple[str, ...]:
        given = value[key]
        return tuple(given) if isinstance(given, list) else (given,)

    def either(key: str, default: Any) -> Any:  # the prefixed key wins over its old name
        return value.get(key, value.get(key.partition("-")[2], default))

    source = Endpoint(uris("src-uri"), value.get("src-exchange"), value.get("src-exchange-key"),
                      value.get("src-queue"), value.get("src-queue-args") or {}, value.get("src-predeclared", False))
    destination = Endpoint(uris("dest-uri"), value.get("dest-exchange"), value.get("dest-exchange-key"),
                           value.get("dest-queue"), value.get("dest-queue-args") or {},
                           value.get("dest-predeclared", False))
    return Shovel(
        vhost=vhost, name=name, source=source, destination=destination,
        ack_mode=value.get("ack-mode", "on-confirm"),
        reconnect_delay=value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
        prefetch=int(either("src-prefetch-count", DEFAULT_PREFETCH)),
        delete_after=either("src-delete-after", "never"),
        consumer_args=value.get("src-consumer-args") or {}, consumer_name=value.get("src-consumer-name", ""),
        add_forward_headers=either("dest-add-forward-headers", False),
        add_timestamp_header=either("dest-add-timestamp-header", False),
        publish_properties=either("dest-publish-properties", {}) or {})


def write_value(value: Any) -> str:
    """A JSON value as RabbitMQ's texts print the Erlang term it becomes (~tp): a string as a binary, an object as
    a map."""
    if isinstance(value, str):
        return pretty(value.encode(), 1)
    if isinstance(value, (bool, int, float)):
        return erlang_term(value)
    if isinstance(value, list):
        return "[" + ",".join(write_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{write_value(key)} => {write_value(item)}" for key, item in value.items()) + "}"
    return "null"  # (JSON's null, as RabbitMQ's decoder gives it)
