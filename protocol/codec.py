"""The general codec, on pamqp: method frames both ways, content frames out, message properties both ways."""

from __future__ import annotations

import re
import struct

from pamqp import base, commands
from pamqp import constants as pamqp_constants
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
from protocol.errors import AMQPError
from protocol.field_table import decode_long_string, decode_table, decode_timestamp
from protocol.framing import frame_error
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

# RabbitMQ takes any name of up to 255 bytes for a queue or an exchange; pamqp's validators, run when a method is
# made, allow only [a-zA-Z0-9-_.:@#,/+ ], so a reply naming a queue called 'a{b}' (declare-ok, get-ok...) would fail.
# Names reach here only from frames already decoded (shortstrs, so never too long).
pamqp_constants.DOMAIN_REGEX["queue-name"] = pamqp_constants.DOMAIN_REGEX["exchange-name"] = re.compile(".*", re.S)

# Bytes of the fields that "cannot decode" quotes: enough to fill the 255-byte reply text.
_QUOTED_FIELD_BYTES = 128


def decode_method(payload: bytes) -> base.Frame:
    """Decode a method frame payload (it starts with the 4-byte class/method id) into a pamqp method.

    Raises AMQPError as RabbitMQ fails such a frame: 501 "FRAME_ERROR - cannot decode <<...>>" when the
    fields do not parse or leave bytes over, 501 unknown_frame when the id itself is cut short. An unknown
    method id makes RabbitMQ drop the socket without a connection.close: that error has send_close False.
    The fields are read in one pass from offsets (field tables by protocol.field_table, linear and
    depth-limited), giving what pamqp's unmarshal gives.
    """
    if len(payload) < 4:
        raise frame_error(Atom("unknown_frame"), FRAME_METHOD, payload)
    index = _METHOD_ID.unpack_from(payload)[0]
    class_id, method_id = index >> 16, index & 0xFFFF
    method_class = commands.INDEX_MAPPING.get(index)
    if method_class is None:
        text = f"unknown method id {{{class_id},{method_id}}}"
        raise AMQPError(NOT_IMPLEMENTED, text, class_id, method_id, send_close=False)
    method = method_class()
    try:
        if _read_fields(method, _METHOD_FIELDS[index], payload, 4) != len(payload):
            raise ValueError("bytes left over after the fields")
    except (IndexError, ValueError, struct.error):
        text = "cannot decode " + write(payload[4 : 4 + _QUOTED_FIELD_BYTES])
        raise AMQPError(FRAME_ERROR, text, class_id, method_id) from None
    return method


def _read_fields(target: object, fields: tuple[tuple[str, str], ...], data: bytes, offset: int) -> int:
    """Set target's fields (name, AMQP type), read in order from data[offset:]; return the offset after them.

    Raises IndexError, ValueError or struct.error when a field is cut short or does not parse."""
    bit = 0  # position of the next bit field in the current octet; consecutive bits share one octet
    octet = 0
    for name, kind in fields:
        if kind == "bit":
            if bit == 0:
                octet = data[offset]
                offset += 1
            setattr(target, name, bool(octet >> bit & 1))
            bit = (bit + 1) % 8
            continue
        bit = 0
        value, offset = _FIELD_READERS[kind](data, offset)
        setattr(target, name, value)
    return offset


def _read_shortstr(data: bytes, offset: int) -> tuple[str, int]:
    end = offset + 1 + data[offset]
    if end > len(data):
        raise ValueError("short string cut short")
    return data[offset + 1 : end].decode(), end


def _read_longstr(data: bytes, offset: int) -> tuple[str | bytes, int]:
    start = offset + 4
    end = start + _LONG_SIZE.unpack_from(data, offset)[0]
    if end > len(data):
        raise ValueError("long string cut short")
    return decode_long_string(data, start, end), end


