"""A stream's own log (storage.streams): offsets from 0 that readers see once durable, chunk and segment files that
come back after a restart or a torn write, retention by size and age that drops whole head segments without ever
renumbering, and deletion."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from storage.store import MessageStore
from storage.streams import StreamLog
from tests.unit.storage.storage_support import durable

KEY = "/|events"
NO_LIMITS = {"max_segment_bytes": 500_000_000, "max_bytes": None, "max_age_ms": None}


def body(number: int) -> bytes:
    return f"message {number}".encode()


async def open_store(data_dir: Path) -> MessageStore:
    store = MessageStore(data_dir)
    store.recover()
    return store


def in_store(data_dir: Path, work, fresh: bool = False, **limits):
    """Open the store and the stream's log, run ``async work(store, log)``, close; returns what work returned."""

    async def main():
        store = await open_store(data_dir)
        log = store.streams.open(KEY, fresh=fresh, **{**NO_LIMITS, **limits})
        try:
            return await work(store, log)
        finally:
            store.close()

    return asyncio.run(main())


def append(log: StreamLog, numbers) -> None:
    for number in numbers:
        log.append("amq.direct", "key", b"header", body(number))


async def write_chunks(store: MessageStore, log: StreamLog, count: int) -> None:
    """Offsets 0 to count - 1 in chunks of ten: each made durable before the next is appended."""
    for start in range(0, count, 10):
        append(log, range(start, start + 10))
        assert await durable(store)


def bodies(log: StreamLog, offset: int = 0, limit: int = 1 << 30) -> tuple[int, list[bytes]]:
    first, messages = log.read(offset, limit)
    return first, [message[3] for message in messages]


def read_all(log: StreamLog, offset: int = 0) -> list[tuple[int, bytes]]:
    """(offset, body) of every durable message from offset on, reading chunk by chunk as consumers do."""
    found = []
    while True:
        first, messages = log.read(offset, 1 << 30)
        if not messages:
            return found
        found += [(first + index, message[3]) for index, message in enumerate(messages)]
        offset = first + len(messages)


def test_messages_are_readable_by_offset_only_once_durable(tmp_path):
    async def work(store, log):
        append(log, range(3))
        assert log.read(0, 10) == (0, [])  # not written yet
        assert await durable(store)
        assert bodies(log) == (0, [body(0), body(1), body(2)])
        assert bodies(log, 1, 1) == (1, [body(1)])
        append(log, range(3, 5))
        assert await durable(store)
        assert (log.first_offset, log.next_offset) == (0, 5)
        assert log.last_chunk_offset() == 3  # the chunk the second batch wrote
        assert read_all(log, 2) == [(n, body(n)) for n in range(2, 5)]
        assert log.read(5, 10) == (5, [])

    in_store(tmp_path, work, fresh=True)


def test_a_restart_reads_the_log_back_with_the_same_offsets_and_goes_on_from_its_end(tmp_path):
    async def write(store, log):
        append(log, range(100))
        assert await durable(store)
        append(log, range(100, 150))
        assert await durable(store)

    async def reread(store, log):
        assert (log.first_offset, log.next_offset, log.last_chunk_offset()) == (0, 150, 100)
        assert read_all(log) == [(n, body(n)) for n in range(150)]
        append(log, [150])
        assert await durable(store)
        return read_all(log, 149)

    in_store(tmp_path, write, fresh=True)
    assert in_store(tmp_path, reread) == [(149, body(149)), (150, body(150))]


def test_a_torn_last_write_is_cut_off_and_its_offsets_are_given_to_the_next_messages(tmp_path, caplog):
    async def write(store, log):
        append(log, range(10))
        assert await durable(store)
        append(log, range(10, 20))
        assert await durable(store)
        return log.directory

    directory = in_store(tmp_path, write, fresh=True)
    segment = next(directory.glob("*.seg"))
    with open(segment, "r+b") as file:  # the second chunk loses its last bytes, as a crash mid-write leaves it
        file.truncate(os.path.getsize(segment) - 5)

    async def reread(store, log):
        assert log.next_offset == 10
        append(log, ["again"])
        assert await durable(store)
        return read_all(log)

    with caplog.at_level(logging.WARNING, logger="storage.streams"):
        assert in_store(tmp_path, reread) == [*((n, body(n)) for n in range(10)), (10, body("again"))]
    assert "cut off" in caplog.text


