"""The replication stream's messages: every valid one round-trips, any damage stops the reader."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import frames
from storage.replica import APPEND, DELETE, decode_ops, encode_ops, ops_parts


def test_frames_round_trip_whatever_the_cuts_between_reads():
    nonce = bytes(range(16))
    stream = (frames.encode(frames.HELLO, frames.hello_payload("node-b", "dir-b", 7, nonce, "1.2.3", 3))
              + frames.encode_frame(7, 12, b"ops")
              + frames.encode_ack(12) + frames.encode_refuse("going away") + frames.HEARTBEAT_MESSAGE)
    for size in (1, 2, 5, 13, len(stream)):
        reader = frames.Reader(limit=1000)
        messages = []
        for start in range(0, len(stream), size):
            messages += reader.feed(stream[start:start + size])
        kinds = [kind for kind, _ in messages]
        assert kinds == [frames.HELLO, frames.FRAME, frames.ACK, frames.REFUSE, frames.HEARTBEAT]
        assert frames.decode_hello(messages[0][1]) == frames.Hello("node-b", "dir-b", 7, nonce, "1.2.3", 3)
        assert frames.decode_frame(messages[1][1]) == (7, 12, b"ops")
        assert frames.decode_ack(messages[2][1]) == 12
        assert messages[3][1] == b"going away"
        assert messages[4][1] == b""


def test_a_frame_in_parts_is_the_frame_and_holds_the_ops_data_uncopied():
    data = bytearray(b"x" * 100_000)  # (a store's chunk)
    ops = [(APPEND, "messages/00000001.seg", data), (DELETE, "messages/00000000.seg", b"")]
    parts = frames.frame_parts(3, 4, ops_parts(ops))
    assert b"".join(parts) == frames.encode_frame(3, 4, encode_ops(ops))
    assert any(part is data for part in parts)
    [(kind, payload)] = frames.Reader(limit=frames.MAX_PAYLOAD).feed(b"".join(parts))
    assert kind == frames.FRAME
    epoch, sequence, encoded = frames.decode_frame(payload)
    assert (epoch, sequence, decode_ops(encoded)) == (3, 4, ops)


def test_a_hello_of_a_release_that_did_not_say_its_version_reads_as_one_of_store_format_3():
    payload = b'{"node": "b", "dir": "d", "epoch": 1, "nonce": "%s"}' % (b"00" * 16)
    assert frames.decode_hello(payload) == frames.Hello("b", "d", 1, bytes(16), "0.1.0 or older", 3)


@given(st.integers(-1, 2**62), st.integers(0, 2**62), st.binary(max_size=300))
def test_any_frame_round_trips(sequence, epoch, ops):
    reader = frames.Reader(limit=frames.MAX_PAYLOAD)
    [(kind, payload)] = reader.feed(frames.encode_frame(epoch, sequence, ops))
    assert kind == frames.FRAME
    assert frames.decode_frame(payload) == (epoch, sequence, ops)


def test_a_flipped_bit_anywhere_in_a_frame_is_refused_and_nothing_is_handed_out():
    good = frames.encode_frame(3, 4, b"APPEND some bytes")
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 0x10
        reader = frames.Reader(limit=1000)
        try:
            messages = reader.feed(bytes(damaged))
        except frames.FrameError:
            continue
        # a flip in the length field may leave the reader waiting for bytes that never come: nothing applied
        assert messages == [], position


def test_a_torn_frame_is_never_handed_out():
    good = frames.encode_frame(3, 4, b"x" * 100)
    reader = frames.Reader(limit=1000)
    assert reader.feed(good[:-1]) == []


def test_unknown_kind_and_oversized_messages_are_refused():
    with pytest.raises(frames.FrameError, match="unknown message kind 9"):
        frames.Reader().feed(struct.pack(">BII", 9, 0, 0))
    with pytest.raises(frames.FrameError, match="exceeds the limit of 4096"):
        frames.Reader().feed(struct.pack(">BII", frames.FRAME, 5000, 0))


NONCE = '"' + "ab" * 16 + '"'


@pytest.mark.parametrize("payload", [b"not json", b"[]", f'{{"node": 1, "dir": "d", "epoch": 1, "nonce": {NONCE}}}',
                                     b'{"node": "a", "dir": "d", "epoch": 1}',  # no nonce
                                     f'{{"node": "a", "epoch": 1, "nonce": {NONCE}}}',  # no data dir identity
                                     f'{{"node": "a", "dir": 5, "epoch": 1, "nonce": {NONCE}}}',
                                     f'{{"node": "a", "dir": "d", "epoch": true, "nonce": {NONCE}}}',
                                     b'{"node": "a", "dir": "d", "epoch": 1, "nonce": "abcd"}',  # a short nonce
                                     b'{"node": "a", "dir": "d", "epoch": 1, "nonce": "' + b"zz" * 16 + b'"}',
                                     # the secret, as hellos carried it before: refused, never needed
                                     f'{{"node": "a", "dir": "d", "epoch": 1, "secret": "s"}}'])
def test_malformed_hellos_are_refused(payload):
    with pytest.raises(frames.FrameError, match="malformed hello"):
        frames.decode_hello(payload.encode() if isinstance(payload, str) else payload)


def test_short_frames_and_acks_are_refused():
    with pytest.raises(frames.FrameError, match="shorter than its head"):
        frames.decode_frame(b"\x00" * 15)
    with pytest.raises(frames.FrameError, match="ack of 3 bytes"):
        frames.decode_ack(b"abc")


def test_a_manifest_round_trips_and_a_reader_can_stop_after_one_message():
    files = [("format", 2, "ab" * 32), ("messages/0000000001.seg", 70_000_000, "cd" * 32)]
    stream = frames.encode(frames.HELLO, frames.hello_payload("b", "dir-b", 3, bytes(16), "1.2.3", 3)) + frames.encode_manifest(files)
    reader = frames.Reader()  # the hello's limit: the manifest behind it waits, unread, until the limit is raised
    [(kind, _)] = reader.feed(stream, at_most=1)
    assert kind == frames.HELLO
    reader.limit = frames.MAX_MANIFEST
    [(kind, payload)] = reader.feed(b"")
    assert kind == frames.MANIFEST
    assert frames.decode_manifest(payload) == {path: (size, digest) for path, size, digest in files}


@pytest.mark.parametrize("payload", [b"[]", b'{"files": {}}', b'{"files": [["a", -1, "d"]]}',
                                     b'{"files": [["a", 1]]}', b'{"files": [[1, 1, "d"]]}', b"[" * 5000])
def test_malformed_manifests_are_refused(payload):
    with pytest.raises(frames.FrameError, match="malformed manifest"):
        frames.decode_manifest(payload)
