"""The pamqp-based codec: method frames, content frames split to frame_max, properties."""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands, frame, header, heartbeat
from pamqp.body import ContentBody

from protocol.codec import (
    HEARTBEAT_FRAME,
    decode_method,
    decode_properties,
    encode_content,
    encode_header_payload,
    encode_method,
)
from protocol.constants import FRAME_ERROR, INTERNAL_ERROR, NOT_IMPLEMENTED
from protocol.errors import AMQPError
from protocol.framing import FrameReader

SAMPLE_METHODS = [
    commands.Connection.StartOk(client_properties={"product": "x", "capabilities": {"basic.nack": True}},
                                mechanism="PLAIN", response="\0guest\0guest"),
    commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
    commands.Channel.Open(),
    commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10, "x-queue-type": "classic"}),
    commands.Queue.Bind(queue="q", exchange="amq.topic", routing_key="a.#", nowait=True),
    commands.Basic.Consume(queue="q", consumer_tag="c1", no_ack=False, exclusive=True),
    commands.Basic.Qos(prefetch_count=10, global_=True),
    commands.Basic.Nack(delivery_tag=7, multiple=True, requeue=False),
    commands.Exchange.Declare(exchange="e", exchange_type="headers", passive=False, durable=True, auto_delete=True,
                              internal=True, nowait=True),
]


def method_payload(method) -> bytes:
    return frame.marshal(method, 1)[7:-1]


def decode_error(payload: bytes) -> AMQPError:
    with pytest.raises(AMQPError) as caught:
        decode_method(payload)
    return caught.value


@pytest.mark.parametrize("method", SAMPLE_METHODS, ids=lambda m: m.name)
def test_method_round_trip_and_pamqp_agreement(method):
    encoded = encode_method(3, method)
    assert encoded == frame.marshal(method, 3)
    [(frame_type, channel, payload)] = FrameReader().feed(encoded)
    assert (frame_type, channel) == (1, 3)
    decoded = decode_method(payload)
    assert type(decoded) is type(method)
    assert dict(decoded) == dict(method)


# Malformed method fields and the reply RabbitMQ 3.10 sent for each (501, with the method's ids).
@pytest.mark.parametrize(
    "payload, text, ids",
    [
        (b"\x00\x3c\x00\x28\x00\x00\x05ab", "FRAME_ERROR - cannot decode <<0,0,5,97,98>>", (60, 40)),
        (b"\x00\x3c\x00\x28\x00\x00\x00\x00", "FRAME_ERROR - cannot decode <<0,0,0,0>>", (60, 40)),
        (b"\x00\x3c\x00\x28" + bytes(7), "FRAME_ERROR - cannot decode <<0,0,0,0,0,0,0>>", (60, 40)),
        (b"\x00\x3c\x00\x50\x00\x00\x00\x01", "FRAME_ERROR - cannot decode <<0,0,0,1>>", (60, 80)),
    ],
)
def test_malformed_fields_cannot_be_decoded(payload, text, ids):
    error = decode_error(payload)
    assert (error.reply_code, error.text, (error.class_id, error.method_id)) == (FRAME_ERROR, text, ids)
    assert error.send_close


def test_long_cannot_decode_text_is_cut_like_rabbitmq():
    fields = b"\x00\x00\xc8" + b"a" * 200 + b"\x64" + b"b" * 100  # exchange and routing key, no flag octet
    error = decode_error(b"\x00\x3c\x00\x28" + fields)
    full = "FRAME_ERROR - cannot decode <<0,0,200," + "97," * 200
    assert error.text == full[:252] + "..."
    assert len(error.text) == 255


def test_field_table_overrunning_the_payload_cannot_be_decoded():
    payload = method_payload(commands.Queue.Declare(queue="q", arguments={"a": 1}))
    assert decode_error(payload[:-2]).text.startswith("FRAME_ERROR - cannot decode <<")


def test_invalid_utf8_short_string_is_rejected_like_pamqp():
    error = decode_error(b"\x00\x32\x00\x0a\x00\x00\x02\xff\xfe\x00" + bytes(4))
    assert (error.reply_code, error.class_id, error.method_id) == (FRAME_ERROR, 50, 10)


@pytest.mark.parametrize("payload", [b"\x00\x3c\x00\x63", b"\x00\x63\x00\x0a", b"\x00\x0a\x00\x63\x00"])
def test_unknown_method_id_drops_the_connection_without_close(payload):
    # RabbitMQ's reader exits on an unknown method id: the client sees the socket close, no connection.close.
    error = decode_error(payload)
    assert error.reply_code == NOT_IMPLEMENTED
    assert not error.send_close
    assert (error.class_id << 16 | error.method_id) == int.from_bytes(payload[:4])


def test_method_id_cut_short_is_an_unknown_frame():
    assert decode_error(b"\x00\x3c").text == "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame"


def test_heartbeat_frame():
    assert HEARTBEAT_FRAME == heartbeat.Heartbeat().marshal() == b"\x08\x00\x00\x00\x00\x00\x00\xce"


def content_frames(channel: int, header_payload: bytes, body: bytes, frame_max: int):
    return FrameReader(frame_max).feed(encode_content(channel, header_payload, body, frame_max))


