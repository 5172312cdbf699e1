"""protocol.field_table: the same values as pamqp's decoder for what pamqp reads, ValueError (never anything else)
for what it cannot read, and a nesting limit instead of a RecursionError."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, decode, encode

from protocol.codec import decode_method
from protocol.field_table import MAX_DEPTH, decode_table, field_table


def pamqp_or_error(data: bytes):
    """pamqp's decode of a table, or the exception type it raised."""
    try:
        return decode.field_table(data)
    except Exception as error:  # pamqp raises ValueError, UnicodeDecodeError or worse (OverflowError)
        return type(error)


def ours_or_error(data: bytes):
    try:
        return field_table(data)
    except ValueError:
        return ValueError


def nested(depth: int, container: bytes = b"F") -> bytes:
    """A table holding a table (or array) holding ... depth containers in all, the outer table included."""
    inner = b""
    for _ in range(depth - 1):
        if container == b"F":
            inner = b"\x01kF" + struct.pack(">I", len(inner)) + inner
        else:
            inner = b"A" + struct.pack(">I", len(inner)) + inner
    body = inner if container == b"F" else b"\x01k" + inner
    return struct.pack(">I", len(body)) + body


# Values pamqp's encoder writes into tables (integers pick their smallest type, as pamqp's table_integer does).
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, width=32),
    st.text(max_size=20), st.binary(max_size=10).map(bytearray),
    st.decimals(min_value=-21_474_836, max_value=21_474_836, places=2, allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2100, 1, 1)).map(
        lambda moment: moment.replace(microsecond=0, tzinfo=datetime.UTC)),
)
keys = st.text(max_size=10).filter(lambda key: len(key.encode()) <= 128)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(keys, inner, max_size=4)), max_leaves=30)
tables = st.dictionaries(keys, values, max_size=8)


@settings(max_examples=150, deadline=None)
@given(table=tables)
def test_same_result_as_pamqp_for_what_pamqp_encodes(table):
    data = encode.field_table(table)
    # repr tells 1 from True from 1.0 and str from bytes, which == does not
    assert repr(field_table(data)) == repr(decode.field_table(data))


# Wire values of every type octet, including those pamqp's encoder never writes ('L', 'B', 'u', 'i', 'V', NUL).
def sized(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


wire_scalars = st.one_of(
    st.sampled_from([b"V", b"\x00", b"t\x00", b"t\x07"]),
    st.tuples(st.sampled_from(b"bBsuIilLfdDT"), st.binary(min_size=9, max_size=9)).map(
        lambda kv: bytes((kv[0],)) + kv[1][: {ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
                                              ord("i"): 4, ord("f"): 4, ord("D"): 5}.get(kv[0], 8)]),
    st.binary(max_size=6).map(lambda raw: sized(b"S", raw)),
    st.binary(max_size=6).map(lambda raw: sized(b"x", raw)),
)
wire_keys = st.binary(max_size=4).map(lambda raw: bytes((len(raw),)) + raw)


def wire_table(entries: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(key + value for key, value in entries)


wire_values = st.recursive(
    wire_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4).map(lambda items: sized(b"A", b"".join(items))),
                            st.lists(st.tuples(wire_keys, inner), max_size=4).map(
                                lambda entries: sized(b"F", wire_table(entries)))),
    max_leaves=20,
)
wire_tables = st.lists(st.tuples(wire_keys, wire_values), max_size=6).map(
    lambda entries: struct.pack(">I", len(wire_table(entries))) + wire_table(entries))


@settings(max_examples=250, deadline=None)
@given(data=wire_tables)
def test_every_type_octet_as_pamqp_reads_it(data):
    # Keys that are not UTF-8 and timestamps past datetime's range make pamqp raise: we raise ValueError then.
    expected = pamqp_or_error(data)
    got = ours_or_error(data)
    if isinstance(expected, type):
        assert got is ValueError
    else:
        assert repr(got) == repr(expected)


@settings(max_examples=200, deadline=None)
@given(data=wire_tables, cut=st.integers(0, 200), flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)),
                                                                  max_size=3), tail=st.binary(max_size=6))
