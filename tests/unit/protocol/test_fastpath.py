"""Each fast path against pamqp, byte for byte, on generated input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from protocol import fastpath
from protocol.codec import decode_method
from protocol.errors import AMQPError

short_text = st.text(max_size=80).filter(lambda s: len(s.encode()) <= 255)
# Names pamqp's own validation accepts when it encodes (exchange-name domain, at most 127 chars).
exchange_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:", max_size=127)
# pamqp reads and writes long-long fields as signed; tags of 2**63 and more (never reached) differ in sign only.
delivery_tag = st.integers(0, 2**63 - 1)
UNSIGNED_64 = 2**64
channel = st.integers(0, 65535)


def shortstr(value: bytes) -> bytes:
    return bytes((len(value),)) + value


def publish_payload(exchange: bytes, routing_key: bytes, bits: int) -> bytes:
    return b"\x00\x3c\x00\x28\x00\x00" + shortstr(exchange) + shortstr(routing_key) + bytes((bits,))


def outcome(function, payload: bytes):
    """The value, or the AMQPError's (code, text, class_id, method_id)."""
    try:
        return function(payload)
    except AMQPError as error:
        return ("error", error.reply_code, error.text, error.class_id, error.method_id)


@given(exchange=short_text, routing_key=short_text, bits=st.integers(0, 255))
def test_decode_publish_matches_pamqp(exchange, routing_key, bits):
    payload = publish_payload(exchange.encode(), routing_key.encode(), bits)
    method = decode_method(payload)
    expected = (method.exchange, method.routing_key, method.mandatory, method.immediate)
    assert fastpath.decode_publish(payload) == expected == (exchange, routing_key, bool(bits & 1), bool(bits & 2))


@given(exchange=exchange_name, routing_key=short_text, mandatory=st.booleans(), immediate=st.booleans())
def test_decode_publish_of_pamqp_encoded_frames(exchange, routing_key, mandatory, immediate):
    method = commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                                    immediate=immediate)
    payload = frame.marshal(method, 1)[7:-1]
    assert fastpath.decode_publish(payload) == (exchange, routing_key, mandatory, immediate)


@given(fields=st.binary(max_size=40))
@example(fields=b"\x00\x00\x05ab")
@example(fields=b"\x00\x00\x02\xff\xfe\x00\x00")
@example(fields=b"\x00\x00\x00\x00\x00\x00\x00")
def test_decode_publish_fails_exactly_when_the_codec_does(fields):
    payload = b"\x00\x3c\x00\x28" + fields
    assert outcome(fastpath.decode_publish, payload) == outcome(_publish_via_codec, payload)


def _publish_via_codec(payload: bytes):
    method = decode_method(payload)
    return method.exchange, method.routing_key, method.mandatory, method.immediate


def test_invalid_utf8_in_publish_is_rejected_as_pamqp_does():
    payload = publish_payload(b"\xff\xfe", b"", 0)
    with pytest.raises(ValueError):
        commands.Basic.Publish().unmarshal(payload[4:])
    with pytest.raises(AMQPError) as caught:
        fastpath.decode_publish(payload)
    assert caught.value.text == "FRAME_ERROR - cannot decode <<0,0,2,255,254,0,0>>"


@given(tag=delivery_tag, multiple=st.booleans())
def test_decode_ack_matches_pamqp(tag, multiple):
    payload = frame.marshal(commands.Basic.Ack(tag, multiple), 1)[7:-1]
    method = decode_method(payload)
    assert fastpath.decode_ack(payload) == (method.delivery_tag, method.multiple) == (tag, multiple)


@given(tag=delivery_tag, multiple=st.booleans(), requeue=st.booleans())
def test_decode_nack_and_reject_match_pamqp(tag, multiple, requeue):
    nack = frame.marshal(commands.Basic.Nack(tag, multiple, requeue), 1)[7:-1]
    assert fastpath.decode_nack(nack) == (tag, multiple, requeue)
    reject = frame.marshal(commands.Basic.Reject(tag, requeue), 1)[7:-1]
    assert fastpath.decode_reject(reject) == (tag, requeue)


@given(fields=st.binary(max_size=16))
def test_decode_ack_nack_reject_fail_exactly_when_the_codec_does(fields):
    for method_id, function, as_tuple in (
        (0x50, fastpath.decode_ack, lambda m: (m.delivery_tag % UNSIGNED_64, m.multiple)),
        (0x78, fastpath.decode_nack, lambda m: (m.delivery_tag % UNSIGNED_64, m.multiple, m.requeue)),
        (0x5A, fastpath.decode_reject, lambda m: (m.delivery_tag % UNSIGNED_64, m.requeue)),
    ):
        payload = b"\x00\x3c\x00" + bytes((method_id,)) + fields
        assert outcome(function, payload) == outcome(lambda p: as_tuple(decode_method(p)), payload)