def test_a_damaged_chunk_in_an_older_segment_is_skipped_with_an_error_and_the_rest_is_read(tmp_path, caplog):
    async def write(store, log):
        await write_chunks(store, log, 40)
        return log.directory

    directory = in_store(tmp_path, write, fresh=True, max_segment_bytes=300)
    oldest = sorted(directory.glob("*.seg"))[0]
    data = bytearray(oldest.read_bytes())
    data[-3] ^= 0xFF  # a bit flip in the body of the oldest segment's last message
    oldest.write_bytes(bytes(data))

    async def reread(store, log):
        return [offset for offset, _ in read_all(log)]

    with caplog.at_level(logging.ERROR, logger="storage.streams"):
        offsets = in_store(tmp_path, reread, max_segment_bytes=300)
    assert offsets == list(range(10, 40))  # the damaged chunk held offsets 0-9
    assert "checksum mismatch" in caplog.text


def test_retention_by_size_drops_whole_head_segments_and_never_renumbers(tmp_path):
    async def work(store, log):
        await write_chunks(store, log, 100)
        assert len(log.segments) > 1
        assert log.total_bytes <= 1000 + max(log.segment_bytes)
        first = log.first_offset
        assert first > 0 and first == log.segments[0]
        assert read_all(log, 0) == [(n, body(n)) for n in range(first, 100)]  # from the oldest kept one
        await durable(store)  # the batch that removes the dropped segments
        on_disk = sorted(int(path.stem) for path in log.directory.glob("*.seg"))
        assert on_disk == log.segments
        return first

    first = in_store(tmp_path, work, fresh=True, max_segment_bytes=300, max_bytes=1000)

    async def reread(store, log):
        return log.first_offset, log.next_offset

    assert in_store(tmp_path, reread, max_segment_bytes=300, max_bytes=1000) == (first, 100)


def test_retention_by_age_drops_segments_whose_newest_chunk_is_older(tmp_path):
    async def work(store, log):
        append(log, range(10))
        assert await durable(store)
        log.chunk_times[0] -= 10_000  # written ten seconds ago
        append(log, range(10, 20))
        assert await durable(store)
        return log.first_offset, read_all(log)[0]

    assert in_store(tmp_path, work, fresh=True, max_segment_bytes=100, max_age_ms=5_000) == (10, (10, body(10)))


def test_a_timestamp_finds_the_oldest_chunk_written_at_or_after_it(tmp_path):
    async def work(store, log):
        append(log, range(5))
        assert await durable(store)
        between = int(time.time() * 1000) + 1
        log.chunk_times[0] -= 2  # written before `between` for sure
        append(log, range(5, 8))
        assert await durable(store)
        log.chunk_times[1] = max(log.chunk_times[1], between)
        return log.offset_at_time(0), log.offset_at_time(between), log.offset_at_time(between + 60_000)

    assert in_store(tmp_path, work, fresh=True) == (0, 5, 8)


def test_a_deleted_stream_leaves_nothing_and_a_new_one_of_its_name_starts_at_zero(tmp_path):
    async def work(store, log):
        append(log, range(5))
        assert await durable(store)
        store.streams.delete(KEY)
        assert await durable(store)
        assert not log.directory.exists()
        assert not any((tmp_path / "streams").iterdir())
        again = store.streams.open(KEY, fresh=True, **NO_LIMITS)
        append(again, ["new"])
        assert await durable(store)
        return read_all(again)

    assert in_store(tmp_path, work, fresh=True) == [(0, body("new"))]


def test_directories_no_stream_owns_are_removed_at_start_up(tmp_path):
    async def work(store, log):
        append(log, range(5))
        assert await durable(store)

    in_store(tmp_path, work, fresh=True)

    async def start_without_it():
        store = await open_store(tmp_path)
        store.streams.remove_orphans()
        store.close()

    asyncio.run(start_without_it())
    assert not any((tmp_path / "streams").iterdir())