def _read_timestamp(data: bytes, offset: int) -> tuple[object, int]:
    end = offset + 8
    if end > len(data):
        raise ValueError("timestamp cut short")
    return decode_timestamp(data, offset), end


def _fixed_reader(layout: struct.Struct):
    unpack_from = layout.unpack_from
    size = layout.size
    return lambda data, offset: (unpack_from(data, offset)[0], offset + size)


# Readers of method and property fields by AMQP type: (data, offset) -> (value, offset after it), as pamqp
# decodes them (its "longlong" is signed).
_FIELD_READERS = {
    "octet": _fixed_reader(struct.Struct(">B")),
    "short": _fixed_reader(struct.Struct(">H")),
    "long": _fixed_reader(struct.Struct(">L")),
    "longlong": _fixed_reader(struct.Struct(">q")),
    "shortstr": _read_shortstr,
    "longstr": _read_longstr,
    "table": decode_table,
    "timestamp": _read_timestamp,
}
# Every method's fields in wire order: method id -> ((name, AMQP type), ...).
_METHOD_FIELDS = {
    index: tuple((name, method_class.amqp_type(name)) for name in method_class.__slots__)
    for index, method_class in commands.INDEX_MAPPING.items()
}
_PROPERTIES = commands.Basic.Properties
# The basic class's properties in wire order: (flag bit, name, AMQP type).
_PROPERTY_FIELDS = tuple((_PROPERTIES.flags[name], name, _PROPERTIES.amqp_type(name)) for name in _PROPERTIES.__slots__)


def encode_method(channel: int, method: base.Frame) -> bytes:
    """One complete method frame."""
    payload = _METHOD_ID.pack(method.index) + _marshal(method)
    return _FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)) + payload + _END


def _marshal(method: base.Frame) -> bytes:
    """The method's fields, as pamqp's Frame.marshal encodes them but unchecked: pamqp holds exchange and queue
    names to AMQP 0-9-1's 127 characters, which RabbitMQ does not (255 bytes, a short string)."""
    output, byte, offset, bits = [], 0, 0, False
    for name, data_type in _METHOD_FIELDS[method.index]:
        value = getattr(method, name, 0)
        if data_type == "bit":
            if not bits:
                byte, offset, bits = 0, 0, True
            byte = pamqp_encode.bit(value, byte, offset)
            offset += 1
            if offset == 8:
                output.append(pamqp_encode.octet(byte))
                bits = False
            continue
        if bits:
            output.append(pamqp_encode.octet(byte))
            bits = False
        output.append(pamqp_encode.by_type(value, data_type))
    if bits:
        output.append(pamqp_encode.octet(byte))
    return b"".join(output)


def make_method(method_class: type[base.Frame], **fields: object) -> base.Frame:
    """A method with these fields, unchecked as _marshal encodes it (pamqp's constructor would refuse a name of
    more than 127 characters)."""
    method = method_class()
    for name, value in fields.items():
        setattr(method, name, value)
    return method


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


def with_body_size(header_payload: bytes, body_size: int) -> bytes:
    """The same content-header payload for a body of another size."""
    return _CONTENT_HEADER_PREFIX.pack(BASIC_CLASS_ID, 0, body_size) + header_payload[_CONTENT_HEADER_PREFIX.size:]


def decode_properties(header_payload: bytes) -> commands.Basic.Properties:
    """The message properties of a raw content-header payload.

    Raises AMQPError 541 INTERNAL_ERROR on malformed properties, as RabbitMQ does."""
    scan_properties(header_payload)
    flags = property_flags(header_payload)
    properties = commands.Basic.Properties()
    offset = PROPERTIES_OFFSET + 2
    try:
        for flag, name, kind in _PROPERTY_FIELDS:
            if flags & flag:
                value, offset = _FIELD_READERS[kind](header_payload, offset)
                setattr(properties, name, value)
    except (IndexError, ValueError, struct.error):
        raise malformed_properties_error() from None
    return properties
