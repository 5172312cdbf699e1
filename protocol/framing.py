"""Split an AMQP byte stream into frames (the protocol header is stripped by the connection beforehand).

Checks follow rabbit_reader: the frame size as soon as a frame header arrives, then the end byte, then the
frame type (rabbit_command_assembler:analyze_frame). Each failure raises AMQPError with RabbitMQ's reply text.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from protocol.constants import (
    DEFAULT_FRAME_MAX,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    UNEXPECTED_FRAME,
)
from protocol.erlang_terms import Atom, column_after, pretty, to_text
from protocol.errors import AMQPError

Frame = tuple[int, int, bytes]  # (frame_type, channel, payload)

_FRAME_HEADER: Final = struct.Struct(">BHI")
_NO_LIMIT: Final = 1 << 32  # above any 32-bit payload size
# Shortest payload analyze_frame accepts per frame type; other types are unknown frames.
_MIN_PAYLOAD: Final = {FRAME_METHOD: 4, FRAME_HEADER: 12, FRAME_BODY: 0, FRAME_HEARTBEAT: 0}


def describe_frame(frame_type: int, payload: bytes | memoryview) -> str:
    """RabbitMQ's "type ~tp, ~ts octets = ~tp" (rabbit_reader:payload_snippet), as Erlang chars."""
    which = "all" if len(payload) <= 16 else "first 16"
    prefix = f"type {frame_type}, {which} octets = "
    return prefix + pretty(bytes(payload[:16]), column_after(prefix))


def frame_error(reason: object, frame_type: int, payload: bytes | memoryview) -> AMQPError:
    """rabbit_reader:frame_error: 501 with the frame described and the reason as an Erlang term."""
    described = describe_frame(frame_type, payload) + ": "
    explanation = described + pretty(reason, column_after(described))
    return AMQPError(FRAME_ERROR, to_text(explanation), 0, 0)


def unexpected_frame_error(frame_type: int, payload: bytes) -> AMQPError:
    """rabbit_reader:unexpected_frame: 505, e.g. a heartbeat on a channel other than 0."""
    explanation = describe_frame(frame_type, payload)
    return AMQPError(UNEXPECTED_FRAME, to_text(explanation), 0, 0)


class FrameReader:
    """Splits a byte stream into frames, reading each chunk from an offset without copying it first.

    Only a frame cut off at the end of a chunk is kept, in a bytearray that is topped up by later chunks and
    emptied as soon as that frame is complete; nothing is ever scanned twice or read a byte at a time.
    """

    __slots__ = ("frame_max", "_partial")

    def __init__(self, frame_max: int = DEFAULT_FRAME_MAX):
        self.frame_max = frame_max  # largest frame (header + payload + end byte) accepted; 0 = no limit
        self._partial = bytearray()  # the start of a frame whose remaining bytes have not arrived yet

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Append data; return every now-complete frame as (frame_type, channel, payload). Raises AMQPError."""
        if type(data) is not bytes:
            data = bytes(data)
        frames: list[Frame] = []
        try:
            start = 0
            if self._partial:
                start = self._complete_partial(data)
                if start < 0:
                    return frames
                self._read_partial_frame(frames)
            offset = self._read_frames(data, start, frames)
        except AMQPError as error:
            error.frames = frames
            raise
        if offset < len(data):
            self._partial += memoryview(data)[offset:]
        return frames

    def pending(self) -> bytes:
        """The bytes of a frame begun but not complete (b"" if none)."""
        return bytes(self._partial)

    def frame_end(self, data: bytes) -> int:
        """How many bytes of data complete the next frame (the one begun in an earlier chunk, if any): len(data) when
        it does not end in data. Feeding a chunk up to there reads that one frame alone, for a caller whose next frame
        is to be judged by what this one changes (tune-ok sets frame_max for the frames after it)."""
        partial = self._partial
        if len(partial) >= FRAME_HEADER_SIZE:
            size: int = _FRAME_HEADER.unpack_from(partial)[2]
        else:
            head = bytes(partial) + data[: FRAME_HEADER_SIZE - len(partial)]
            if len(head) < FRAME_HEADER_SIZE:
                return len(data)
            size = _FRAME_HEADER.unpack_from(head)[2]
        return min(len(data), FRAME_OVERHEAD + size - len(partial))

    def _complete_partial(self, data: bytes) -> int:
        """Top up the partial frame from data; how many bytes of data it took, or -1 if still incomplete."""
        partial = self._partial
        taken = max(0, FRAME_HEADER_SIZE - len(partial))
        if taken:
            partial += memoryview(data)[:taken]
            if len(partial) < FRAME_HEADER_SIZE:
                return -1
        frame_type, _, size = _FRAME_HEADER.unpack_from(partial)
        self._check_size(frame_type, size)
        missing = FRAME_OVERHEAD + size - len(partial)
        partial += memoryview(data)[taken : taken + missing]
        if len(data) - taken < missing:
            return -1
        return taken + missing

    def _read_partial_frame(self, frames: list[Frame]) -> None:
        """Append the now-complete frame held in _partial, copying its payload once, and empty _partial."""
        read: list[tuple[int, int, memoryview]] = []
        with memoryview(self._partial) as view:
            self._read_frames(view, 0, read)
        frame_type, channel, payload_view = read[0]
        frames.append((frame_type, channel, bytes(payload_view)))
        del payload_view, read  # the last views on _partial: it may be resized again
        self._partial.clear()

    def _check_size(self, frame_type: int, size: int) -> None:
        # RabbitMQ lets the payload exceed frame_max - 8 by up to 8 bytes, since clients often get it
        # wrong (rabbit_reader's FRAME_SIZE_FUDGE), but reports frame_max - 8 as the limit.
        if self.frame_max and size > self.frame_max:
            reason = (Atom("frame_too_large"), size, self.frame_max - FRAME_OVERHEAD)
            raise frame_error(reason, frame_type, b"")

    def _read_frames(self, source: bytes | memoryview, offset: int, frames: list[tuple[int, int, Any]]) -> int:
        """Append the complete frames of source from offset on; return the offset of the first incomplete one (their
        payloads are slices of source: bytes, or memoryviews the caller copies)."""
        end = len(source)
        limit = self.frame_max or _NO_LIMIT
        unpack_header = _FRAME_HEADER.unpack_from
        append = frames.append
        while end - offset >= FRAME_HEADER_SIZE:
            frame_type, channel, size = unpack_header(source, offset)
            if size > limit:
                self._check_size(frame_type, size)
            stop = offset + FRAME_HEADER_SIZE + size
            if stop >= end:
                break
            payload = source[offset + FRAME_HEADER_SIZE : stop]
            if source[stop] != FRAME_END:
                raise frame_error((Atom("invalid_frame_end_marker"), source[stop]), frame_type, payload)
            if size < _MIN_PAYLOAD.get(frame_type, _NO_LIMIT) or (size and frame_type == FRAME_HEARTBEAT):
                raise frame_error(Atom("unknown_frame"), frame_type, payload)
            append((frame_type, channel, payload))
            offset = stop + 1
        return offset