def test_body_split_at_frame_max_minus_8():
    header_payload = encode_header_payload(10_000, commands.Basic.Properties())
    body = bytes(range(256)) * 39 + bytes(16)
    frames = content_frames(5, header_payload, body, 4096)
    assert frames[0] == (2, 5, header_payload)
    assert [len(p) for _, _, p in frames[1:]] == [4088, 4088, 1824]
    assert all(t == 3 and ch == 5 for t, ch, _ in frames[1:])
    assert b"".join(p for _, _, p in frames[1:]) == body


def test_body_of_exactly_one_frame():
    frames = content_frames(1, encode_header_payload(4088, commands.Basic.Properties()), bytes(4088), 4096)
    assert [len(p) for _, _, p in frames[1:]] == [4088]


def test_empty_body_sends_no_body_frame():
    header_payload = encode_header_payload(0, commands.Basic.Properties(delivery_mode=2))
    assert content_frames(1, header_payload, b"", 4096) == [(2, 1, header_payload)]


def test_frame_max_zero_sends_one_body_frame():
    frames = content_frames(1, encode_header_payload(200_000, commands.Basic.Properties()), bytes(200_000), 0)
    assert [len(p) for _, _, p in frames[1:]] == [200_000]


def test_content_matches_pamqp_frames():
    properties = commands.Basic.Properties(content_type="text/plain", headers={"k": "v"}, priority=3)
    body = b"x" * 300
    header_payload = encode_header_payload(len(body), properties)
    expected = frame.marshal(header.ContentHeader(0, len(body), properties), 2) + b"".join(
        frame.marshal(ContentBody(body[i : i + 120]), 2) for i in range(0, 300, 120)
    )
    assert encode_content(2, header_payload, body, 128) == expected


def test_properties_round_trip():
    properties = commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip", headers={"a": 1, "b": "two", "c": True},
        delivery_mode=2, priority=5, correlation_id="corr", reply_to="amq.rabbitmq.reply-to", expiration="60000",
        message_id="m1", timestamp=datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC), message_type="t",
        user_id="guest", app_id="app",
    )
    header_payload = encode_header_payload(42, properties)
    assert header_payload[:12] == b"\x00\x3c\x00\x00" + (42).to_bytes(8)
    assert decode_properties(header_payload) == properties


# Malformed properties after a basic.publish: RabbitMQ 3.10 closed the connection with 541 INTERNAL_ERROR.
@pytest.mark.parametrize(
    "properties",
    [b"\x10\x00", b"\x10\x00\x02\xff\xff", b"\x80\x00\x09ab", b"\x10\x01\x00\x00\x02", b"\x20\x00\x00\x00\x00\x09"],
    ids=["delivery-mode-missing", "extra-bytes", "short-string-overrun", "continuation-flag", "table-overrun"],
)
def test_malformed_properties_fail_like_rabbitmq(properties):
    with pytest.raises(AMQPError) as caught:
        decode_properties(b"\x00\x3c\x00\x00" + bytes(8) + properties)
    assert (caught.value.reply_code, caught.value.text) == (INTERNAL_ERROR, "INTERNAL_ERROR")


def nested_table(depth: int) -> bytes:
    """A field table nesting `depth` tables in all (each holds the next under the key "k")."""
    inner = b""
    for _ in range(depth - 1):
        inner = b"\x01kF" + len(inner).to_bytes(4) + inner
    return len(inner).to_bytes(4) + inner


QUEUE_DECLARE_ID = b"\x00\x32\x00\x0a"


@pytest.mark.parametrize("depth", [101, 1_000, 20_000])
def test_deeply_nested_arguments_are_a_frame_error_not_a_recursion_error(depth):
    # ticket, queue "q", no flags, then the arguments
    fields = b"\x00\x00\x01q\x00" + nested_table(depth)
    error = decode_error(QUEUE_DECLARE_ID + fields)
    assert (error.reply_code, error.class_id, error.method_id) == (FRAME_ERROR, 50, 10)
    assert error.text.startswith("FRAME_ERROR - cannot decode <<0,0,1,113,0,")


def test_arguments_nested_100_deep_decode():
    method = decode_method(QUEUE_DECLARE_ID + b"\x00\x00\x01q\x00" + nested_table(100))
    assert method.queue == "q" and "k" in method.arguments


def test_deeply_nested_client_properties_are_a_frame_error():
    # a 3.5 KB start-ok that used to raise RecursionError before authentication
    response = b"\0guest\0guest"
    fields = nested_table(580) + b"\x05PLAIN" + len(response).to_bytes(4) + response + b"\x05en_US"
    assert len(fields) < 4096
    error = decode_error(b"\x00\x0a\x00\x0b" + fields)
    assert (error.reply_code, error.class_id, error.method_id) == (FRAME_ERROR, 10, 11)


def test_deeply_nested_headers_are_malformed_properties():
    properties = b"\x20\x00" + nested_table(1_000)
    with pytest.raises(AMQPError) as caught:
        decode_properties(b"\x00\x3c\x00\x00" + bytes(8) + properties)
    assert (caught.value.reply_code, caught.value.text) == (INTERNAL_ERROR, "INTERNAL_ERROR")


def test_timestamp_past_the_year_9999_is_malformed_properties_not_an_overflow():
    with pytest.raises(AMQPError) as caught:
        decode_properties(b"\x00\x3c\x00\x00" + bytes(8) + b"\x00\x40" + b"\xff" * 8)
    assert caught.value.reply_code == INTERNAL_ERROR
