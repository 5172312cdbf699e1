"""Read the few message properties the broker routes on straight from a raw content-header payload.

The payload is kept as received and forwarded to consumers unchanged; this walk validates it the way
RabbitMQ's generated decoder does (one flag word, every field complete, no trailing bytes) and picks out
delivery_mode, priority and expiration without building pamqp objects.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.constants import INTERNAL_ERROR
from protocol.errors import AMQPError

# Property flag bits of the basic class, in wire order (AMQP 0-9-1).
CONTENT_TYPE: Final = 1 << 15
CONTENT_ENCODING: Final = 1 << 14
HEADERS: Final = 1 << 13
DELIVERY_MODE: Final = 1 << 12
PRIORITY: Final = 1 << 11
CORRELATION_ID: Final = 1 << 10
REPLY_TO: Final = 1 << 9
EXPIRATION: Final = 1 << 8
MESSAGE_ID: Final = 1 << 7
TIMESTAMP: Final = 1 << 6
TYPE: Final = 1 << 5
USER_ID: Final = 1 << 4
APP_ID: Final = 1 << 3
CLUSTER_ID: Final = 1 << 2
# The two low bits (continuation, reserved) are ignored, as RabbitMQ's decoder does for the basic class.
PROPERTY_FLAGS_MASK: Final = 0xFFFC

PROPERTIES_OFFSET: Final = 12  # class_id (2) + weight (2) + body_size (8) precede the property flags
_FLAGS: Final = struct.Struct(">H")
_TABLE_SIZE: Final = struct.Struct(">I")
_TIMESTAMP_SIZE: Final = 8


class PropertyScan:
    """The properties the broker routes on, as scanned. (A class of its own, not a NamedTuple: CPython's collector
    can be kept from walking its instances, broker/model/message.py, where a NamedTuple's are always tracked.)"""

    __slots__ = ("delivery_mode", "priority", "expiration", "has_headers")

    def __init__(self, delivery_mode: int | None, priority: int | None, expiration: str | None,
                 has_headers: bool) -> None:
        self.delivery_mode = delivery_mode
        self.priority = priority
        self.expiration = expiration  # as sent, not yet checked (the broker refuses one that is not a number)
        self.has_headers = has_headers  # whether the properties hold a headers table (decoded on demand)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PropertyScan) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return "PropertyScan(%r, %r, %r, %r)" % self._fields()

    def _fields(self) -> tuple[int | None, int | None, str | None, bool]:
        return self.delivery_mode, self.priority, self.expiration, self.has_headers


def malformed_properties_error() -> AMQPError:
    """What RabbitMQ answers to a content header whose properties do not parse: its channel crashes."""
    return AMQPError(INTERNAL_ERROR, None, 0, 0)


def property_flags(header_payload: bytes) -> int:
    """The property flag word of a content-header payload, reserved bits cleared."""
    try:
        return _FLAGS.unpack_from(header_payload, PROPERTIES_OFFSET)[0] & PROPERTY_FLAGS_MASK
    except struct.error:
        raise malformed_properties_error() from None


def scan_properties(header_payload: bytes) -> PropertyScan:
    """Walk the property flags and skip over fields without building pamqp objects.

    Raises AMQPError (541 INTERNAL_ERROR, as RabbitMQ) when the properties are truncated or followed by
    extra bytes. Field tables are skipped whole; their entries are checked when decode_properties parses them."""
    flags = property_flags(header_payload)
    delivery_mode = priority = expiration = None
    offset = PROPERTIES_OFFSET + 2
    try:
        if flags & CONTENT_TYPE:
            offset += 1 + header_payload[offset]
        if flags & CONTENT_ENCODING:
            offset += 1 + header_payload[offset]
        if flags & HEADERS:
            offset += 4 + _TABLE_SIZE.unpack_from(header_payload, offset)[0]
        if flags & DELIVERY_MODE:
            delivery_mode = header_payload[offset]
            offset += 1
        if flags & PRIORITY:
            priority = header_payload[offset]
            offset += 1
        if flags & CORRELATION_ID:
            offset += 1 + header_payload[offset]
        if flags & REPLY_TO:
            offset += 1 + header_payload[offset]
        if flags & EXPIRATION:
            end = offset + 1 + header_payload[offset]
            # RabbitMQ takes any bytes here and then fails them as "invalid expiration '...': no_integer";
            # bytes that are not UTF-8 become U+FFFD, as a client reading that reply text would see them.
            expiration = header_payload[offset + 1 : end].decode(errors="replace")
            offset = end
        if flags & (MESSAGE_ID | TIMESTAMP | TYPE | USER_ID | APP_ID | CLUSTER_ID):
            offset = _skip_trailing_properties(header_payload, offset, flags)
    except (IndexError, struct.error):
        raise malformed_properties_error() from None
    if offset != len(header_payload):
        raise malformed_properties_error()
    return PropertyScan(delivery_mode, priority, expiration, bool(flags & HEADERS))


def _skip_trailing_properties(header_payload: bytes, offset: int, flags: int) -> int:
    """Skip message_id .. cluster_id; return the offset after them."""
    if flags & MESSAGE_ID:
        offset += 1 + header_payload[offset]
    if flags & TIMESTAMP:
        offset += _TIMESTAMP_SIZE
    for flag in (TYPE, USER_ID, APP_ID, CLUSTER_ID):
        if flags & flag:
            offset += 1 + header_payload[offset]
    return offset


_LONG_FIELD: Final = struct.Struct(">cq")  # field type 'l' (signed 64-bit, RabbitMQ's long) and its value


def with_long_header(header_payload: bytes, name: bytes, value: int) -> bytes:
    """The content-header payload with one more entry, name = value as a long, at the end of its headers table (a
    table is added if it has none); the rest of the properties are kept byte for byte. The payload must be one
    scan_properties accepted."""
    flags = _FLAGS.unpack_from(header_payload, PROPERTIES_OFFSET)[0]
    offset = PROPERTIES_OFFSET + 2
    if flags & CONTENT_TYPE:
        offset += 1 + header_payload[offset]
    if flags & CONTENT_ENCODING:
        offset += 1 + header_payload[offset]
    entry = bytes((len(name),)) + name + _LONG_FIELD.pack(b"l", value)
    if flags & HEADERS:
        size = _TABLE_SIZE.unpack_from(header_payload, offset)[0]
        end = offset + 4 + size
        return b"".join((header_payload[:offset], _TABLE_SIZE.pack(size + len(entry)),
                         header_payload[offset + 4:end], entry, header_payload[end:]))
    return b"".join((header_payload[:PROPERTIES_OFFSET], _FLAGS.pack(flags | HEADERS),
                     header_payload[PROPERTIES_OFFSET + 2:offset], _TABLE_SIZE.pack(len(entry)), entry,
                     header_payload[offset:]))
