"""A published message as the broker keeps it: the raw content header and body, properties decoded on demand.

Messages published one after another with the same exchange, routing key and content header (the usual case)
share one Address and one Header object, so each queued message costs little more than its body.

None of the classes here can be part of a reference cycle: each refers only to strings, bytes, numbers, a
PropertyScan (which holds only those) and the classes before it here. Where the broker is compiled, the cyclic garbage
collector never walks their instances (untracked.c): a queue's millions of messages and entries, and those a
dead-lettering of millions makes, cost its collections nothing."""

from __future__ import annotations

from pamqp.commands import Basic

from protocol.codec import decode_properties, encode_header_payload
from protocol.properties import PropertyScan, scan_properties


def carbon_copy_keys(headers: dict, name: str) -> list[str]:
    """The routing keys a CC or BCC header names (RabbitMQ's sender-selected distribution)."""
    value = headers.get(name)
    if not isinstance(value, list):
        return []
    return [key.decode() if isinstance(key, bytes) else str(key) for key in value]


class Address:
    """Where a message was published: exchange and routing key, also pre-encoded for basic.deliver."""

    __slots__ = ("exchange", "routing_key", "exchange_bytes", "routing_key_bytes")

    def __init__(self, exchange: str, routing_key: str):
        self.exchange = exchange
        self.routing_key = routing_key
        self.exchange_bytes = exchange.encode()
        self.routing_key_bytes = routing_key.encode()


class Header:
    """A raw content-header payload, forwarded to consumers as it came, with its properties scanned on demand."""

    __slots__ = ("payload", "_scan")

    def __init__(self, payload: bytes):
        self.payload = payload
        self._scan: PropertyScan | None = None  # delivery_mode/priority/expiration, scanned on first use

    @property
    def scan(self) -> PropertyScan:
        if self._scan is None:
            self._scan = scan_properties(self.payload)
        return self._scan


class Message:
    """One published message; shared (not copied) by every queue it is routed to."""

    __slots__ = ("address", "header", "body", "msg_id", "place")

    def __init__(self, address: Address, header: Header, body: bytes, msg_id: int = 0):
        self.address = address
        self.header = header
        self.body = body
        self.msg_id = msg_id  # broker-wide id, used by durable storage (0 while not stored)
        self.place = -1  # where the store wrote this very message (storage.recovered_messages.place); -1 if it did not

    @property
    def exchange(self) -> str:
        return self.address.exchange

    @property
    def routing_key(self) -> str:
        return self.address.routing_key

    @property
    def header_payload(self) -> bytes:
        return self.header.payload

    @property
    def scan(self) -> PropertyScan:
        return self.header.scan

    @property
    def properties(self) -> Basic.Properties:
        """The decoded properties: a fresh object each call, the caller's to change."""
        return decode_properties(self.header.payload)

    @property
    def persistent(self) -> bool:
        return self.header.scan.delivery_mode == 2

    @property
    def headers(self) -> dict | None:
        return self.properties.headers if self.header.scan.has_headers else None

    def with_properties(self, properties: Basic.Properties) -> "Message":
        """A copy carrying other properties (the content header is encoded anew), as a new message."""
        return Message(self.address, Header(encode_header_payload(len(self.body), properties)), self.body)

    def unstored(self) -> "Message":
        """The same message for a queue that does not keep it on disk (no store id)."""
        return Message(self.address, self.header, self.body)

    def with_headers(self, headers: dict) -> "Message":
        """The same message (same store id) with these headers set in its properties."""
        properties = self.properties
        properties.headers = {**(properties.headers or {}), **headers}
        header = Header(encode_header_payload(len(self.body), properties))
        return Message(self.address, header, self.body, self.msg_id)


class QueueEntry:
    """A message's place in one queue."""

    __slots__ = ("seq", "message", "redelivered", "expires_at", "acquired_count", "delivery_count", "place")

    def __init__(self, seq: int, message: Message | None, redelivered: bool = False, expires_at: int = 0):
        self.seq = seq  # enqueue order within the queue; requeued entries go back to this position
        self.message = message  # None once it expired in the ready list (a tombstone, see features.expiry)
        self.redelivered = redelivered  # set once the entry has been delivered and requeued
        self.expires_at = expires_at  # loop time in ms after which the message expires; 0 = never
        self.acquired_count = 0  # times the entry came back to the queue after a delivery (requeued)
        self.delivery_count = 0  # of those, the returns that failed (features.redelivery): what a delivery limit counts
        self.place = 0  # for an entry with a TTL: in the ready list, out of it, or expired there (features.expiry)


try:
    from broker.model.untracked import untracked
except ImportError:  # (not built here: Warren runs as pure Python, and its collector walks these too)
    pass
else:
    for _cls in (Address, Header, Message, QueueEntry, PropertyScan):
        untracked(_cls)
