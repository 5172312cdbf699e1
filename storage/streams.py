"""Stream logs: each stream's messages in append-only segment files of its own, in chunks numbered by offset (the
shape of RabbitMQ's osiris log).

A stream's directory (``streams/<hash of its key>/``) holds segment files named by the offset of their first
message (``00000000000000000000.seg``). A segment is a run of chunks framed as the store's records are
(``[length u32][crc32 u32][payload]``); a chunk's payload is ``CHUNK`` (first offset, timestamp in ms, message
count) followed by its messages (``ENTRY`` lengths, then exchange, routing key, content header and body). Offsets
count up from 0 and are never reused or renumbered; retention drops whole segments from the head.

Appends are kept in memory until the store forms its next batch: then each stream with pending messages turns them
into chunks (at most ``CHUNK_BYTES`` each, a new segment once the current one would outgrow the stream's segment
size), and the writer thread appends them and fdatasyncs their files with the rest of the batch (group commit).
Readers only see chunks once they are durable: an offset a consumer saw is never given to another message after a
crash. A failed batch gives its offsets back to the messages appended after it.

Reading is by chunk: a chunk is read with one ``pread`` (on a worker thread for the broker, so the loop goes on
meanwhile, with the chunks after it, up to ``READ_AHEAD_BYTES``), checked against its CRC and decoded; a few chunks
per stream are kept decoded (``CACHED_BYTES``), the newest ones among them, so consumers that follow the tail read
nothing back. Start-up reads each segment's chunk heads only, and checks every chunk of the newest segment (where a
crash may have torn the last write); damage found later, on a read, skips that chunk with an ERROR line.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import os
import shutil
import struct
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from storage.records import FRAME, FRAME_SIZE, MAX_PAYLOAD
from storage.segments import SEGMENT_SUFFIX, fsync_directory

log = logging.getLogger(__name__)

CHUNK = struct.Struct("<QqI")  # first offset, timestamp (ms since the epoch), message count
ENTRY = struct.Struct("<BBII")  # exchange length, routing key length, content header length, body length
CHUNK_BYTES = 1 << 20  # a chunk is closed once this full (a batch may write several for one stream)
CACHED_BYTES = 8 << 20  # decoded chunks a stream keeps, newest first out of the way last
# A read on a worker thread takes the chunks that follow the one asked for too, in the same pread, up to this many
# bytes: a consumer reading from the past then waits on one read per run of chunks, not per chunk (a publisher's
# small batches make small chunks)
READ_AHEAD_BYTES = 256 << 10

StreamMessage = tuple[str, str, bytes, bytes]  # exchange, routing key, content header payload, body


def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}{SEGMENT_SUFFIX}"


class StreamLog:
    """One stream's log: appends, the chunks that are durable, reads by offset, retention."""

    def __init__(self, directory: Path, max_segment_bytes: int, max_bytes: int | None, max_age_ms: int | None,
                 wake: Callable[[], None]) -> None:
        self.directory = directory
        self.max_segment_bytes = max_segment_bytes  # a segment is closed before a chunk would take it past this
        self.max_bytes = max_bytes  # retention: head segments go while the log is larger (None: no limit)
        self.max_age_ms = max_age_ms  # retention: head segments whose last chunk is older go (None: no limit)
        self._wake = wake  # asks the store for a batch (pending messages are taken then)
        self.segments: list[int] = []  # first offsets of the segment files, oldest first
        self.segment_bytes: list[int] = []  # their durable sizes
        # durable chunks, oldest first, as columns: first offset, segment position, framed size, timestamp
        self.chunk_offsets = array("q")
        self.chunk_positions = array("q")
        self.chunk_sizes = array("q")
        self.chunk_times = array("q")
        self.first_offset = 0  # the oldest offset retention kept
        self.next_offset = 0  # one past the last durable message
        self.total_bytes = 0  # durable bytes in all segments
        self.pending: list[StreamMessage] = []  # appended, not yet handed to the writer
        self._in_flight: list[tuple[int, int, int, int, list[StreamMessage]]] = []  # chunks the writer holds:
        # (first offset, position, framed size, timestamp, messages)
        self._write_offset = 0  # offset the next chunk handed to the writer starts at
        self._write_position = 0  # size of the newest segment once the chunks in flight are written
        self._last_time = 0  # timestamps never go back, so a lookup by time can bisect
        self._cache: OrderedDict[int, list[StreamMessage]] = OrderedDict()  # chunk offset -> messages, LRU
        self._cache_sizes: dict[int, int] = {}
        self._cached_bytes = 0
        self._loading: set[int] = set()  # chunks (by first offset) being read back on a worker thread
        self.on_readable: Callable[[], None] | None = None  # new chunks are durable, or a chunk was read back
        self.unlinks: list[Path] = []  # segments retention let go, removed with the next batch
        self.deleted = False

    # --- appending --------------------------------------------------------------------------------------
    def append(self, exchange: str, routing_key: str, header_payload: bytes, body: bytes) -> None:
        """A message for the log; it is written with the store's next batch and readable once durable."""
        self.pending.append((exchange, routing_key, header_payload, body))
        if len(self.pending) == 1:
            self._wake()

    def take_chunks(self) -> list[tuple[Path, bytes]]:
        """The pending messages as framed chunks for the writer: (segment path, bytes) in order."""
        files: list[tuple[Path, bytes]] = []
        pending, self.pending = self.pending, []
        start = 0
        while start < len(pending):
            stop, size = start, 0
            while stop < len(pending) and (stop == start or size < CHUNK_BYTES):
                _, _, header, body = pending[stop]
                size += len(header) + len(body) + 256
                stop += 1
            files.append(self._chunk(pending[start:stop]))
            start = stop
        return files

    def _chunk(self, messages: list[StreamMessage]) -> tuple[Path, bytes]:
        parts = []
        for exchange, routing_key, header, body in messages:
            exchange_bytes, key_bytes = exchange.encode(), routing_key.encode()
            parts += (ENTRY.pack(len(exchange_bytes), len(key_bytes), len(header), len(body)), exchange_bytes,
                      key_bytes, header, body)
        first = self._write_offset
        self._last_time = stamp = max(self._last_time, int(time.time() * 1000))
        payload = CHUNK.pack(first, stamp, len(messages)) + b"".join(parts)
        data = FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        if not self.segments or (self._write_position and self._write_position + len(data) > self.max_segment_bytes):
            self.segments.append(first)
            self.segment_bytes.append(0)
            self._write_position = 0
        self._in_flight.append((first, self._write_position, len(data), stamp, messages))
        self._write_offset = first + len(messages)
        self._write_position += len(data)
        return self.directory / segment_name(self.segments[-1]), data

    def written(self, ok: bool) -> None:
        """The batch holding the chunks in flight is durable (ok) or was cut back (not ok: their offsets and
        positions are given back; their publishers are told by their own callbacks)."""
        in_flight, self._in_flight = self._in_flight, []
        if self.deleted or not in_flight:
            return
        if not ok:
            self._write_offset = self.next_offset
            while len(self.segments) > 1 and self.segment_bytes[-1] == 0 and self.segments[-1] >= self.next_offset:
                self.segments.pop()  # made for chunks that were not written
                self.segment_bytes.pop()
            self._write_position = self.segment_bytes[-1]
            return
        for first, position, size, stamp, messages in in_flight:
            self._add_chunk(first, position, size, stamp)
            self.segment_bytes[bisect.bisect_right(self.segments, first) - 1] += size
            self.total_bytes += size
            self.next_offset = first + len(messages)
            self._remember(first, messages, size)
        self.apply_retention()
        if self.on_readable is not None:
            self.on_readable()

    def _add_chunk(self, first: int, position: int, size: int, stamp: int) -> None:
        self.chunk_offsets.append(first)
        self.chunk_positions.append(position)
        self.chunk_sizes.append(size)
        self.chunk_times.append(stamp)

    # --- retention ----------------------------------------------------------------------------------------
    def apply_retention(self) -> None:
        """Drop whole head segments (never the newest) while the log is over its size or they are over age."""
        drop = 0
        total = self.total_bytes
        oldest_kept = int(time.time() * 1000) - self.max_age_ms if self.max_age_ms is not None else None
        while drop < len(self.segments) - 1 and self.segments[drop + 1] <= self.next_offset:
            over_size = self.max_bytes is not None and total > self.max_bytes
            over_age = oldest_kept is not None and self._last_time_of(drop) < oldest_kept
            if not (over_size or over_age):
                break
            total -= self.segment_bytes[drop]
            drop += 1
        if drop:
            self._drop_head(drop)

    def _last_time_of(self, segment: int) -> int:
        """Timestamp of the last durable chunk of the segment at that index."""
        end = bisect.bisect_left(self.chunk_offsets, self.segments[segment + 1])
        return self.chunk_times[end - 1] if end else 0

    def _drop_head(self, drop: int) -> None:
        new_first = self.segments[drop]
        chunks = bisect.bisect_left(self.chunk_offsets, new_first)
        for column in (self.chunk_offsets, self.chunk_positions, self.chunk_sizes, self.chunk_times):
            del column[:chunks]
        for first in self.segments[:drop]:
            self.unlinks.append(self.directory / segment_name(first))
        self.total_bytes -= sum(self.segment_bytes[:drop])
        del self.segments[:drop]
        del self.segment_bytes[:drop]
        for offset in [offset for offset in self._cache if offset < new_first]:
            self._forget_cached(offset)
        log.info("stream %s: retention dropped offsets %d to %d", self.directory.name, self.first_offset,
                 new_first - 1)
        self.first_offset = new_first
        self._wake()

    # --- reading ------------------------------------------------------------------------------------------
    def last_chunk_offset(self) -> int:
        """The first offset of the newest durable chunk (RabbitMQ's 'last'), or the end if there is none."""
        return self.chunk_offsets[-1] if self.chunk_offsets else self.next_offset

    def offset_at_time(self, stamp_ms: int) -> int:
        """The first offset of the oldest chunk written at or after stamp_ms (the end if none was)."""
        index = bisect.bisect_left(self.chunk_times, stamp_ms)
        return self.chunk_offsets[index] if index < len(self.chunk_offsets) else self.next_offset

    def read(self, offset: int, limit: int, wait: bool = False) -> tuple[int, list[StreamMessage] | None]:
        """Up to limit durable messages from offset on (from the oldest retained one if offset is older), as
        (offset of the first one, messages); none once offset reaches the end. Damaged chunks are skipped. A chunk
        not in memory is read here, or with wait, on a worker thread: then messages is None, and on_readable is
        called once it can be read."""
        offset = max(offset, self.first_offset)
        while offset < self.next_offset:
            index = bisect.bisect_right(self.chunk_offsets, offset) - 1
            if index < 0:
                index, offset = 0, self.chunk_offsets[0]
            first = self.chunk_offsets[index]
            messages = self._cache.get(first)
            if messages is not None:
                self._cache.move_to_end(first)
            elif wait:
                self._load_later(index)
                return offset, None
            else:
                messages = self._loaded(first, self._chunk_source(index))
            start = offset - first
            if start < len(messages):
                return offset, messages[start:start + limit]
            offset = self.chunk_offsets[index + 1] if index + 1 < len(self.chunk_offsets) else self.next_offset
        return offset, []

    def _chunk_source(self, index: int) -> tuple[Path, int, int, int]:
        """Where chunk index lies: (segment path, position, size, first offset)."""
        first = self.chunk_offsets[index]
        segment = self.segments[bisect.bisect_right(self.segments, first) - 1]
        return self.directory / segment_name(segment), self.chunk_positions[index], self.chunk_sizes[index], first

    def _loaded(self, first: int, source: tuple[Path, int, int, int]) -> list[StreamMessage]:
        try:
            messages = read_chunk(*source)
        except (OSError, ValueError) as error:
            messages = self._unreadable(source, error)
        self._remember(first, messages, source[2])
        return messages

    def _load_later(self, index: int) -> None:
        """Read the chunk, and the ones after it in its segment that are not in memory (READ_AHEAD_BYTES in all),
        on a worker thread (the loop goes on meanwhile); on_readable once they are in memory."""
        source = self._chunk_source(index)
        if source[3] in self._loading:
            return
        path, position, size, _ = source
        sources = [source]
        while index + 1 < len(self.chunk_offsets) and size + self.chunk_sizes[index + 1] <= READ_AHEAD_BYTES:
            index += 1
            first = self.chunk_offsets[index]
            if (self.chunk_positions[index] != position + size  # (the next segment's first chunk)
                    or first in self._cache or first in self._loading):
                break
            sources.append((path, self.chunk_positions[index], self.chunk_sizes[index], first))
            size += self.chunk_sizes[index]
        self._loading.update(source[3] for source in sources)
        future = asyncio.get_running_loop().run_in_executor(None, read_chunks, path, position, size, sources)
        future.add_done_callback(lambda done: self._chunks_read(sources, done))

    def _chunks_read(self, sources: list[tuple[Path, int, int, int]], done: asyncio.Future) -> None:
        error = done.exception()
        decoded = done.result() if error is None else [error] * len(sources)
        for source, messages in zip(sources, decoded):
            first = source[3]
            self._loading.discard(first)
            if self.deleted or first < self.first_offset:
                continue  # retention or deletion dropped it meanwhile
            if isinstance(messages, BaseException):
                messages = self._unreadable(source, messages)
            self._remember(first, messages, source[2])
        if self.on_readable is not None:
            self.on_readable()

    def _unreadable(self, source: tuple[Path, int, int, int], error: BaseException) -> list[StreamMessage]:
        """A chunk that cannot be read back: logged, and its messages skipped (no messages stand for it)."""
        log.error("stream %s: chunk at offset %d of segment %s cannot be read (%s): its messages are skipped",
                  self.directory.name, source[3], source[0].name, error)
        return []

    def _remember(self, first: int, messages: list[StreamMessage], size: int) -> None:
        self._cache[first] = messages
        self._cache_sizes[first] = size
        self._cached_bytes += size
        while self._cached_bytes > CACHED_BYTES and len(self._cache) > 1:
            self._forget_cached(next(iter(self._cache)))

    def _forget_cached(self, first: int) -> None:
        del self._cache[first]
        self._cached_bytes -= self._cache_sizes.pop(first)

    def close(self) -> None:
        self._cache.clear()
        self._cache_sizes.clear()
        self._cached_bytes = 0

    # --- start-up -----------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read back what the directory holds: every chunk head, the newest segment checked whole (a torn or
        damaged tail there is cut off with a WARNING)."""
        numbers = sorted(int(path.stem) for path in self.directory.glob(f"*{SEGMENT_SUFFIX}") if path.stem.isdigit())
        for number in numbers:
            path = self.directory / segment_name(number)
            newest = number == numbers[-1]
            size = path.stat().st_size
            end = self._load_segment(path, number, newest)
            if end < size and path.exists():
                if newest:
                    log.warning("stream %s: segment %s ends with %d bytes of a write a crash cut short (or damaged): "
                                "cut off", self.directory.name, path.name, size - end)
                    with open(path, "r+b") as file:
                        file.truncate(end)
                        os.fsync(file.fileno())
                else:
                    log.error("stream %s: segment %s is damaged from byte %d on: the %d bytes after it are skipped",
                              self.directory.name, path.name, end, size - end)
        self.first_offset = self.chunk_offsets[0] if self.chunk_offsets else self.next_offset
        self._write_offset = self.next_offset
        self._write_position = self.segment_bytes[-1] if self.segments else 0
        self._last_time = self.chunk_times[-1] if self.chunk_times else 0

    def _load_segment(self, path: Path, number: int, check_all: bool) -> int:
        """Index the segment's chunks; returns where its intact part ends."""
        self.next_offset = expected = max(number, self.next_offset)  # a segment is named by its first offset
        position = 0
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            while (head := _chunk_head(file, position, size, expected)) is not None:
                length, crc, first, stamp, messages = head
                end = position + FRAME_SIZE + length
                expected = self.next_offset = first + messages
                if check_all and not _crc_matches(file, position, length, crc):
                    if not _chunk_follows(file, end, size, expected):
                        self.next_offset = first  # a torn last write: cut off from here
                        break
                    log.error("stream %s: chunk at offset %d of segment %s is damaged (checksum mismatch): its %d "
                              "messages are skipped", self.directory.name, first, path.name, messages)
                else:
                    self._add_chunk(first, position, end - position, stamp)
                position = end
        if position or not self.segments:
            self.segments.append(number)
            self.segment_bytes.append(position)
            self.total_bytes += position
        elif check_all:
            path.unlink()  # made for a write that never reached it
        return position


