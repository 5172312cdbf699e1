"""A dynamic shovel's definition: the value of its runtime parameter (component "shovel"), checked with RabbitMQ's
keys, defaults and texts (rabbit_shovel_parameters, rabbit_amqp091_shovel), and what the shovel makes of it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from broker.links import validation
from broker.links.uri import Address, parse, without_credentials
from broker.links.validation import DefinitionError, write_value

ACK_MODES = ("no-ack", "on-publish", "on-confirm")
PROTOCOLS = ("amqp091", "amqp10", "local")
DEFAULT_RECONNECT_DELAY = 5  # seconds (rabbit_shovel.hrl)
DEFAULT_PREFETCH = 1000
STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
                     "type", "user_id", "app_id", "cluster_id")
NUMBER_PROPERTIES = ("delivery_mode", "priority", "timestamp")
MANDATORY = ("src-uri", "dest-uri")


def _protocol(key: str, item: Any) -> str | None:
    if reason := validation.one_of(*PROTOCOLS)(key, item):
        return reason
    return None if item == "amqp091" else f"{key}: Warren's shovels speak amqp091 only, not {item}"


def _delete_after(key: str, item: Any) -> str | None:
    if item in ("never", "queue-length") or (isinstance(item, int) and not isinstance(item, bool) and item >= 0):
        return None
    return (f'{key} should be a number greater than or equal to 0, "never" or "queue-length", actually was '
            f"{write_value(item)}")


def _properties(key: str, item: Any) -> str | None:
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


_binary, _number, _boolean, _table = validation.binary, validation.number, validation.boolean, validation.table
# key -> its check, in RabbitMQ's order
KEYS: dict[str, validation.Check] = {
    "ack-mode": validation.one_of(*ACK_MODES), "reconnect-delay": _number, "src-protocol": _protocol,
    "dest-protocol": _protocol, "src-uri": validation.uris, "src-exchange": _binary, "src-exchange-key": _binary,
    "src-queue": _binary, "src-queue-args": _table, "src-consumer-args": _table, "src-consumer-name": _binary,
    "prefetch-count": validation.prefetch, "src-prefetch-count": validation.prefetch, "delete-after": _delete_after,
    "src-delete-after": _delete_after, "src-predeclared": _boolean,
    "dest-uri": validation.uris, "dest-exchange": _binary, "dest-exchange-key": _binary,
    "dest-queue": validation.short_binary, "dest-queue-args": _table, "add-forward-headers": _boolean,
    "add-timestamp-header": _boolean, "dest-add-forward-headers": _boolean, "dest-add-timestamp-header": _boolean,
    "publish-properties": _properties, "dest-publish-properties": _properties, "dest-predeclared": _boolean,
}


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
    """The shovel a parameter value defines; DefinitionError with every reason it does not."""
    if not isinstance(value, dict):
        raise DefinitionError([f"{name} should be a JSON object, actually was {write_value(value)}"])
    reasons = _across_keys(value) + validation.proplist(name, value, KEYS, MANDATORY)
    if reasons:
        raise DefinitionError(reasons)
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