def test_damaged_tables_raise_value_error_or_decode_as_pamqp(data, cut, flips, tail):
    damaged = bytearray(data)
    for position, byte in flips:
        if damaged:
            damaged[position % len(damaged)] = byte
    damaged = bytes(damaged[: len(damaged) - cut % (len(damaged) + 1)]) + tail
    got = ours_or_error(damaged)  # anything but ValueError fails the test here
    expected = pamqp_or_error(damaged)
    if isinstance(expected, type):
        assert got is ValueError  # pamqp refuses it: so do we
    elif got is not ValueError:  # we refuse more (values that overrun their container), never decode differently
        assert repr(got) == repr(expected)


def test_stricter_than_pamqp_where_pamqp_reads_past_the_table():
    overrun = b"\x00\x00\x00\x03\x01kS" + b"\x00\x00\x00\x01x"  # the string's bytes lie after the table's end
    dangling = b"\x00\x00\x00\x02\x01k"  # a key without a value
    for data in (overrun, dangling):
        decode.field_table(data)  # pamqp does not notice
        with pytest.raises(ValueError):
            field_table(data)


@pytest.mark.parametrize("container", [b"F", b"A"])
def test_nesting_up_to_the_limit_decodes(container):
    _, table = field_table(nested(MAX_DEPTH, container))
    depth = 2  # the outer table and the value under "k"
    value = table["k"]
    while value:
        value = value["k"] if container == b"F" else value[0]
        depth += 1
    assert depth == MAX_DEPTH


@pytest.mark.parametrize("container", [b"F", b"A"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 21_000])  # 21,000 tables fill a 131 KB frame
def test_deeper_nesting_is_a_value_error_not_a_recursion_error(container, depth):
    with pytest.raises(ValueError, match="nested deeper than"):
        field_table(nested(depth, container))


def test_decode_table_reads_from_an_offset_and_returns_the_offset_after():
    data = b"junk" + encode.field_table({"a": 1}) + b"rest"
    table, end = decode_table(data, 4)
    assert table == {"a": 1} and data[end:] == b"rest"


def test_pamqp_types_are_kept():
    data = (b"\x00\x00\x00\x00" + b"\x01aL" + struct.pack(">q", -5) + b"\x01bi" + struct.pack(">L", 2**32 - 1)
            + b"\x01cD\x02" + struct.pack(">i", -12345) + b"\x01dx\x00\x00\x00\x02\x00\xff"
            + b"\x01eS\x00\x00\x00\x01\xff" + b"\x01fT" + struct.pack(">Q", 1_700_000_000_000) + b"\x01g\x00")
    data = struct.pack(">I", len(data) - 4) + data[4:]
    _, table = field_table(data)
    assert repr(table) == repr(decode.field_table(data)[1])
    assert table == {"a": -5, "b": 2**32 - 1, "c": Decimal("-123.45"), "d": bytearray(b"\x00\xff"), "e": b"\xff",
                     "f": datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.UTC), "g": None}


def test_timestamp_past_datetimes_range_is_a_value_error():
    data = b"\x01tT" + b"\xff" * 8  # pamqp lets OverflowError or ValueError escape here
    with pytest.raises(ValueError):
        field_table(struct.pack(">I", len(data)) + data)


# Methods decoded field by field from offsets agree with pamqp's unmarshal, tables included.
@settings(max_examples=100, deadline=None)
@given(arguments=tables, queue=st.from_regex(r"[a-zA-Z0-9._:-]{0,20}", fullmatch=True), durable=st.booleans(), nowait=st.booleans())
def test_queue_declare_decodes_as_pamqp(arguments, queue, durable, nowait):
    method = commands.Queue.Declare(queue=queue, durable=durable, nowait=nowait, arguments=arguments)
    payload = struct.pack(">I", method.index) + method.marshal()
    expected = commands.Queue.Declare()
    expected.unmarshal(payload[4:])
    assert repr(dict(decode_method(payload))) == repr(dict(expected))
