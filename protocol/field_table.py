"""AMQP field tables and field arrays decoded in one pass over the bytes, with a bounded nesting depth.

pamqp's decoder hands every value the rest of the buffer (``value[offset:]``), a copy, so a table of many small
values costs time quadratic in its size (0.3-0.5 s for one 131 KB frame of empty values), and it recurses
without a limit (a few KB of nested tables raise RecursionError). This decoder reads every value in place from
an offset, so its cost is linear in the bytes, and refuses tables nested deeper than MAX_DEPTH.

For every input pamqp decodes without error the result is the same, value for value and type for type (pamqp's
types: 'l' and 'L' signed, 'I' signed and 'i' unsigned 32-bit, 'x' a bytearray, 'S' a str, or bytes when it is
not UTF-8, 'T' a UTC datetime, 'D' a Decimal, 'V' and NUL None); every input pamqp refuses raises ValueError.
It is stricter than pamqp where pamqp reads past the end of a table or an array (a value that overruns its
container, a key without a value): those raise ValueError too, as RabbitMQ's rabbit_binary_parser fails them.
"""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

# RabbitMQ's rabbit_binary_parser has no depth limit (its parse_table recurses on Erlang's growable stack): a
# queue.declare whose arguments nest 10,000 tables or 20,000 arrays deep (one 131 KB frame) is declared. Before
# tune-ok it takes frames of 4,096 bytes only, which bounds a start-ok's client_properties to ~680 levels.
# Python's stack is not growable, and every later walk of a decoded value (pamqp's encoder when headers are
# re-encoded, argument checks, definitions) recurses too, so Warren refuses deeper tables with the protocol
# error of a malformed table. Real clients nest a handful of levels (x-death: headers -> array -> table ->
# array); 100 is far above that and keeps any walk of the value well inside Python's recursion limit.
MAX_DEPTH = 100

_SIZE = struct.Struct(">I")
_DECIMAL = struct.Struct(">Bi")  # scale (digits after the point), then a signed 32-bit value, as pamqp reads it
_TIMESTAMP = struct.Struct(">Q")
_MILLISECONDS_ABOVE = 0xFFFFFFFF  # pamqp reads timestamps above this (past 2106) as milliseconds

_VOID = ord("V")
_NUL = 0  # not in the spec; pamqp reads it as void, as some clients send it


def field_table(value: bytes) -> tuple[int, dict]:
    """Drop-in for pamqp.decode.field_table: (bytes consumed, table) of the table that starts value.

    Raises ValueError when the table is malformed or nested deeper than MAX_DEPTH."""
    table, end = decode_table(bytes(value), 0)
    return end, table


def decode_table(data: bytes, offset: int) -> tuple[dict, int]:
    """The table whose 4-byte size is at data[offset], and the offset just after it. Raises ValueError."""
    start, end = _sized(data, offset, len(data))
    return _table(data, start, end, 1), end


def decode_timestamp(data: bytes, offset: int) -> datetime.datetime:
    """A 64-bit timestamp at data[offset] as pamqp decodes it (a UTC datetime). Raises ValueError."""
    seconds = _TIMESTAMP.unpack_from(data, offset)[0]
    try:
        if seconds > _MILLISECONDS_ABOVE:
            return datetime.datetime.fromtimestamp(seconds / 1000.0, tz=datetime.UTC)
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"timestamp out of range: {seconds}") from None


def decode_long_string(data: bytes, start: int, end: int) -> str | bytes:
    """A long string's bytes: text when they are UTF-8, else the bytes themselves (as pamqp)."""
    raw = data[start:end]
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def _table(data: bytes, offset: int, end: int, depth: int) -> dict:
    """The entries of a table that occupies data[offset:end]."""
    if depth > MAX_DEPTH:
        raise ValueError(f"field tables nested deeper than {MAX_DEPTH}")
    table = {}
    decoders = _DECODERS
    while offset < end:
        key_size = data[offset]
        key_end = offset + 1 + key_size
        if key_end >= end:
            raise ValueError("field table entry exceeds its table")
        key = data[offset + 1 : key_end].decode() if key_size else ""  # decoding b"" costs more than this test
        kind = data[key_end]
        if kind == _VOID or kind == _NUL:  # the cheapest value there is: keep it off the general path
            table[key] = None
            offset = key_end + 1
        else:
            table[key], offset = decoders[kind](data, key_end + 1, end, depth)
    return table


