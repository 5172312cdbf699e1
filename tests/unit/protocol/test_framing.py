"""FrameReader: frames out of a byte stream cut anywhere, and RabbitMQ's exact frame errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.constants import FRAME_ERROR, UNEXPECTED_FRAME
from protocol.errors import AMQPError, reply_text
from protocol.framing import FrameReader, unexpected_frame_error


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))


def feed_error(reader: FrameReader, data: bytes) -> AMQPError:
    with pytest.raises(AMQPError) as caught:
        reader.feed(data)
    return caught.value


frames_strategy = st.lists(
    st.one_of(
        st.tuples(st.just(1), st.integers(0, 65535), st.binary(min_size=4, max_size=40)),
        st.tuples(st.just(2), st.integers(0, 65535), st.binary(min_size=12, max_size=40)),
        st.tuples(st.just(3), st.integers(0, 65535), st.binary(max_size=300)),
        st.just((8, 0, b"")),
    ),
    max_size=20,
)


@given(frames=frames_strategy, cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_frames_survive_any_chunking(frames, cuts):
    stream = b"".join(frame(*f) for f in frames)
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    reader = FrameReader()
    received = []
    for start, stop in zip(bounds, bounds[1:]):
        received += reader.feed(stream[start:stop])
    assert received == frames
    assert all(type(payload) is bytes for _, _, payload in received)


def test_one_byte_at_a_time():
    frames = [(1, 1, b"\x00\x3c\x00\x28" + bytes(8)), (2, 1, bytes(14)), (3, 1, b"hello"), (8, 0, b"")]
    stream = b"".join(frame(*f) for f in frames)
    reader = FrameReader()
    received = []
    for i in range(len(stream)):
        received += reader.feed(stream[i : i + 1])
    assert received == frames


def test_many_frames_in_one_chunk():
    frames = [(3, n % 7, bytes([n % 256]) * (n % 50)) for n in range(500)]
    assert FrameReader().feed(b"".join(frame(*f) for f in frames)) == frames


def test_bytearray_and_memoryview_input_give_bytes_payloads():
    data = frame(3, 2, b"body")
    for chunk in (bytearray(data), memoryview(data)):
        assert FrameReader().feed(chunk) == [(3, 2, b"body")]


def test_heartbeat():
    assert FrameReader().feed(b"\x08\x00\x00\x00\x00\x00\x00\xce") == [(8, 0, b"")]


def test_incomplete_frame_is_kept_until_complete():
    reader = FrameReader()
    data = frame(3, 1, b"x" * 1000)
    assert reader.feed(data[:500]) == []
    assert reader.feed(data[500:-1]) == []
    assert reader.feed(data[-1:] + frame(8, 0, b"")) == [(3, 1, b"x" * 1000), (8, 0, b"")]


def test_oversize_frame_fails_as_soon_as_its_header_arrives():
    error = feed_error(FrameReader(131072), struct.pack(">BHI", 1, 1, 200000))
    assert error.reply_code == FRAME_ERROR
    assert error.text == "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,200000,131064}"
    assert (error.class_id, error.method_id, error.send_close) == (0, 0, True)


def test_oversize_header_completed_by_a_later_chunk():
    reader = FrameReader(4096)
    assert reader.feed(b"\x03\x00\x05\x00") == []
    error = feed_error(reader, b"\x00\x10\x01")
    assert error.text == "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}"


def test_payload_up_to_frame_max_is_accepted_like_rabbitmq():
    # RabbitMQ tolerates frames up to 8 bytes over frame_max (FRAME_SIZE_FUDGE): payload == frame_max passes.
    reader = FrameReader(4096)
    assert reader.feed(frame(3, 1, bytes(4096))) == [(3, 1, bytes(4096))]
    error = feed_error(reader, frame(3, 1, bytes(4097)))
    assert error.text == "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}"


def test_frame_max_can_change_and_zero_means_no_limit():
    reader = FrameReader(0)
    assert reader.feed(frame(3, 1, bytes(300_000))) == [(3, 1, bytes(300_000))]
    reader.frame_max = 4096
    assert feed_error(reader, frame(3, 1, bytes(5000))).text.endswith("{frame_too_large,5000,4088}")


def test_bad_end_byte():
    error = feed_error(FrameReader(), frame(1, 1, b"\x00\x3c\x00\x28", end=0))
    assert error.text == "FRAME_ERROR - type 1, all octets = <<0,60,0,40>>: {invalid_frame_end_marker,0}"


def test_bad_end_byte_on_long_payload_wraps_like_erlang():
    error = feed_error(FrameReader(), frame(1, 1, bytes(range(40)), end=0x41))
    assert error.text == (
        "FRAME_ERROR - type 1, first 16 octets = <<0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15>>: "
        "{invalid_frame_end_marker,\n" + " " * 70 + "65}"
    )


# Body payloads with a bad end byte (0x41) and the reply text RabbitMQ 3.10 sent for each.
RABBITMQ_END_MARKER_TEXTS = [
    ('64646464646464646464646464646464', 'FRAME_ERROR - type 3, all octets = <<"dddddddddddddddd">>: {invalid_frame_end_marker,65}'),
    ('646464646464646464646464', 'FRAME_ERROR - type 3, all octets = <<"dddddddddddd">>: {invalid_frame_end_marker,65}'),
    ('64646464646464646464', 'FRAME_ERROR - type 3, all octets = <<"dddddddddd">>: {invalid_frame_end_marker,65}'),
    ('09090909090909090909090909090909', 'FRAME_ERROR - type 3, all octets = <<"\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t\\t">>: {invalid_frame_end_marker,\n                                                              65}'),
    ('c3a9616263', 'FRAME_ERROR - type 3, all octets = <<"éabc">>: {invalid_frame_end_marker,65}'),
    ('6122625c630a', 'FRAME_ERROR - type 3, all octets = <<"a\\"b\\\\c\\n">>: {invalid_frame_end_marker,65}'),
    ('6465666768696a6b6c6d6e6f70717273', 'FRAME_ERROR - type 3, all octets = <<"defghijklmnopqrs">>: {invalid_frame_end_marker,65}'),
    ('', 'FRAME_ERROR - type 3, all octets = <<>>: {invalid_frame_end_marker,65}'),
    ('80808080808080808080808080808080', 'FRAME_ERROR - type 3, all octets = <<128,128,128,128,128,128,128,128,128,128,128,128,128,128,\n                       128,128>>: {invalid_frame_end_marker,65}'),
    ('ffffffffffffffffffffffffffffff00', 'FRAME_ERROR - type 3, all octets = <<255,255,255,255,255,255,255,255,255,255,255,255,255,255,\n                       255,0>>: {invalid_frame_end_marker,65}'),
    ('ff00ff00ff00ff00ff00ff00ff00ff00', 'FRAME_ERROR - type 3, all octets = <<255,0,255,0,255,0,255,0,255,0,255,0,255,0,255,0>>: {invalid_frame_end_marker,\n                                                                           65}'),
    ('c801c801c801c801c801c801c801c801c801c801', 'FRAME_ERROR - type 3, first 16 octets = <<200,1,200,1,200,1,200,1,200,1,200,1,200,1,200,1>>: {invalid_frame_end_marker,\n                                                                                65}'),
    ('99999999999999999999999999999999', 'FRAME_ERROR - type 3, all octets = <<153,153,153,153,153,153,153,153,153,153,153,153,153,153,\n                       153,153>>: {invalid_frame_end_marker,65}'),
    ('0101010101010101010101010101', 'FRAME_ERROR - type 3, all octets = <<1,1,1,1,1,1,1,1,1,1,1,1,1,1>>: {invalid_frame_end_marker,\n                                                       65}'),
    ('010101010101010101010101010101', 'FRAME_ERROR - type 3, all octets = <<1,1,1,1,1,1,1,1,1,1,1,1,1,1,1>>: {invalid_frame_end_marker,\n                                                         65}'),
    ('64006400640064006400640064006400', 'FRAME_ERROR - type 3, all octets = <<100,0,100,0,100,0,100,0,100,0,100,0,100,0,100,0>>: {invalid_frame_end_marker,\n                                                                           65}'),
    ('00000000000000000000000000000000', 'FRAME_ERROR - type 3, all octets = <<0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0>>: {invalid_frame_end_marker,\n                                                           65}'),
    ('000000000000000000000000', 'FRAME_ERROR - type 3, all octets = <<0,0,0,0,0,0,0,0,0,0,0,0>>: {invalid_frame_end_marker,\n                                                   65}'),
    ('828282828282828282828282', 'FRAME_ERROR - type 3, all octets = <<130,130,130,130,130,130,130,130,130,130,130,130>>: {invalid_frame_end_marker,\n                                                                           65}'),
    ('8282828282828282828282', 'FRAME_ERROR - type 3, all octets = <<130,130,130,130,130,130,130,130,130,130,130>>: {invalid_frame_end_marker,\n                                                                       65}'),
    ('82828282828282828282', 'FRAME_ERROR - type 3, all octets = <<130,130,130,130,130,130,130,130,130,130>>: {invalid_frame_end_marker,\n                                                                   65}'),
    ('969696969696969696', 'FRAME_ERROR - type 3, all octets = <<150,150,150,150,150,150,150,150,150>>: {invalid_frame_end_marker,\n                                                               65}'),
    ('e697a5e69cac', 'FRAME_ERROR - type 3, all octets = <<230,151,165,230,156,172>>: {invalid_frame_end_marker,\n                                                   65}'),
    ('c3a90000000000000000000000000000000000000000', 'FRAME_ERROR - type 3, first 16 octets = <<195,169,0,0,0,0,0,0,0,0,0,0,0,0,0,0>>: {invalid_frame_end_marker,\n                                                                    65}'),
]


@pytest.mark.parametrize("payload_hex, text", RABBITMQ_END_MARKER_TEXTS)
def test_end_marker_texts_match_rabbitmq(payload_hex, text):
    assert feed_error(FrameReader(), frame(3, 1, bytes.fromhex(payload_hex), end=0x41)).text == text


def test_bytes_that_are_not_utf8_reach_the_text_as_replacement_characters():
    # RabbitMQ copies the raw byte 0xE9 into the reply text; a client decoding it as UTF-8 sees U+FFFD.
    error = feed_error(FrameReader(), frame(3, 1, b"\xe9abc", end=0x41))
    assert error.text == 'FRAME_ERROR - type 3, all octets = <<"\ufffdabc">>: {invalid_frame_end_marker,65}'


@pytest.mark.parametrize(
    "raw, text",
    [
        (frame(9, 1, b""), "FRAME_ERROR - type 9, all octets = <<>>: unknown_frame"),
        (frame(4, 1, b"abc"), 'FRAME_ERROR - type 4, all octets = <<"abc">>: unknown_frame'),
        (frame(8, 0, b"x"), 'FRAME_ERROR - type 8, all octets = <<"x">>: unknown_frame'),
        (frame(1, 1, b"\x00\x3c"), "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame"),
        (frame(2, 1, b"\x00\x3c\x00\x00"), "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame"),
    ],
)
def test_unknown_frames(raw, text):
    assert feed_error(FrameReader(), raw).text == text


def test_frames_before_the_bad_one_are_handed_over_with_the_error():
    good = [(1, 1, b"\x00\x3c\x00\x28" + bytes(4)), (8, 0, b"")]
    error = feed_error(FrameReader(), b"".join(frame(*f) for f in good) + frame(9, 1, b""))
    assert error.frames == good


def test_unexpected_frame_text():
    error = unexpected_frame_error(8, b"")
    assert (error.reply_code, error.text) == (UNEXPECTED_FRAME, "UNEXPECTED_FRAME - type 8, all octets = <<>>")


def test_reply_text_is_cut_to_255_bytes_like_rabbitmq():
    full = "FRAME_ERROR - cannot decode <<" + "97," * 100
    assert reply_text(FRAME_ERROR, full.removeprefix("FRAME_ERROR - ")) == full[:252] + "..."
    assert reply_text(FRAME_ERROR, "short") == "FRAME_ERROR - short"


@given(frames=frames_strategy.filter(bool), cut=st.integers(0, 10_000))
def test_frame_end_finds_where_the_next_frame_ends_however_the_stream_is_cut(frames, cut):
    # A connection feeds the reader up to frame_end to read one frame alone (tune-ok changes frame_max for the rest).
    stream = b"".join(frame(*f) for f in frames)
    first_end = len(frame(*frames[0]))
    cut = cut % (first_end + 1)
    reader = FrameReader(0)
    assert reader.feed(stream[:cut]) == ([frames[0]] if cut == first_end else [])
    rest = stream[cut:]
    end = reader.frame_end(rest)
    if cut == first_end:  # the first frame was complete: frame_end looks at the second
        assert end == (len(frame(*frames[1])) if len(frames) > 1 else 0)
    else:
        assert end == first_end - cut
        assert reader.feed(rest[:end]) == [frames[0]]


def test_frame_end_with_less_than_a_header_is_the_whole_chunk():
    reader = FrameReader(0)
    assert reader.frame_end(b"\x01\x00") == 2
    reader.feed(b"\x01\x00")
    assert reader.frame_end(b"\x00\x00\x00\x00\x04abcd\xce\x08") == 10  # 12 bytes, 2 of them fed
