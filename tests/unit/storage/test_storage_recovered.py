"""Recovered messages are kept as columns and read back from their segments in runs (storage.recovered_messages): what comes
back is exactly what was stored, however the records lie, and the index recovery builds on the way is the same as
one built record by record."""

from __future__ import annotations

import asyncio
import logging
import struct

from storage import records
from storage.store import MessageStore
from tests.unit.storage.storage_support import durable, reopen, run
from tests.unit.storage.test_storage_compaction import SMALL as COMPACTING, disk_bytes, settle

SMALL_SEGMENTS = {"segment_bytes": 4096}  # many segments, so runs and removals cross their boundaries


async def settle_until(store: MessageStore, done, rounds: int = 500) -> None:
    """Let batches and compactions go on until done() holds (at most rounds batches: the caller asserts it)."""
    for _ in range(rounds):
        if done():
            return
        await settle(store)


def header(delivery_mode: int | None, body_size: int = 0, content_type: str = "", headers_table: bytes = b"") -> bytes:
    """A content header payload with the properties asked for (class 60)."""
    flags, properties = 0, b""
    if content_type:
        flags |= 0x8000
        properties += bytes([len(content_type)]) + content_type.encode()
    if headers_table:
        flags |= 0x2000
        properties += struct.pack(">I", len(headers_table)) + headers_table
    if delivery_mode is not None:
        flags |= 0x1000
        properties += bytes([delivery_mode])
    return struct.pack(">HHQH", 60, 0, body_size, flags) + properties


def test_a_content_header_says_whether_its_message_is_persistent():
    table = b"\x01kS\x00\x00\x00\x02v2"  # {"k": "v2"}: a table whose bytes hold a 2 where a mode could be misread
    assert records.is_persistent(header(2))
    assert records.is_persistent(header(2, content_type="text/plain", headers_table=table))
    assert not records.is_persistent(header(1, content_type="text/plain", headers_table=table))
    assert not records.is_persistent(header(None, headers_table=table))
    assert not records.is_persistent(b"\x00\x3c")  # too short to hold flags: not persistent, no error


def test_messages_come_back_exactly_however_their_records_lie(tmp_path):
    """Runs of one queue's publishes broken by gaps in the ids, other queues' publishes, a changed routing key,
    publishes to two queues, deliveries and removals (some in later segments) all come back as stored, and the
    index agrees: removing every message afterwards leaves nothing live and deletes the segments."""
    expected: dict[str, dict[int, list]] = {"a": {}, "b": {}}  # queue -> id -> [routing key, body, redelivered]

    def work(store):
        msg_id = 0
        for block in range(12):
            for _ in range(25):
                msg_id += 1 + (block % 3 == 2 and msg_id % 7 == 0)  # now and then an id is skipped
                queues = ("a", "b") if msg_id % 50 == 0 else ("b",) if block % 4 == 3 else ("a",)
                key = f"key-{block // 2}"
                body = b"m%d" % msg_id * (1 + msg_id % 5)
                store.append_message(msg_id, queues, "ex", key, header(2, len(body)), body)
                for queue in queues:
                    expected[queue][msg_id] = [key, body, False]
            delivered = [i for i in expected["a"] if i % 3 == 0 and not expected["a"][i][2]]
            store.append_delivered("a", delivered)
            for i in delivered:
                expected["a"][i][2] = True
            removed = [i for i in list(expected["a"]) if i % 4 == 1][:5]
            store.append_removed("a", removed)
            for i in removed:
                del expected["a"][i]

    run(tmp_path, work, **SMALL_SEGMENTS)
    recovered = reopen(tmp_path, **SMALL_SEGMENTS)
    for queue in ("a", "b"):
        assert [(m.msg_id, m.routing_key, m.body, m.redelivered) for m in recovered.messages[queue]] == [
            (msg_id, *fields) for msg_id, fields in expected[queue].items()]

    async def remove_everything() -> dict:
        store = MessageStore(tmp_path, **SMALL_SEGMENTS)
        again = store.recover()
        assert store.stats()["live_messages"] == sum(len(messages) for messages in expected.values())
        for queue, stored in again.messages.items():
            store.append_removed(queue, list(stored.ids))
        assert await durable(store)
        store.append_removed("a", [])  # one more batch, for the housekeeping of the last one
        assert await durable(store)
        stats = store.stats()
        store.close()
        return stats

    stats = asyncio.run(remove_everything())
    assert stats["live_messages"] == 0
    assert stats["segments"] <= 2  # the spent ones were deleted
    assert reopen(tmp_path, **SMALL_SEGMENTS).messages == {}


