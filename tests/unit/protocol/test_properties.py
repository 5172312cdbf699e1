"""scan_properties against pamqp's full decode of the same content header."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, header

from protocol.codec import encode_header_payload
from protocol.constants import INTERNAL_ERROR
from protocol.errors import AMQPError
from protocol.properties import PropertyScan, scan_properties

short_text = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
optional_text = st.none() | short_text
header_values = st.one_of(st.integers(-(2**31), 2**31 - 1), short_text, st.booleans())

properties_strategy = st.builds(
    commands.Basic.Properties,
    content_type=optional_text,
    content_encoding=optional_text,
    headers=st.none() | st.dictionaries(st.text(max_size=20), header_values, max_size=5),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=optional_text,
    reply_to=optional_text,
    expiration=optional_text,
    message_id=optional_text,
    timestamp=st.none() | st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.UTC)),
    message_type=optional_text,
    user_id=optional_text,
    app_id=optional_text,
)


@given(properties=properties_strategy, body_size=st.integers(0, 2**40))
def test_scan_matches_pamqp(properties, body_size):
    header_payload = encode_header_payload(body_size, properties)
    decoded = header.ContentHeader()
    decoded.unmarshal(header_payload)
    expected = decoded.properties
    assert scan_properties(header_payload) == PropertyScan(
        expected.delivery_mode, expected.priority, expected.expiration, expected.headers is not None
    )


def test_scan_of_no_properties():
    scan = scan_properties(encode_header_payload(5, commands.Basic.Properties()))
    assert scan == PropertyScan(None, None, None, False)


def test_scan_of_typical_persistent_message():
    properties = commands.Basic.Properties(content_type="text/plain", headers={"x": 1}, delivery_mode=2,
                                           priority=4, reply_to="r", expiration="1500", app_id="a")
    assert scan_properties(encode_header_payload(5, properties)) == PropertyScan(2, 4, "1500", True)


def scan_error(properties: bytes) -> AMQPError:
    with pytest.raises(AMQPError) as caught:
        scan_properties(b"\x00\x3c\x00\x00" + bytes(8) + properties)
    return caught.value


@pytest.mark.parametrize(
    "properties",
    [
        b"",
        b"\x10",
        b"\x10\x00",
        b"\x10\x00\x02\xff\xff",
        b"\x80\x00\x09ab",
        b"\x20\x00\x00\x00\x00\x09",
        b"\x00\x40" + bytes(7),
        b"\x01\x00\x04\x01",
    ],
    ids=["no-flags", "half-flags", "delivery-mode-missing", "extra-bytes", "short-string-overrun",
         "table-overrun", "timestamp-short", "expiration-overrun"],
)
def test_malformed_properties_are_an_internal_error_like_rabbitmq(properties):
    error = scan_error(properties)
    assert (error.reply_code, error.text) == (INTERNAL_ERROR, "INTERNAL_ERROR")


def test_reserved_flag_bits_are_ignored():
    # Bit 0 (continuation) and bit 1 are not property flags in the basic class; RabbitMQ skips them.
    assert scan_properties(b"\x00\x3c\x00\x00" + bytes(8) + b"\x10\x03\x02") == PropertyScan(2, None, None, False)


def test_expiration_that_is_not_utf8_is_passed_on_for_the_broker_to_refuse():
    # RabbitMQ 3.10 answers "PRECONDITION_FAILED - invalid expiration '\xff\xfe': no_integer" (raw bytes).
    assert scan_properties(b"\x00\x3c\x00\x00" + bytes(8) + b"\x01\x00\x02\xff\xfe").expiration == "\ufffd\ufffd"


def test_a_long_header_is_added_after_the_headers_a_message_has_or_in_a_table_of_its_own():
    from pamqp.commands import Basic

    from protocol.codec import decode_properties, encode_header_payload
    from protocol.properties import with_long_header

    with_table = encode_header_payload(3, Basic.Properties(content_type="text/plain", headers={"a": "b"},
                                                           delivery_mode=2, app_id="app"))
    spliced = decode_properties(with_long_header(with_table, b"x-stream-offset", 2 ** 40))
    assert (spliced.content_type, spliced.headers, spliced.delivery_mode, spliced.app_id) == (
        "text/plain", {"a": "b", "x-stream-offset": 2 ** 40}, 2, "app")
    without = encode_header_payload(3, Basic.Properties(content_encoding="gzip", priority=4))
    spliced = decode_properties(with_long_header(without, b"x-stream-offset", 7))
    assert (spliced.content_encoding, spliced.headers, spliced.priority) == ("gzip", {"x-stream-offset": 7}, 4)
    assert decode_properties(with_long_header(encode_header_payload(0, Basic.Properties()), b"k", -1)).headers == {
        "k": -1}
