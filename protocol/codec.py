"""The general codec, on pamqp: method frames both ways, content frames out, message properties both ways."""

from __future__ import annotations

import struct

from pamqp import base, commands
from pamqp import encode as pamqp_encode

from protocol.constants import (
    BASIC_CLASS_ID,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    NOT_IMPLEMENTED,
)
from protocol.erlang_terms import Atom, write
from protocol.framing import FrameError, frame_error, reply_text
from protocol.properties import PROPERTIES_OFFSET, malformed_properties_error, property_flags, scan_properties

_FRAME_HEADER = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")  # class_id, weight, body_size
_LONG_SIZE = struct.Struct(">I")
_END = bytes((FRAME_END,))

HEARTBEAT_FRAME = _FRAME_HEADER.pack(FRAME_HEARTBEAT, 0, 0) + _END


class LongLong(int):
    """An integer that field tables carry as a signed 64-bit 'l', whatever its size, as RabbitMQ sends x-death
    counts (clients such as Spring AMQP read them as Long). pamqp otherwise picks the smallest integer type."""


_smallest_table_integer = pamqp_encode.table_integer


def _table_integer(value: int) -> bytes:
    if type(value) is LongLong:
        return b"l" + pamqp_encode.long_long_int(value)
    return _smallest_table_integer(value)


pamqp_encode.table_integer = _table_integer  # pamqp's table encoder looks it up at call time

# Encoded sizes of the fixed-size AMQP field types.
_FIXED_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}
# Bytes of the fields that "cannot decode" quotes: enough to fill the 255-byte reply text.
_QUOTED_FIELD_BYTES = 128


def decode_method(payload: bytes) -> base.Frame:
    """Decode a method frame payload (it starts with the 4-byte class/method id) into a pamqp method.

    Raises FrameError as RabbitMQ fails such a frame: 501 "FRAME_ERROR - cannot decode <<...>>" when the
    fields do not parse or leave bytes over, 501 unknown_frame when the id itself is cut short. An unknown
    method id makes RabbitMQ drop the socket without a connection.close: that error has send_close False.
    """
    if len(payload) < 4:
        raise frame_error(Atom("unknown_frame"), FRAME_METHOD, payload)
    index = _METHOD_ID.unpack_from(payload)[0]
    class_id, method_id = index >> 16, index & 0xFFFF
    method_class = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        text = reply_text(NOT_IMPLEMENTED, f"unknown method id {{{class_id},{method_id}}}")
        raise FrameError(NOT_IMPLEMENTED, text, class_id, method_id, send_close=False)
    fields = payload[4:]
    method = method_class()
    try:
        if _encoded_length(method_class, fields) != len(fields):
            raise ValueError("field lengths do not add up to the payload")
        method.unmarshal(fields)
    except (IndexError, ValueError, struct.error):
        text = reply_text(FRAME_ERROR, "cannot decode " + write(fields[:_QUOTED_FIELD_BYTES]))
        raise FrameError(FRAME_ERROR, text, class_id, method_id) from None
    return method


def _encoded_length(method_class: type[base.Frame], fields: bytes) -> int:
    """How many bytes the method's fields occupy at the start of ``fields`` (RabbitMQ accepts no extra bytes)."""
    offset = 0
    bits = 0  # consecutive bit fields so far; each group of 8 shares one octet
    for name in method_class.__slots__:
        kind = method_class.amqp_type(name)
        if kind == "bit":
            if bits % 8 == 0:
                offset += 1
            bits += 1
            continue
        bits = 0
        if kind == "shortstr":
            offset += 1 + fields[offset]
        elif kind in ("longstr", "table"):
            offset += 4 + _LONG_SIZE.unpack_from(fields, offset)[0]
        else:
            offset += _FIXED_SIZES[kind]
    return offset


def encode_method(channel: int, method: base.Frame) -> bytes:
    """One complete method frame."""
    payload = _METHOD_ID.pack(method.index) + method.marshal()
    return _FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)) + payload + _END


def encode_content(channel: int, header_payload: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header frame (payload given raw) followed by body frames split at frame_max - 8 bytes each
    (no body frame at all when body is empty; frame_max 0 means no limit)."""
    pack = _FRAME_HEADER.pack
    parts = [pack(FRAME_HEADER, channel, len(header_payload)), header_payload, _END]
    size = len(body)
    largest = frame_max - FRAME_OVERHEAD if frame_max else size
    if size <= largest:
        if size:
            parts += (pack(FRAME_BODY, channel, size), body, _END)
    else:
        view = memoryview(body)
        for start in range(0, size, largest):
            piece = view[start : start + largest]
            parts += (pack(FRAME_BODY, channel, len(piece)), piece, _END)
    return b"".join(parts)


def encode_header_payload(body_size: int, properties: commands.Basic.Properties) -> bytes:
    """The raw content-header payload (class_id 60, weight 0, body_size, property flags + properties)."""
    return _CONTENT_HEADER_PREFIX.pack(BASIC_CLASS_ID, 0, body_size) + properties.marshal()


def decode_properties(header_payload: bytes) -> commands.Basic.Properties:
    """The message properties of a raw content-header payload.

    Raises FrameError 541 INTERNAL_ERROR on malformed properties, as RabbitMQ does."""
    scan_properties(header_payload)
    properties = commands.Basic.Properties()
    try:
        properties.unmarshal(property_flags(header_payload), header_payload[PROPERTIES_OFFSET + 2 :])
    except (ValueError, struct.error):
        raise malformed_properties_error() from None
    return properties
