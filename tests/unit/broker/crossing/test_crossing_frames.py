"""The frames of a link between two processes of a node (broker.crossing.frames): what one end writes, the other
reads back whole, however the stream cuts it; anything else closes the link with the reason."""

from __future__ import annotations

import pytest

from broker.crossing.frames import (
    CONTROL, PUBLISH, FrameError, Messages, Reader, decode_dead_letter, decode_got, decode_table,
    encode_dead_letter, encode_delivery, encode_got, encode_message, frame, queue_of,
)
from broker.model.message import Address, Header, Message
from protocol.codec import encode_header_payload
from pamqp.commands import Basic
from storage.definitions_log import encode_data


def message(exchange: str, routing_key: str, body: bytes, **properties) -> Message:
    header = encode_header_payload(len(body), Basic.Properties(**properties))
    return Message(Address(exchange, routing_key), Header(header), body)


def test_a_batch_of_messages_reads_back_whole_across_any_cut_of_the_stream():
    sent = [message("amq.topic", "a.b", b"one", delivery_mode=2), message("", "q", b"", headers={"k": "v"}),
            message("ex\u00e9", "cl\u00e9", b"x" * 70_000)]
    batch = b"".join(encode_message("v\u00e9".encode(), b"queue", item) for item in sent)
    stream = frame(PUBLISH, batch) + frame(CONTROL, encode_data({"op": "cancel", "ids": [1, 2]}))
    reader, frames = Reader(), []
    for start in range(0, len(stream), 7):
        frames += reader.feed(stream[start:start + 7])
    assert [kind for kind, _ in frames] == [PUBLISH, CONTROL]
    received = list(Messages().published(frames[0][1]))
    assert [(*queue_of(names, vhost_length), item.exchange, item.routing_key, item.header_payload, item.body)
            for names, vhost_length, item in received] == [
        ("v\u00e9", "queue", item.exchange, item.routing_key, item.header_payload, item.body) for item in sent]
    assert decode_table(frames[1][1]) == {"op": "cancel", "ids": [1, 2]}


def test_deliveries_gets_and_dead_letters_carry_their_ids_and_flags():
    sent = message("x", "k", b"body", priority=3)
    batch = encode_delivery(7, (3 << 40) | 12, True, sent) + encode_delivery(8, -1, False, sent)
    assert [(subscriber, delivery_id, redelivered, item.body) for subscriber, delivery_id, redelivered, item
            in Messages().delivered(batch)] == [(7, (3 << 40) | 12, True, b"body"), (8, -1, False, b"body")]
    request, ready, found = decode_got(encode_got(5, 41, encode_delivery(0, 9, False, sent)), Messages())
    assert (request, ready, found[0], found[1].body, found[2]) == (5, 41, 9, b"body", False)
    assert decode_got(encode_got(6, 0, b""), Messages()) == (6, 0, None)
    table, item = decode_dead_letter(encode_dead_letter("/", "dlx", ["a", "b"], sent, True), Messages())
    assert table == {"vhost": "/", "exchange": "dlx", "keys": ["a", "b"], "no_cycles": True}
    assert (item.exchange, item.routing_key, item.body) == ("x", "k", b"body")


@pytest.mark.parametrize("stream, reason", [
    (bytes([99, 0, 0, 0, 0]), "unknown frame kind 99"),
    (bytes([PUBLISH, 0x7F, 0xFF, 0xFF, 0xFF]), "exceeds the limit"),
])
def test_a_stream_that_holds_no_frame_is_refused_with_the_reason(stream, reason):
    with pytest.raises(FrameError, match=reason):
        Reader().feed(stream)


@pytest.mark.parametrize("payload", [b"\x00\x01", encode_message(b"v", b"q", message("", "k", b"abc"))[:-1]])
def test_a_batch_cut_short_is_refused(payload):
    with pytest.raises(FrameError, match="malformed|runs past"):
        list(Messages().published(payload))
    with pytest.raises(FrameError):
        list(Messages().delivered(payload[:5]))


def test_an_operation_that_is_not_a_table_is_refused():
    with pytest.raises(FrameError, match="malformed operation"):
        decode_table(b"[1, 2")
    with pytest.raises(FrameError):
        decode_table(b"")