def test_a_failed_write_gives_its_offsets_back(tmp_path):
    async def work(store, log):
        append(log, range(3))
        assert await durable(store)
        append(log, ["lost"])
        store._writer.failed = True  # the batch cannot be written
        assert await durable(store) is False
        store._writer.failed = False
        append(log, ["kept"])
        assert await durable(store)
        return read_all(log)

    assert in_store(tmp_path, work, fresh=True) == [*((n, body(n)) for n in range(3)), (3, body("kept"))]


def test_a_stream_deleted_and_declared_again_while_a_batch_is_written_keeps_only_its_own_messages(tmp_path):
    async def work(store, log):
        append(log, range(5))
        written = asyncio.get_running_loop().create_future()
        store.when_durable(written.set_result)
        await asyncio.sleep(0)  # the batch with those five goes to the writer
        assert store._in_flight is not None
        store.streams.delete(KEY)
        again = store.streams.open(KEY, fresh=True, **NO_LIMITS)
        append(again, ["new"])
        assert await written
        assert await durable(store)
        return read_all(again)

    assert in_store(tmp_path, work, fresh=True) == [(0, body("new"))]

    async def reread(store, log):
        return read_all(log)

    assert in_store(tmp_path, reread) == [(0, body("new"))]


def test_a_bit_flip_in_the_newest_segment_loses_that_chunk_only(tmp_path, caplog):
    async def write(store, log):
        await write_chunks(store, log, 30)
        return log.directory, [log.chunk_positions[1], log.chunk_sizes[1]]

    directory, (position, size) = in_store(tmp_path, write, fresh=True)
    segment = next(directory.glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[position + size - 2] ^= 0x01  # the middle chunk's last body byte
    segment.write_bytes(bytes(data))

    async def reread(store, log):
        append(log, ["after"])
        assert await durable(store)
        return [offset for offset, _ in read_all(log)]

    with caplog.at_level(logging.ERROR, logger="storage.streams"):
        offsets = in_store(tmp_path, reread)
    assert offsets == [*range(10), *range(20, 31)]  # offsets 10-19 were in the damaged chunk; 30 comes after
    assert "chunk at offset 10" in caplog.text and "damaged" in caplog.text


def test_a_chunk_not_in_memory_is_read_on_a_worker_thread_and_the_log_says_when(tmp_path):
    async def write(store, log):
        await write_chunks(store, log, 30)

    in_store(tmp_path, write, fresh=True)

    async def reread(store, log):  # a fresh start: nothing in memory
        readable = asyncio.Event()
        log.on_readable = readable.set
        assert log.read(12, 5, wait=True) == (12, None)
        await asyncio.wait_for(readable.wait(), 10)
        first, messages = log.read(12, 5, wait=True)
        return first, [message[3] for message in messages]

    assert in_store(tmp_path, reread) == (12, [body(n) for n in range(12, 17)])


def test_one_read_on_a_worker_thread_brings_the_chunks_that_follow_in_the_segment_and_skips_a_damaged_one(
        tmp_path, caplog):
    async def write(store, log):
        await write_chunks(store, log, 50)  # chunks of ten: 0, 10 and 20 in the first segment, 30 and 40 in the next
        return log.directory

    directory = in_store(tmp_path, write, fresh=True, max_segment_bytes=1300)
    oldest = sorted(directory.glob("*.seg"))[0]
    data = bytearray(oldest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # in the chunk of offsets 10-19
    oldest.write_bytes(bytes(data))

    async def reread(store, log):  # a fresh start: nothing in memory
        readable = asyncio.Event()
        log.on_readable = readable.set
        assert log.read(0, 5, wait=True) == (0, None)
        await asyncio.wait_for(readable.wait(), 10)
        found = []
        offset = 0
        while (read := log.read(offset, 1 << 30, wait=True))[1]:  # no other wait: that one read brought them all
            found += range(read[0], read[0] + len(read[1]))
            offset = read[0] + len(read[1])
        return found, read

    with caplog.at_level(logging.ERROR, logger="storage.streams"):
        found, stopped_at = in_store(tmp_path, reread, max_segment_bytes=1300)
    assert found == [*range(10), *range(20, 30)]
    assert stopped_at == (30, None)  # the next segment is another read
    assert "chunk at offset 10" in caplog.text
