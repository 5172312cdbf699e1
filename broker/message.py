"""A published message as the broker keeps it: the raw content header and body, properties decoded on demand."""

from __future__ import annotations

from pamqp.commands import Basic

from protocol.codec import decode_properties, encode_header_payload
from protocol.properties import PropertyScan, scan_properties


class Message:
    """One published message; shared (not copied) by every queue it is routed to."""

    __slots__ = ("exchange", "routing_key", "exchange_bytes", "routing_key_bytes", "header_payload", "body",
                 "msg_id", "_scan", "_properties")

    def __init__(self, exchange: str, routing_key: str, header_payload: bytes, body: bytes, msg_id: int = 0):
        self.exchange = exchange
        self.routing_key = routing_key
        self.exchange_bytes = exchange.encode()  # pre-encoded for basic.deliver
        self.routing_key_bytes = routing_key.encode()
        self.header_payload = header_payload  # raw content-header payload, forwarded to consumers as it came
        self.body = body
        self.msg_id = msg_id  # broker-wide id, used by durable storage (0 while not stored)
        self._scan: PropertyScan | None = None  # delivery_mode/priority/expiration, scanned on first use
        self._properties: Basic.Properties | None = None  # fully decoded properties, on first use

    @property
    def scan(self) -> PropertyScan:
        if self._scan is None:
            self._scan = scan_properties(self.header_payload)
        return self._scan

    @property
    def properties(self) -> Basic.Properties:
        if self._properties is None:
            self._properties = decode_properties(self.header_payload)
        return self._properties

    @property
    def persistent(self) -> bool:
        return self.scan.delivery_mode == 2

    @property
    def headers(self) -> dict | None:
        return self.properties.headers if self.scan.has_headers else None

    def with_properties(self, properties: Basic.Properties) -> "Message":
        """A copy carrying other properties (the content header is encoded anew)."""
        header = encode_header_payload(len(self.body), properties)
        return Message(self.exchange, self.routing_key, header, self.body)


class QueueEntry:
    """A message's place in one queue."""

    __slots__ = ("seq", "message", "redelivered")

    def __init__(self, seq: int, message: Message, redelivered: bool = False):
        self.seq = seq  # enqueue order within the queue; requeued entries go back to this position
        self.message = message
        self.redelivered = redelivered  # set once the entry has been delivered and requeued