def _crc_matches(file, position: int, length: int, crc: int) -> bool:
    file.seek(position + FRAME_SIZE)
    return zlib.crc32(file.read(length)) == crc


def _chunk_head(file, position: int, size: int, expected: int) -> tuple[int, int, int, int, int] | None:
    """(length, crc, first offset, timestamp, count) of a plausible chunk head at position (one that fits in the
    file and starts at offset expected or later), else None."""
    if position + FRAME_SIZE + CHUNK.size > size:
        return None
    file.seek(position)
    head = file.read(FRAME_SIZE + CHUNK.size)
    length, crc = FRAME.unpack_from(head)
    first, stamp, messages = CHUNK.unpack_from(head, FRAME_SIZE)
    if length < CHUNK.size or length > MAX_PAYLOAD or position + FRAME_SIZE + length > size or first < expected \
            or messages == 0:
        return None
    return length, crc, first, stamp, messages


def _chunk_follows(file, position: int, size: int, expected: int) -> bool:
    """Whether an intact chunk of offset expected or later starts at position (then the damage before it is a bit
    flip in a chunk that was written whole, not a torn last write)."""
    head = _chunk_head(file, position, size, expected)
    return head is not None and _crc_matches(file, position, head[0], head[1])


def read_chunk(path: Path, position: int, size: int, first: int) -> list[StreamMessage]:
    """The messages of the chunk at position in the segment at path (on any thread: the file is opened for this
    read, so retention may remove it meanwhile)."""
    (messages,) = read_chunks(path, position, size, [(path, position, size, first)])
    if isinstance(messages, BaseException):
        raise messages
    return messages