def _array(data: bytes, offset: int, end: int, depth: int) -> list:
    """The values of an array that occupies data[offset:end]."""
    if depth > MAX_DEPTH:
        raise ValueError(f"field tables nested deeper than {MAX_DEPTH}")
    values = []
    append = values.append
    decoders = _DECODERS
    while offset < end:
        kind = data[offset]
        if kind == _VOID or kind == _NUL:
            append(None)
            offset += 1
        else:
            value, offset = decoders[kind](data, offset + 1, end, depth)
            append(value)
    return values


# One decoder per type octet (except the voids, which the loops above take): each takes (data, offset of the
# value, end of its container, depth of its container) and returns (value, offset after it).


def _sized(data: bytes, offset: int, end: int) -> tuple[int, int]:
    """(start, end) of the bytes of a value with a 4-byte size at data[offset]; they must end by end."""
    start = offset + 4
    if start > end:
        raise ValueError("field size cut short")
    stop = start + _SIZE.unpack_from(data, offset)[0]
    if stop > end:
        raise ValueError("field value exceeds its container")
    return start, stop


def _long_string(data: bytes, offset: int, end: int, depth: int) -> tuple[str | bytes, int]:
    start, stop = _sized(data, offset, end)
    return decode_long_string(data, start, stop), stop


def _nested_table(data: bytes, offset: int, end: int, depth: int) -> tuple[dict, int]:
    start, stop = _sized(data, offset, end)
    return _table(data, start, stop, depth + 1), stop


def _nested_array(data: bytes, offset: int, end: int, depth: int) -> tuple[list, int]:
    start, stop = _sized(data, offset, end)
    return _array(data, start, stop, depth + 1), stop


def _byte_array(data: bytes, offset: int, end: int, depth: int) -> tuple[bytearray, int]:
    start, stop = _sized(data, offset, end)
    return bytearray(data[start:stop]), stop


def _boolean(data: bytes, offset: int, end: int, depth: int) -> tuple[bool, int]:
    if offset >= end:
        raise ValueError("field value exceeds its container")
    return data[offset] != 0, offset + 1


def _decimal(data: bytes, offset: int, end: int, depth: int) -> tuple[Decimal, int]:
    stop = offset + _DECIMAL.size
    if stop > end:
        raise ValueError("field value exceeds its container")
    scale, digits = _DECIMAL.unpack_from(data, offset)
    return Decimal(digits) * (Decimal(10) ** -scale), stop


def _timestamp(data: bytes, offset: int, end: int, depth: int) -> tuple[datetime.datetime, int]:
    stop = offset + _TIMESTAMP.size
    if stop > end:
        raise ValueError("field value exceeds its container")
    return decode_timestamp(data, offset), stop


def _fixed(fmt: str):
    """The decoder of a fixed-size number."""
    unpack_from = struct.Struct(fmt).unpack_from
    size = struct.calcsize(fmt)

    def decode(data: bytes, offset: int, end: int, depth: int) -> tuple[int | float, int]:
        stop = offset + size
        if stop > end:
            raise ValueError("field value exceeds its container")
        return unpack_from(data, offset)[0], stop

    return decode


def _unknown(data: bytes, offset: int, end: int, depth: int) -> tuple[None, int]:
    raise ValueError(f"unknown field type {data[offset - 1 : offset]!r}")


_DECODERS = [_unknown] * 256
for _kind, _decoder in (
    ("S", _long_string), ("F", _nested_table), ("A", _nested_array), ("x", _byte_array), ("t", _boolean),
    ("D", _decimal), ("T", _timestamp), ("b", _fixed(">b")), ("B", _fixed(">B")), ("s", _fixed(">h")),
    ("u", _fixed(">H")), ("I", _fixed(">l")), ("i", _fixed(">L")), ("l", _fixed(">q")), ("L", _fixed(">q")),
    ("f", _fixed(">f")), ("d", _fixed(">d")),
):
    _DECODERS[ord(_kind)] = _decoder
