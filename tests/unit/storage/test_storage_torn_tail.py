"""Recovery stops at a torn or corrupt record at the tail, truncates it, and keeps everything before it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from storage.segments import messages_directory, segment_numbers, segment_path
from storage.store import MessageStore
from tests.unit.storage.storage_support import reopen


def write(data_dir: Path, count: int, body_size: int = 10, **options) -> None:
    async def main() -> None:
        store = MessageStore(data_dir, **options)
        store.recover()
        store.append_definition("queue", "q", {"name": "q"})
        for msg_id in range(count):
            store.append_message(msg_id, ("q",), "", "q", b"h", bytes([65 + msg_id % 26]) * body_size)
        store.close()

    asyncio.run(main())


def last_segment(data_dir: Path) -> Path:
    directory = messages_directory(data_dir)
    return segment_path(directory, segment_numbers(directory)[-1])


def ids(recovered) -> list[int]:
    return [message.msg_id for message in recovered.messages.get("q", [])]


def test_garbage_after_the_last_record_is_truncated_with_a_warning(tmp_path, caplog):
    write(tmp_path, 5)
    segment = last_segment(tmp_path)
    intact_size = segment.stat().st_size
    with open(segment, "ab") as file:
        file.write(b"\x07garbage-from-a-torn-write")
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        recovered = reopen(tmp_path)
    assert ids(recovered) == [0, 1, 2, 3, 4]
    assert recovered.report["torn_tail_bytes"] == len(b"\x07garbage-from-a-torn-write")
    assert segment.stat().st_size == intact_size
    assert "truncating" in caplog.text


def test_a_record_cut_short_is_dropped_and_the_log_continues_cleanly(tmp_path):
    write(tmp_path, 5, body_size=100)
    segment = last_segment(tmp_path)
    size = segment.stat().st_size
    with open(segment, "r+b") as file:
        file.truncate(size - 30)
    recovered = reopen(tmp_path)
    assert ids(recovered) == [0, 1, 2, 3]
    assert recovered.report["torn_tail_bytes"] > 0
    assert recovered.next_msg_id == 4

    async def more() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        store.append_message(4, ("q",), "", "q", b"h", b"after")
        store.close()

    asyncio.run(more())
    again = reopen(tmp_path)
    assert ids(again) == [0, 1, 2, 3, 4]
    assert again.report["torn_tail_bytes"] == 0


def test_a_crc_mismatch_in_the_last_record_drops_that_record(tmp_path):
    write(tmp_path, 5, body_size=100)
    segment = last_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    record_size = len(data) // 5  # five records of the same size
    data[-10] ^= 0xFF  # inside the last body: the length still fits, the CRC does not
    segment.write_bytes(bytes(data))
    recovered = reopen(tmp_path)
    assert ids(recovered) == [0, 1, 2, 3]
    assert recovered.report["torn_tail_bytes"] == record_size


def test_a_torn_definitions_log_keeps_the_definitions_before_the_tear(tmp_path):
    write(tmp_path, 1)
    with open(tmp_path / "definitions.log", "ab") as file:
        file.write(b"\xff\xff\x00")
    recovered = reopen(tmp_path)
    assert recovered.queues == [{"name": "q"}]
    assert recovered.report["torn_tail_bytes"] == 3


def test_corruption_inside_an_older_segment_keeps_what_precedes_it_and_reads_later_segments(tmp_path, caplog):
    write(tmp_path, 40, body_size=200, segment_bytes=2000)
    directory = messages_directory(tmp_path)
    numbers = segment_numbers(directory)
    assert len(numbers) >= 3
    first = segment_path(directory, numbers[0])
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="storage.recovery"):
        recovered = reopen(tmp_path)
    assert recovered.report["corrupt_segments"] == 1
    recovered_ids = ids(recovered)
    assert 0 in recovered_ids and 39 in recovered_ids
    assert len(recovered_ids) < 40
    assert recovered_ids == sorted(recovered_ids)