def read_chunks(path: Path, position: int, size: int, sources: list[tuple[Path, int, int, int]]
                ) -> list[list[StreamMessage] | BaseException]:
    """The messages of consecutive chunks of one segment (sources, as read_chunk's arguments), read with one pread
    from position: each chunk's messages, or the error that makes that chunk unreadable (on any thread)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = memoryview(os.pread(fd, size, position))
    finally:
        os.close(fd)
    decoded: list[list[StreamMessage] | BaseException] = []
    for _, chunk_position, chunk_size, first in sources:
        start = chunk_position - position
        try:
            decoded.append(decode_chunk(data[start:start + chunk_size], first))
        except ValueError as error:
            decoded.append(error)
    return decoded


def decode_chunk(data: bytes | memoryview, first: int) -> list[StreamMessage]:
    """The messages of one framed chunk; ValueError if it is not the intact chunk starting at first."""
    if len(data) < FRAME_SIZE + CHUNK.size:
        raise ValueError("short read")
    length, crc = FRAME.unpack_from(data)
    view = memoryview(data)[FRAME_SIZE:FRAME_SIZE + length]
    if len(view) != length or zlib.crc32(view) != crc:
        raise ValueError("checksum mismatch")
    chunk_first, _, number = CHUNK.unpack_from(view)
    if chunk_first != first:
        raise ValueError(f"chunk of offset {chunk_first} where {first} was expected")
    messages = []
    position = CHUNK.size
    unpack = ENTRY.unpack_from
    for _ in range(number):
        exchange_size, key_size, header_size, body_size = unpack(view, position)
        position += ENTRY.size
        exchange = str(view[position:position + exchange_size], "utf-8")
        position += exchange_size
        routing_key = str(view[position:position + key_size], "utf-8")
        position += key_size
        header = bytes(view[position:position + header_size])
        position += header_size
        body = bytes(view[position:position + body_size])
        position += body_size
        messages.append((exchange, routing_key, header, body))
    if position != length:
        raise ValueError("chunk length does not match its messages")
    return messages


class StreamLogs:
    """The stream logs of one data dir, handed to the store's batches."""

    def __init__(self, directory: Path, wake: Callable[[], None]) -> None:
        self.directory = directory  # data_dir/streams
        self._wake = wake
        self.logs: dict[str, StreamLog] = {}  # stream key -> its log
        self._waiting: set[StreamLog] = set()  # logs with pending messages
        # directories of deleted streams (or left by an earlier stream of a name declared anew): the writer removes
        # them with the next batch, before it appends that batch's chunks, so a stream's files never mix with those
        # of one of the same name before it
        self._resets: list[Path] = []
        self._retention_unlinks: list[Path] = []  # segments whose removal failed with a batch, tried again

    def path_of(self, key: str) -> Path:
        return self.directory / hashlib.sha256(key.encode()).hexdigest()[:32]

    def open(self, key: str, max_segment_bytes: int, max_bytes: int | None, max_age_ms: int | None,
             fresh: bool) -> StreamLog:
        """The log of a stream: read back from disk (fresh False, at start-up) or made anew (fresh: a new
        declaration; anything a deleted stream of that name left behind goes first)."""
        path = self.path_of(key)
        stream = StreamLog(path, max_segment_bytes, max_bytes, max_age_ms, lambda: self._ready(stream))
        if fresh:
            self._resets.append(path)
            self._wake()
        elif path.exists():
            stream.load()
            stream.apply_retention()
        self.logs[key] = stream
        return stream

    def rename(self, key: str, new_key: str) -> bool:
        """At start-up, before either is opened: the log of the stream named key becomes new_key's (its directory
        renamed, durably; one new_key's name already had, which no stream owns, goes first). False if key has
        none."""
        source, target = self.path_of(key), self.path_of(new_key)
        if not source.exists():
            return False
        shutil.rmtree(target, ignore_errors=True)
        os.rename(source, target)
        fsync_directory(self.directory)
        return True

    def _ready(self, stream: StreamLog) -> None:
        self._waiting.add(stream)
        self._wake()

    def delete(self, key: str) -> None:
        """The stream is gone: its messages not yet handed to the writer are dropped, its directory is removed with
        the next batch (after the chunks of the batch being written, if any)."""
        stream = self.logs.pop(key, None)
        if stream is None:
            return
        stream.deleted = True
        stream.close()
        self._waiting.discard(stream)
        self._resets.append(stream.directory)
        self._wake()

    def remove_orphans(self) -> None:
        """At start-up, once every stream is open: directories no stream owns (deleted ones) are removed."""
        if not self.directory.exists():
            return
        owned = {stream.directory for stream in self.logs.values()}
        for path in self.directory.iterdir():
            if path not in owned:
                shutil.rmtree(path, ignore_errors=True)

    def take(self) -> tuple[list[Path], list[tuple[Path, bytes]], list[Path], list[StreamLog]]:
        """What the next batch does for streams: directories to remove first, chunk appends, segments retention let
        go (removed once the batch is durable), and the logs to tell."""
        files: list[tuple[Path, bytes]] = []
        unlinks, self._retention_unlinks = self._retention_unlinks, []
        resets, self._resets = self._resets, []
        written = []
        for stream in self._waiting:
            if stream.pending:
                files += stream.take_chunks()
                written.append(stream)
            unlinks += stream.unlinks
            stream.unlinks = []
        self._waiting = set()
        return resets, files, unlinks, written

    def retry(self, resets: list[Path], unlinks: list[Path]) -> None:
        """The batch that was to remove these failed: the next one tries again."""
        if resets or unlinks:
            self._resets[:0] = resets
            self._retention_unlinks += unlinks
            self._wake()

    def has_work(self) -> bool:
        return bool(self._waiting or self._resets or self._retention_unlinks)