def test_runs_count_bodies_and_persistent_messages(tmp_path):
    def work(store):
        for msg_id in range(100):
            mode = 1 if msg_id % 10 == 3 else 2  # a quorum queue stores transient messages too
            store.append_message(msg_id, ("q",), "", "q", header(mode, 100), bytes(100))

    run(tmp_path, work, **SMALL_SEGMENTS)
    stored = reopen(tmp_path, **SMALL_SEGMENTS).messages["q"]
    runs = list(stored.runs(10, max_bytes=1000))
    assert sum(len(run) for run in runs) == 90
    assert all(len(run) <= 1000 // 100 for run in runs)  # a run spans at most max_bytes of its segment
    assert sum(run.body_bytes for run in runs) == 9000
    assert sum(run.persistent for run in runs) == 81  # 13, 23, ... 93 are transient
    assert sum(run.persistent_bytes for run in runs) == 8100
    assert [m.msg_id for run in runs for m in run.read()] == list(range(10, 100))
    counted = list(stored.runs(10, max_bytes=1 << 20, max_messages=25))
    assert max(len(run) for run in counted) == 25  # (the segments' ends cut the others shorter)
    assert [m.msg_id for run in counted for m in run.read()] == list(range(10, 100))


def test_a_record_that_is_not_the_expected_publish_when_read_back_is_left_out_and_named_in_an_error(tmp_path, caplog):
    run(tmp_path, lambda store: [store.append_message(i, ("q",), "", "q", b"h", b"body-%d" % i) for i in range(5)])
    stored = reopen(tmp_path).messages["q"]
    segment = next((tmp_path / "messages").glob("*.seg"))
    data = segment.read_bytes()
    second, third = (data.index(struct.pack("<BQ", records.PUBLISH, msg_id)) for msg_id in (2, 3))
    with open(segment, "r+b") as file:  # since the start, message 2's id became 7 and message 3's type byte 0
        file.seek(second + 1)
        file.write(struct.pack("<Q", 7))
        file.seek(third)
        file.write(b"\x00")
    with caplog.at_level(logging.ERROR, logger="storage.recovered_messages"):
        assert [m.body for m in stored] == [b"body-0", b"body-1", b"body-4"]
    assert caplog.messages == [
        f"{segment} no longer holds 2 of the 5 recovered messages a queue read back from it (message 7 at offset "
        f"{second - records.FRAME_SIZE} where message 2 was; no publish record at offset {third - records.FRAME_SIZE},"
        f" where message 3 was): they are left out"]


def test_a_segment_cut_short_since_the_start_costs_the_messages_it_lost_and_one_error_line(tmp_path, caplog):
    run(tmp_path, lambda store: [store.append_message(i, ("q",), "", "q", b"h", b"body-%d" % i) for i in range(50)])
    stored = reopen(tmp_path).messages["q"]
    segment = next((tmp_path / "messages").glob("*.seg"))
    data = segment.read_bytes()
    segment.write_bytes(data[:data.index(b"body-10") + 7])  # messages 0..10 are intact, 11..49 are gone
    with caplog.at_level(logging.ERROR, logger="storage.recovered_messages"):
        assert [m.body for m in stored] == [b"body-%d" % i for i in range(11)]
    assert len(caplog.messages) == 1 and "no longer holds 39 of the 50 recovered messages" in caplog.messages[0]


def test_a_segment_is_not_compacted_while_recovered_messages_in_it_wait_to_be_read_back(tmp_path):
    """Compaction would move the records a queue has yet to page in: a segment waits until they are read."""
    async def main() -> tuple[int, int, list[bytes]]:
        store = MessageStore(tmp_path, **COMPACTING)
        recovered = store.recover()
        waiting = recovered.messages["deep"]
        other = [message.msg_id for message in recovered.messages["other"]]  # read back at once
        store.append_removed("other", other)  # most of every segment dies
        for _ in range(3):
            await settle(store)
        before = disk_bytes(tmp_path)
        bodies = [message.body for message in waiting]  # read back (and released)
        await settle_until(store, lambda: disk_bytes(tmp_path) < before / 2)
        after = disk_bytes(tmp_path)
        store.close()
        return before, after, bodies

    def work(store):
        for msg_id in range(3000):
            store.append_message(msg_id, ("deep",) if msg_id % 5 == 0 else ("other",), "", "", b"h", b"%05d" % msg_id)

    run(tmp_path, work, **COMPACTING)
    before, after, bodies = asyncio.run(main())
    assert bodies == [b"%05d" % msg_id for msg_id in range(0, 3000, 5)]
    assert after < before / 2  # compacted once read


def test_the_messages_after_a_damaged_record_are_read_from_where_the_repair_moved_them(tmp_path, caplog):
    run(tmp_path, lambda store: [store.append_message(i, ("q",), "", "q", b"h", b"body-%d" % i) for i in range(9)])
    segment = next((tmp_path / "messages").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[data.index(b"body-3")] ^= 0xFF  # corruption in the middle of the segment: the repair rewrites it
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="storage.recovery"):
        stored = reopen(tmp_path).messages["q"]
    assert "corrupt record" in caplog.text
    assert len(segment.read_bytes()) < len(data)
    assert [m.body for m in stored] == [b"body-%d" % i for i in range(9) if i != 3]


def test_runs_of_compacted_records_come_back_redelivered_and_a_deleted_queue_frees_their_segments(tmp_path):
    """A compacted segment's publishes carry their delivered flags: runs of them come back redelivered; deleting
    their queue after the restart lets every such segment go (the index counted the runs' messages per queue)."""
    kept = [msg_id for msg_id in range(2000) if msg_id // 50 % 3 == 0]  # blocks of 50 consecutive ids

    async def deliver_all_and_remove_half() -> None:
        store = MessageStore(tmp_path, **COMPACTING)
        store.recover()
        for msg_id in range(2000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"w" * 200)
        store.append_delivered("q", range(2000))
        await durable(store)
        store.append_removed("q", sorted(set(range(2000)) - set(kept)))
        await settle_until(store, lambda: disk_bytes(tmp_path) < 2000 * 230 // 2)  # once the segments are compacted
        store.close()

    asyncio.run(deliver_all_and_remove_half())
    recovered = reopen(tmp_path, **COMPACTING)
    assert [(m.msg_id, m.redelivered) for m in recovered.messages["q"]] == [(msg_id, True) for msg_id in kept]
    assert disk_bytes(tmp_path) < 2000 * 230 // 2  # the segments were compacted

    async def delete_the_queue() -> dict:
        store = MessageStore(tmp_path, **COMPACTING)
        store.recover()
        store.delete_queue("q")
        await settle(store)
        stats = store.stats()
        store.close()
        return stats

    stats = asyncio.run(delete_the_queue())
    assert (stats["live_messages"], stats["segments"]) == (0, 1)  # only the head segment is left


def test_deleting_a_queue_that_never_read_its_recovered_messages_back_lets_their_segments_be_compacted(tmp_path):
    def work(store):
        for msg_id in range(3000):
            store.append_message(msg_id, ("deep",) if msg_id % 3 == 0 else ("other",), "", "", b"h", b"%05d" % msg_id)

    async def main() -> tuple[int, int]:
        store = MessageStore(tmp_path, **COMPACTING)
        recovered = store.recover()
        other = [message.msg_id for message in recovered.messages["other"]]  # read back at once
        store.append_removed("other", other[: len(other) // 2])  # a third of every segment dies
        for _ in range(3):
            await settle(store)
        before = disk_bytes(tmp_path)
        store.delete_queue("deep")  # its messages were never read back: another third dies
        await settle_until(store, lambda: disk_bytes(tmp_path) < before * 0.6)
        after = disk_bytes(tmp_path)
        store.close()
        return before, after

    run(tmp_path, work, **COMPACTING)
    before, after = asyncio.run(main())
    assert after < before * 0.6  # compacted: the deleted queue's pins went with it
