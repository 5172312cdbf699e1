"""Render the few Erlang terms that appear in RabbitMQ's reply texts, exactly as Erlang's io_lib does.

RabbitMQ builds texts such as ``FRAME_ERROR - type 1, all octets = <<0,60>>: {invalid_frame_end_marker,0}``
with ``~w`` (flat) and ``~tp`` (pretty, 80-column lines). ``~tp`` prints printable binaries as strings and
breaks long binaries and tagged tuples over several lines; clients see those line breaks, so we reproduce them.
Supported terms: ``int``, :class:`Atom`, ``bytes`` and tuples of atoms and ints (the shapes RabbitMQ uses here).

Reply texts about arguments and headers (406 PRECONDITION_FAILED and the like) print decoded field-table values
instead: amqp_type_name() and erlang_term() below.
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import re

LINE_LENGTH = 80  # io_lib's default line length for ~p

# Control characters io_lib counts as printable, with the escape it writes for each.
_ESCAPES = {8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 27: "\\e", 34: '\\"', 92: "\\\\"}


class Atom(str):
    """An Erlang atom; written bare (all atoms used here are plain lower-case words)."""


def write(term: object) -> str:
    """``~w``: the flat form; binaries always as byte lists."""
    if isinstance(term, bytes):
        return "<<" + ",".join(map(str, term)) + ">>"
    if isinstance(term, tuple):
        return "{" + ",".join(map(write, term)) + "}"
    return str(term)


def pretty(term: object, column: int) -> str:
    """``~tp`` of ``term`` starting at 1-based ``column`` of the current line."""
    if isinstance(term, bytes):
        return _pretty_binary(term, column)
    if isinstance(term, tuple):
        return _pretty_tuple(term, column)
    return write(term)


def column_after(text: str) -> int:
    """The 1-based column where output continues after ``text``."""
    return len(text) - text.rfind("\n")


def to_text(chars: str) -> str:
    """Turn an Erlang char list (one char per byte, as built here) into the text a client decodes from the wire.

    RabbitMQ sends the chars as raw bytes; bytes that are not valid UTF-8 reach a client as U+FFFD."""
    return chars.encode("latin-1").decode("utf-8", "replace")


def _is_printable(data: bytes) -> bool:
    """Whether io_lib (as run by the reference RabbitMQ) prints ``data`` as a string: every byte latin-1 printable."""
    return all(32 <= byte <= 126 or byte >= 160 or byte in _ESCAPES for byte in data)


def _quote(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(ord(c), c) for c in text) + '"'


def _pretty_binary(data: bytes, column: int) -> str:
    if not data:
        return "<<>>"
    if _is_printable(data):
        return "<<" + _quote(data.decode("latin-1")) + ">>"
    flat = write(data)
    if len(flat) < LINE_LENGTH - column:
        return flat
    # io_lib_pretty:pp_binary: fill lines of `width` chars, continuation lines indented past the "<<".
    indent = "\n" + " " * (column + 1)
    width = max(8, min(LINE_LENGTH - (column + 2), len(flat) - 4))
    room, parts = width, ["<<"]
    for byte in data[:-1]:
        item = f"{byte},"
        if room - len(item) < 0:
            parts.append(indent)
            room = width
        parts.append(item)
        room -= len(item)
    last = str(data[-1])
    if len(last) > room:
        parts.append(indent)
    parts.append(last + ">>")
    return "".join(parts)


def _pretty_tuple(term: tuple, column: int) -> str:
    """A tuple of atoms and ints, tagged when its first element is an atom (io_lib_pretty's pp_tag_tuple)."""
    elements = [write(e) for e in term]
    flat = "{" + ",".join(elements) + "}"
    total = len(flat)
    if total < LINE_LENGTH - column:
        return flat
    if not (isinstance(term[0], Atom) and len(term) > 1):
        return "{" + _pp_list(elements, column + 1, " " * column, total, 1) + "}"
    tag, rest = elements[0], elements[1:]
    tag_indent = len(tag) + 2
    tag_column = column + tag_indent
    tuple_indent = _tag_indent(column, tag_indent, total)
    if tuple_indent > 0 and tag_indent > tuple_indent:
        indent = " " * (column - 1 + tuple_indent)
        tail = _pp_tail(rest, column + tuple_indent, tag_column, indent, total, 1 + len(tag), 0)
        return "{" + tag + tail + "}"
    indent = " " * (column - 1 + tag_indent)
    return "{" + tag + "," + _pp_list(rest, tag_column, indent, total, 2 + len(tag)) + "}"


def _tag_indent(column: int, tag_indent: int, total: int) -> int:
    """io_lib_pretty's choice of indentation for a tagged tuple of leaves: -1, else 4, else 1."""
    tag_column = column + tag_indent
    if total + tag_column < LINE_LENGTH or tag_column < LINE_LENGTH // 2:
        return -1
    if tag_indent > 4 and (total + column + 4 <= LINE_LENGTH or column + 4 <= LINE_LENGTH // 2):
        return 4
    return 1


def _pp_list(elements: list[str], column: int, indent: str, total: int, width: int) -> str:
    first, rest = elements[0], elements[1:]
    depth = 0 if rest else 1  # closing brackets that follow the element
    fits = len(first) < LINE_LENGTH - column - depth and len(first) + width + depth <= total
    used = len(first) if fits else LINE_LENGTH  # a leaf that does not fit forces the next one onto a new line
    return first + _pp_tail(rest, column, column + used, indent, total, width + used, 0)


def _pp_tail(elements: list[str], start: int, column: int, indent: str, total: int, width: int, depth: int) -> str:
    out = []
    for position, element in enumerate(elements):
        after = 0 if position < len(elements) - 1 else depth + 1
        length = 1 + len(element)
        if after == 0:
            fits = length + 1 < LINE_LENGTH - column and width + length + 1 <= total
        else:
            fits = length < LINE_LENGTH - column - after and width + length + after <= total
        if fits:
            out.append("," + element)
            column += length
            width += length
        else:
            out.append(",\n" + indent + element)
            used = len(element) if len(element) < LINE_LENGTH - start - after else LINE_LENGTH
            column = start + used
            width = used
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Field-table values, as RabbitMQ holds and prints them in reply texts (argument checks, headers matching)
#
# pamqp decodes field-table values into plain Python values and forgets their AMQP type, yet RabbitMQ names the
# type in several texts. amqp_type_name() infers it the way pika and the Java client encode values:
#
#     bool -> bool            int -> signedint (32-bit range) or long       float -> double
#     decimal.Decimal -> decimal      str -> longstr      bytes -> longstr (a long string that is not UTF-8)
#     bytearray -> binary     datetime -> timestamp       dict -> table     list -> array     None -> void
#
# A pamqp-based client (aio-pika) sends the narrowest integer type instead (5 is a 'byte'), so RabbitMQ would name
# that type where Warren says 'signedint'.

_INT32 = range(-(2**31), 2**31)


def amqp_type_name(value) -> str:
    """RabbitMQ's name for the field-table type a client most likely used for value (see above)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if value in _INT32 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, bytearray):
        return "binary"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    raise TypeError(f"not a field-table value: {value!r}")


def as_bytes(value: str | bytes | bytearray) -> bytes:
    """The bytes of a string value as the wire carried them."""
    return value.encode() if isinstance(value, str) else bytes(value)


def from_bytes(raw: bytes) -> str:
    """Erlang formats binaries byte by byte and sends the bytes on: decoding them as UTF-8 gives the same text."""
    return raw.decode("utf-8", errors="replace")


def _chars(raw: bytes, open_quote: str, close_quote: str, as_integers) -> str:
    if not _is_printable(raw):
        return as_integers(",".join(str(b) for b in raw))
    escaped = bytearray()
    for b in raw:
        escaped += _ESCAPES[b].encode() if b in _ESCAPES else bytes((b,))
    return open_quote + from_bytes(bytes(escaped)) + close_quote


def erlang_string(text: str) -> str:
    """~p of an Erlang string (a character list), as RabbitMQ prints error reasons built with format/2."""
    return _chars(text.encode(), '"', '"', lambda ints: f"[{ints}]")


def _binary(raw: bytes) -> str:
    return _chars(raw, '<<"', '">>', lambda ints: f"<<{ints}>>")


def erlang_atom(name: str) -> str:
    """~p of an atom: bare when it is a plain lower-case word, otherwise single-quoted."""
    if re.fullmatch(r"[a-z][A-Za-z0-9_@]*", name):
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _float(value: float) -> str:
    """~p of a float: shortest round-trip digits, placed as io_lib_format:fwrite_g places them (integral floats
    from 2**53 up always take the exponent form)."""
    if value == 0.0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign = "-" if value < 0 else ""
    exact = decimal.Decimal(repr(abs(value))).normalize()
    digits = "".join(map(str, exact.as_tuple().digits))
    length = len(digits)
    place = length + exact.as_tuple().exponent  # value == 0.<digits> * 10**place
    if 0 < place < length:
        return sign + digits[:place] + "." + digits[place:]
    if place == 0:
        return sign + "0." + digits
    exponent = str(place - 1)
    exponent_cost = len(exponent) + 1 + (2 if length == 1 else 1)
    if place < 0 and 2 - place <= exponent_cost:
        return sign + "0." + "0" * -place + digits
    if place >= length and place - length + 2 <= exponent_cost and abs(value) < 2.0**53:
        return sign + digits + "0" * (place - length) + ".0"
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return sign + mantissa + "e" + exponent


def _decimal_parts(value: decimal.Decimal) -> tuple[int, int]:
    """RabbitMQ's decimal {Scale, Unscaled} as the wire carried it (pamqp keeps the scale in the exponent)."""
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    return (-exponent, unscaled) if exponent <= 0 else (0, unscaled * 10**exponent)


def erlang_term(value) -> str:
    """~p of the Erlang term RabbitMQ holds for a decoded field-table value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, decimal.Decimal):
        scale, unscaled = _decimal_parts(value)
        return f"{{{scale},{unscaled}}}"
    if isinstance(value, (str, bytes, bytearray)):
        return _binary(as_bytes(value))
    if isinstance(value, datetime.datetime):
        return str(calendar.timegm(value.utctimetuple()))
    if isinstance(value, dict):
        fields = (f"{{{_binary(as_bytes(k))},{amqp_type_name(v)},{erlang_term(v)}}}" for k, v in value.items())
        return "[" + ",".join(fields) + "]"
    if isinstance(value, list):
        return "[" + ",".join(f"{{{amqp_type_name(v)},{erlang_term(v)}}}" for v in value) + "]"
    if value is None:
        return "undefined"
    raise TypeError(f"not a field-table value: {value!r}")
