"""Render the few Erlang terms that appear in RabbitMQ's reply texts, exactly as Erlang's io_lib does.

RabbitMQ builds texts such as ``FRAME_ERROR - type 1, all octets = <<0,60>>: {invalid_frame_end_marker,0}``
with ``~w`` (flat) and ``~tp`` (pretty, 80-column lines). ``~tp`` prints printable binaries as strings and
breaks long binaries and tagged tuples over several lines; clients see those line breaks, so we reproduce them.
Supported terms: ``int``, :class:`Atom`, ``bytes`` and tuples of atoms and ints (the shapes RabbitMQ uses here).
"""

from __future__ import annotations

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
