"""Spent segments are deleted and mostly-dead ones compacted, so disk use follows what is queued."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

from storage import records
from storage.compaction import Compaction
from storage.segments import messages_directory
from storage.store import MessageStore
from tests.unit.storage.storage_support import durable, reopen

SMALL = {"segment_bytes": 64 * 1024, "min_compact_bytes": 8 * 1024}


async def settle(store: MessageStore) -> None:
    """Flush until compactions queued by earlier batches have finished and been acted upon."""
    for _ in range(20):
        await durable(store)
        if not store.stats()["compactions_running"]:
            break
        await asyncio.to_thread(lambda: None)  # give the writer thread its turn
    await durable(store)


def disk_bytes(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in messages_directory(data_dir).iterdir())


def test_steady_publish_and_consume_keeps_disk_use_flat(tmp_path):
    samples: list[int] = []

    async def main() -> int:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        backlog: list[int] = []
        for msg_id in range(20_000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"x" * 200)
            backlog.append(msg_id)
            if len(backlog) > 500:  # a consumer 500 messages behind
                store.append_removed("q", backlog[:50])
                del backlog[:50]
            if msg_id % 100 == 99:
                await durable(store)
            if msg_id % 2000 == 1999:
                await settle(store)
                samples.append(disk_bytes(tmp_path))
        store.close()
        return len(backlog)

    queued = asyncio.run(main())
    written = 20_000 * 230
    assert max(samples) < written / 10
    assert max(samples[3:]) <= 2 * min(samples[3:])  # flat, not growing with what was ever published
    assert len(reopen(tmp_path).messages["q"]) == queued


def test_a_segment_with_one_stuck_message_is_compacted_and_everything_else_deleted(tmp_path):
    async def main() -> dict:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        for msg_id in range(3000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"y" * 200)
        await durable(store)
        store.append_removed("q", range(1, 3000))  # all but the first, which a consumer holds
        await settle(store)
        stats = store.stats()
        store.close()
        return stats

    stats = asyncio.run(main())
    assert stats["live_messages"] == 1
    assert disk_bytes(tmp_path) < 2 * 64 * 1024  # the head segment (never rewritten) and a few hundred bytes
    recovered = reopen(tmp_path)
    assert [m.msg_id for m in recovered.messages["q"]] == [0]


def test_removals_stay_on_disk_while_an_older_segment_still_holds_the_removed_publish(tmp_path):
    """Segment 0 keeps a live message and the publish of an acked one; the ack sits in a later segment."""

    async def main() -> None:
        store = MessageStore(tmp_path, segment_bytes=4096, min_compact_bytes=1 << 30)  # no compaction
        store.recover()
        store.append_message(0, ("q",), "", "q", b"h", b"stays")
        store.append_message(1, ("q",), "", "q", b"h", b"acked")
        store.append_message(2, ("q",), "", "q", b"h", b"z" * 5000)  # fills segment 0
        store.append_message(3, ("q",), "", "q", b"h", b"in-segment-1")
        store.append_removed("q", [1])  # recorded in segment 1
        store.append_message(4, ("q",), "", "q", b"h", b"z" * 5000)
        store.append_message(5, ("q",), "", "q", b"h", b"in-segment-2")
        store.append_removed("q", [2, 3, 4])  # segment 1 now holds nothing live
        await settle(store)
        store.close()

    asyncio.run(main())
    assert [m.body for m in reopen(tmp_path).messages["q"]] == [b"stays", b"in-segment-2"]


def test_a_message_left_in_one_of_several_queues_survives_compaction_in_that_queue_only(tmp_path):
    async def main() -> None:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        store.append_message(0, ("a", "b"), "fan", "", b"h", b"shared")
        store.append_delivered("b", [0])
        for msg_id in range(1, 2000):
            store.append_message(msg_id, ("a",), "", "", b"h", b"w" * 200)
        await durable(store)
        store.append_removed("a", range(0, 2000))
        await settle(store)
        store.close()

    asyncio.run(main())
    recovered = reopen(tmp_path)
    assert recovered.messages.get("a") is None
    assert [(m.body, m.redelivered) for m in recovered.messages["b"]] == [(b"shared", True)]
    assert disk_bytes(tmp_path) < 2 * 64 * 1024


def test_deleting_a_queue_frees_its_segments(tmp_path):
    async def main() -> None:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        store.append_definition("queue", "doomed", {"name": "doomed"})
        for msg_id in range(3000):
            store.append_message(msg_id, ("doomed",), "", "", b"h", b"v" * 200)
        await durable(store)
        assert disk_bytes(tmp_path) > 500_000
        store.delete_queue("doomed")
        store.append_message(3000, ("other",), "", "", b"h", b"kept")
        await settle(store)
        store.close()

    asyncio.run(main())
    assert disk_bytes(tmp_path) < 2 * 64 * 1024
    recovered = reopen(tmp_path)
    assert recovered.queues == []
    assert list(recovered.messages) == ["other"]


def test_damage_that_appears_while_running_stops_a_compaction_and_keeps_the_segment(tmp_path, caplog):
    """A compaction that meets a damaged record keeps the segment whole instead of dropping what follows the
    damage; the next start reads past the one damaged record."""
    body = b"y" * 500

    async def main() -> tuple[Path, bytes]:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        for msg_id in range(1, 401):  # about three segments
            store.append_message(msg_id, ("q",), "", "q", b"h", body)
        await durable(store)
        first = sorted(messages_directory(tmp_path).iterdir())[0]
        damaged = bytearray(first.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        first.write_bytes(damaged)  # bit rot after start
        gone = [msg_id for msg_id in range(1, 121) if msg_id % 4]  # most of the first segment: due for a rewrite
        store.append_removed("q", gone)
        await settle(store)
        await settle(store)
        store.close()
        return first, bytes(damaged)

    gone = {msg_id for msg_id in range(1, 121) if msg_id % 4}
    first, damaged = asyncio.run(main())
    assert first.read_bytes() == damaged  # kept whole, not rewritten without what followed the damage
    assert any("stopped at damage" in record.getMessage() for record in caplog.records)
    live = set(range(1, 401)) - gone
    back = {message.msg_id for message in reopen(tmp_path).messages["q"]}
    assert len(live - back) <= 1  # only the record holding the flipped byte is lost


def test_a_removal_record_keeps_exactly_the_ids_whose_publishes_sit_in_segments_still_needing_them():
    """A REMOVED record of thousands of ids in any order, aimed at segments of publishes some of which still need
    their removals: the rewrite keeps those ids and no other, and notes which older segments it refers to."""
    rng = random.Random(7)
    segment = SimpleNamespace(number=9, refers={home: 100 + home for home in range(9)})
    job = Compaction.__new__(Compaction)
    job.segment = segment
    job._firsts = [0, 1000, 2500, 2600, 7000, 9000]  # the first id of each segment of publishes
    job._homes = [0, 2, 3, 5, 8, 9]  # those segments (9: this one)
    job._compacted_upto = {0: 500, 2: 0, 3: 50, 5: 999, 8: 0, 9: 0}  # 0 and 5 no longer need their removals
    job.refers = {}
    job._index = None  # (a publish would need it: this segment holds none)
    ids = rng.sample(range(12_000), 6000)
    data = records.id_list(records.REMOVED, "q", ids)
    [(start, end, payload)] = list(records.scan(data))
    out = bytearray()
    job._copy(payload, data, start, end, out)
    needed = {2: range(1000, 2500), 3: range(2500, 2600), 8: range(7000, 9000)}
    expected = sorted(msg_id for msg_id in ids if any(msg_id in span for span in needed.values()))
    [(_, _, kept)] = list(records.scan(bytes(out)))
    queue, kept_ids = records.decode_id_list(kept)
    assert (queue, sorted(kept_ids)) == ("q", expected)  # (in any order: a record's order means nothing)
    assert job.refers == {2: 102, 3: 103, 8: 108}