@given(body_size=st.integers(0, 2**64 - 1), content_type=st.none() | exchange_name)
def test_decode_content_header_matches_pamqp(body_size, content_type):
    properties = commands.Basic.Properties(content_type=content_type)
    payload = header.ContentHeader(0, body_size, properties).marshal()
    decoded = header.ContentHeader()
    decoded.unmarshal(payload)
    assert fastpath.decode_content_header(payload) == (decoded.class_id, decoded.body_size) == (60, body_size)


def test_decode_content_header_rejects_short_input():
    with pytest.raises(AMQPError) as caught:
        fastpath.decode_content_header(b"\x00\x3c\x00\x00")
    assert caught.value.text == "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame"


EMPTY_HEADER = header.ContentHeader(0, 0, commands.Basic.Properties())


@given(channel=channel, consumer_tag=short_text, tag=delivery_tag, redelivered=st.booleans(),
       exchange=exchange_name, routing_key=short_text)
def test_encode_delivery_of_an_empty_body_matches_pamqp(channel, consumer_tag, tag, redelivered, exchange,
                                                         routing_key):
    method = commands.Basic.Deliver(consumer_tag, tag, redelivered, exchange, routing_key)
    encoded = fastpath.encode_delivery(channel, consumer_tag.encode(), tag, redelivered, exchange.encode(),
                                       routing_key.encode(), EMPTY_HEADER.marshal(), b"", 4096)
    assert encoded == frame.marshal(method, channel) + frame.marshal(EMPTY_HEADER, channel)


@given(consumer_tag=short_text, tag=delivery_tag, redelivered=st.booleans(), exchange=short_text,
       routing_key=short_text)
def test_encode_delivery_round_trips_through_pamqp(consumer_tag, tag, redelivered, exchange, routing_key):
    encoded = fastpath.encode_delivery(9, consumer_tag.encode(), tag, redelivered, exchange.encode(),
                                       routing_key.encode(), EMPTY_HEADER.marshal(), b"", 0)
    consumed, channel_number, method = frame.unmarshal(encoded)
    assert channel_number == 9 and encoded[consumed:] == frame.marshal(EMPTY_HEADER, 9)
    assert dict(method) == {"consumer_tag": consumer_tag, "delivery_tag": tag, "redelivered": redelivered,
                            "exchange": exchange, "routing_key": routing_key}


@given(channel=channel, tag=delivery_tag, redelivered=st.booleans(), routing_key=short_text,
       body=st.binary(max_size=300), frame_max=st.sampled_from([0, 4096, 50, 9]),
       properties=st.builds(commands.Basic.Properties, content_type=st.sampled_from([None, "text/plain"]),
                            delivery_mode=st.sampled_from([None, 1, 2]), priority=st.integers(0, 9)))
@example(channel=1, tag=1, redelivered=False, routing_key="k", body=b"", frame_max=4096,
         properties=commands.Basic.Properties())
def test_encode_delivery_matches_pamqp_deliver_header_and_body_frames(channel, tag, redelivered, routing_key, body,
                                                                      frame_max, properties):
    """Bodies that fit one frame (joined in one pass), that need several (frame_max - 8 bytes each) or none."""
    content_header = header.ContentHeader(0, len(body), properties)
    header_payload = content_header.marshal()
    largest = frame_max - 8 if frame_max else max(len(body), 1)
    expected = frame.marshal(commands.Basic.Deliver("ctag", tag, redelivered, "amq.direct", routing_key), channel)
    expected += frame.marshal(content_header, channel)
    expected += b"".join(frame.marshal(ContentBody(body[start:start + largest]), channel)
                         for start in range(0, len(body), largest))
    encoded = fastpath.encode_delivery(channel, b"ctag", tag, redelivered, b"amq.direct", routing_key.encode(),
                                       header_payload, body, frame_max)
    assert encoded == expected


@given(channel=channel, tag=delivery_tag, multiple=st.booleans())
def test_encode_ack_matches_pamqp(channel, tag, multiple):
    assert fastpath.encode_ack(channel, tag, multiple) == frame.marshal(commands.Basic.Ack(tag, multiple), channel)


@given(channel=channel, tag=delivery_tag, multiple=st.booleans(), requeue=st.booleans())
def test_encode_nack_matches_pamqp(channel, tag, multiple, requeue):
    expected = frame.marshal(commands.Basic.Nack(tag, multiple, requeue), channel)
    assert fastpath.encode_nack(channel, tag, multiple, requeue) == expected


def test_encode_nack_does_not_requeue_by_default():
    assert fastpath.encode_nack(1, 5, False) == frame.marshal(commands.Basic.Nack(5, False, False), 1)


def test_encode_delivery_refuses_strings_over_255_bytes():
    with pytest.raises((struct.error, OverflowError)):
        fastpath.encode_delivery(1, b"c", 1, False, b"", b"k" * 256, EMPTY_HEADER.marshal(), b"x", 0)
