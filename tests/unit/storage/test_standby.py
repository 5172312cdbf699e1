"""A follower's hot standby (storage.standby): fed the leader's writes as a follower gets them, it recovers what a
start on the same data dir would, so that a promoted follower need not read its data dir again; where it cannot
follow (damage), it hands over nothing and the start reads the files."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
from pamqp import commands, header

from storage.replica import APPEND, DELETE, REPLACE, ReplicaWriter, reset_op
from storage.recovery import Recovered, recover
from storage.segments import messages_directory, segment_numbers, segment_path
from storage import standby as standby_module
from storage.standby import Standby
from tests.unit.storage.storage_support import durable, reopen
from tests.unit.storage.test_storage_replication import SMALL, Leader, copy_ops, settle

PERSISTENT = header.ContentHeader(0, 0, commands.Basic.Properties(delivery_mode=2)).marshal()
TRANSIENT = header.ContentHeader(0, 0, commands.Basic.Properties(delivery_mode=1)).marshal()


class Follower:
    """A follower's data dir fed the leader's frames as they come, each APPEND cut in two at a random byte (so that
    a record often arrives in two writes), its standby catching up after each write."""

    def __init__(self, directory: Path, leader: Leader, rng: random.Random) -> None:
        self.directory = directory
        self.leader = leader
        self.rng = rng
        self.writer = ReplicaWriter(directory)
        self.standby = Standby(directory)
        self.applied = 0  # frames of leader.frames applied

    def join(self, cut) -> None:
        sequence, held = cut
        self.apply([(sequence, copy_ops(held))])
        self.applied = sum(1 for number, _ in self.leader.frames if number <= sequence)
        self.standby.catch_up()

    def rejoin(self, cut) -> None:
        """Joins again after it fell behind, as the leader's copy makes it: the files it holds that are a prefix of
        the leader's at the cut are kept and get their tails, the others go and come whole."""
        sequence, held = cut
        kept, appends = [], []
        for path, fd, size in held:
            data = os.pread(fd, size, 0)
            os.close(fd)
            mine = self.directory / path
            old = mine.read_bytes() if mine.exists() else b""
            if old and data.startswith(old):
                kept.append(path)
                data = data[len(old):]
            if data:
                appends.append((APPEND, path, data))
        self.apply([(-1, [reset_op(kept), *appends])])
        self.apply([(sequence, [])])  # the copy's end
        self.applied = sum(1 for number, _ in self.leader.frames if number <= sequence)
        self.standby.catch_up()

    def apply(self, frames) -> None:
        """As the follower's stream does: the writer makes the frames durable, then the standby hears of them."""
        self.writer.apply(frames)
        self.standby.applied(frames)

    def keep_up(self) -> None:
        for sequence, ops in self.leader.frames[self.applied:]:  # (the writer's thread may add more meanwhile)
            self.applied += 1
            for op in ops:
                kind, path, data = op
                if kind == APPEND and len(data) > 1 and self.rng.random() < 0.5:
                    cut = self.rng.randrange(1, len(data))
                    self.apply([(sequence, [(APPEND, path, data[:cut])])])
                    self.standby.catch_up()
                    op = (APPEND, path, data[cut:])
                self.apply([(sequence, [op])])
            self.standby.catch_up()

    def promote(self) -> Recovered:
        self.writer.close()
        reader = self.standby.take()
        assert reader is not None, "the standby is whole"
        return recover(self.directory, messages_directory(self.directory), lambda: reader).recovered


def state(recovered: Recovered) -> dict:
    """What a broker would rebuild from a recovery: every queue's messages with their flags, and the definitions."""
    return {
        "messages": {queue: [(m.msg_id, m.exchange, m.routing_key, m.header_payload, m.body, m.redelivered)
                             for m in stored] for queue, stored in recovered.messages.items()},
        "persistent": {queue: len(stored) - len(stored.transient_ids) for queue, stored in recovered.messages.items()},
        "definitions": (recovered.exchanges, recovered.queues, recovered.bindings),
        "next_msg_id": recovered.next_msg_id,
    }


def cold(directory: Path, scratch: Path) -> dict:
    """What a start on a copy of directory recovers."""
    shutil.copytree(directory, scratch, ignore=shutil.ignore_patterns(".lock"))
    return state(reopen(scratch))


class Behind:
    """A follower that has fallen out of the stream: it takes none of the workload's frames."""

    def keep_up(self) -> None:
        pass


async def workload(leader: Leader, follower: Follower | Behind, rng: random.Random, rounds: int,
                   first_id: int = 0) -> int:
    """Publishes (persistent and not, to one queue or several), deliveries, acks in and out of order, queue
    deletions and declarations again, definitions churned until their log is rewritten, compactions and spent
    segments deleted; the follower keeps up at every durable point. Its messages' ids begin at first_id; returns
    the id after the last."""
    store = leader.store
    queues = ["/|a", "/|b", "/|c"]
    live: dict[str, list[int]] = {queue: [] for queue in queues}
    for queue in queues:
        store.append_definition("queue", queue, {"name": queue})
    msg_id = first_id
    for round_ in range(rounds):
        for _ in range(rng.randrange(50, 400)):
            targets = tuple(rng.sample(queues, rng.choice((1, 1, 1, 2))))
            store.append_message(msg_id, targets, "x", "k%d" % (msg_id % 5), rng.choice((PERSISTENT, TRANSIENT)),
                                 b"m%d" % msg_id + b"." * rng.randrange(0, 300))
            for queue in targets:
                live[queue].append(msg_id)
            msg_id += 1
        for queue in queues:
            ids = live[queue]
            if ids and rng.random() < 0.7:
                store.append_delivered(queue, ids[:rng.randrange(len(ids) + 1)])
            if ids and rng.random() < 0.8:
                acked = set(rng.sample(ids, rng.randrange(len(ids) * 3 // 4 + 1)))
                store.append_removed(queue, sorted(acked))
                live[queue] = [i for i in ids if i not in acked]
        if rng.random() < 0.15:
            queue = rng.choice(queues)
            store.delete_queue(queue)
            live[queue] = []
            store.append_definition("queue", queue, {"name": queue, "round": round_})
        for revision in range(rng.choice((0, 0, 60))):  # sometimes enough to rewrite the log
            store.append_definition("queue", "/|churn", {"name": "churn", "revision": revision, "pad": "p" * 400})
        if rng.random() < 0.3:
            await settle(store)
        else:
            await durable(store)
        follower.keep_up()
    return msg_id


async def publish_followed(leader: Leader, follower: Follower, count: int) -> None:
    """count persistent messages to the queue /|q (ids from 0), the follower keeping up every 500."""
    for msg_id in range(count):
        leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id + b"." * 100)
        if msg_id % 500 == 499:
            await durable(leader.store)
            follower.keep_up()


def followed_workload(tmp_path: Path, seed: int) -> Follower:
    """The workload on a leader, a follower joined before it keeping up to its end."""
    rng = random.Random(seed)

    async def main() -> Follower:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, rng)
        follower.join(await leader.cut())
        await workload(leader, follower, rng, rounds=40)
        leader.store.close()
        follower.keep_up()
        return follower

    return asyncio.run(main())


@pytest.mark.parametrize("seed", range(6))
def test_a_standby_fed_the_writes_recovers_what_a_start_on_the_same_files_would(tmp_path, seed):
    follower = followed_workload(tmp_path, seed)
    assert follower.standby.restarts == 0
    expected = cold(follower.directory, tmp_path / "copy")
    assert sum(len(messages) for messages in expected["messages"].values()) > 100
    assert state(follower.promote()) == expected


def test_the_workload_compacts_deletes_segments_and_rewrites_the_definitions_log(tmp_path):
    """The equivalence above is worth something only if the files went through every kind of change."""
    leader = followed_workload(tmp_path, seed=0).leader
    ops = [(kind, path) for _, frame in leader.frames for kind, path, _ in frame]
    assert any(kind == REPLACE and path.startswith("messages/") for kind, path in ops)
    assert any(kind == DELETE and path.startswith("messages/") for kind, path in ops)
    assert (REPLACE, "definitions.log") in ops


def test_a_standby_of_a_follower_that_joined_a_leader_with_a_backlog_reads_the_copy(tmp_path, monkeypatch):
    """In pieces of 1,000 bytes here, so that pieces end inside records as they do in a join's megabytes."""
    monkeypatch.setattr(standby_module, "PIECE_BYTES", 1000)

    async def main() -> Follower:
        leader = Leader(tmp_path / "leader", **SMALL)
        for msg_id in range(2000):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
        leader.store.append_removed("/|q", range(0, 2000, 3))
        await durable(leader.store)
        follower = Follower(tmp_path / "follower", leader, random.Random(1))
        follower.join(await leader.cut())
        leader.store.append_message(2000, ("/|q",), "", "q", PERSISTENT, b"later")
        await durable(leader.store)
        leader.store.close()
        follower.keep_up()
        return follower

    follower = asyncio.run(main())
    expected = cold(follower.directory, tmp_path / "copy")
    assert len(expected["messages"]["/|q"]) == 2000 - 667 + 1
    assert state(follower.promote()) == expected


def test_a_damaged_segment_makes_the_standby_hand_over_nothing_and_the_start_reads_the_files(tmp_path):
    async def main() -> Follower:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(2))
        follower.join(await leader.cut())
        for msg_id in range(200):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
            if msg_id == 99:
                await durable(leader.store)
                follower.keep_up()
        await durable(leader.store)
        leader.store.close()
        return follower

    follower = asyncio.run(main())
    segments = messages_directory(follower.directory)
    path = segment_path(segments, segment_numbers(segments)[-1])
    read = path.stat().st_size
    for sequence, ops in follower.leader.frames[follower.applied:]:  # written, not yet read by the standby
        follower.writer.apply([(sequence, ops)])  # (the standby does not hear of them: it reads them below)
    with open(path, "r+b") as file:  # a bit flipped in a record the standby has yet to read
        file.seek(read + 40)
        byte = file.read(1)
        file.seek(read + 40)
        file.write(bytes([byte[0] ^ 0x01]))
    follower.writer.close()
    follower.standby.catch_up()
    assert follower.standby.restarts == 1
    assert follower.standby.take() is None
    assert len(reopen(follower.directory).messages["/|q"]) == 199  # the start's own repair: one record lost


def test_a_standby_on_its_thread_hands_over_what_was_written_before_take(tmp_path):
    """As a follower runs it: its thread reads after each group applied(), and take() reads what came since its
    last look."""
    async def main() -> Follower:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(3))
        follower.join(await leader.cut())
        follower.standby.start()
        for msg_id in range(3000):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
            if msg_id % 100 == 99:
                await durable(leader.store)
                for sequence, ops in leader.frames[follower.applied:]:
                    follower.applied += 1
                    follower.apply([(sequence, ops)])
        leader.store.close()
        return follower

    follower = asyncio.run(main())
    recovered = follower.promote()
    assert [m.body for m in recovered.messages["/|q"]] == [b"m%d" % msg_id for msg_id in range(3000)]
    assert recovered.report["standby"] is True


def test_a_join_copy_is_read_once_whole_and_a_standby_taken_during_one_hands_over_nothing(tmp_path):
    """A follower that joins again receives a copy whose files arrive in no order the standby could follow record
    by record (a kept file's tail after a later file): the standby reads nothing while the copy is under way, and
    the files again from the start once it is whole."""
    async def main() -> tuple[Follower, list]:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(4))
        follower.join(await leader.cut())
        await publish_followed(leader, follower, 3000)
        leader.store.append_removed("/|q", range(0, 3000, 2))
        await durable(leader.store)
        follower.keep_up()
        cut = await leader.cut()
        for msg_id in range(3000, 3100):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
        await durable(leader.store)
        leader.store.close()
        return follower, cut

    follower, (sequence, held) = asyncio.run(main())
    reset, *appends = copy_ops(held)
    follower.apply([(-1, [reset])])
    follower.apply([(-1, appends[len(appends) // 2:])])  # the later files first, then the earlier ones
    follower.standby.catch_up()
    assert not follower.standby.whole  # (what its member key says: a node whose standby is whole goes first)
    assert follower.standby.take() is None  # mid-copy: the start reads the files
    follower.standby = Standby(follower.directory)  # (as a follower that goes on following starts another)
    follower.apply([(-1, [reset])])
    follower.apply([(-1, appends[len(appends) // 2:])])
    follower.standby.catch_up()
    follower.apply([(-1, appends[:len(appends) // 2])])
    follower.standby.catch_up()
    assert not follower.standby.whole
    follower.apply([(sequence, [])])  # the copy's end, as the leader sends it
    follower.applied = sum(1 for number, _ in follower.leader.frames if number <= sequence)
    follower.keep_up()
    assert follower.standby.whole
    expected = cold(follower.directory, tmp_path / "copy")
    assert len(expected["messages"]["/|q"]) == 1500 + 100
    assert state(follower.promote()) == expected
    assert follower.standby.restarts == 0


def test_a_follower_that_joins_the_same_leadership_again_reads_on_from_where_its_standby_was(tmp_path, caplog):
    """A follower dropped from the stream joins the same leader again: the copy changed its files as the frames it
    missed would have (the kept ones grew, the others were compacted or deleted meanwhile), so the standby reads on
    from where it was rather than all of it again."""
    caplog.set_level(logging.INFO, logger="storage.standby")

    async def main() -> Follower:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(5))
        follower.standby.follows(6)
        follower.join(await leader.cut())
        await publish_followed(leader, follower, 3000)
        missed_from = len(leader.frames)
        leader.store.append_delivered("/|q", range(1500, 2000))
        leader.store.append_removed("/|q", [*range(0, 1000), *range(1000, 2000, 3)])
        await settle(leader.store)
        for msg_id in range(3000, 3100):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
        await durable(leader.store)
        missed = {(kind, path.split("/")[0]) for _, frame in leader.frames[missed_from:] for kind, path, _ in frame}
        assert {(REPLACE, "messages"), (DELETE, "messages")} <= missed
        follower.rejoin(await leader.cut())
        leader.store.append_removed("/|q", range(2000, 2500))
        await durable(leader.store)
        follower.keep_up()
        leader.store.close()
        return follower

    follower = asyncio.run(main())
    assert len([r for r in caplog.records if "has read its data dir" in r.getMessage()]) == 1  # (the first join's)
    assert follower.standby.restarts == 0
    expected = cold(follower.directory, tmp_path / "copy")
    assert len(expected["messages"]["/|q"]) == 3100 - 1000 - 334 - 500
    assert state(follower.promote()) == expected


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("leadership", ["the same", "another"])
def test_a_follower_that_joins_again_after_the_workload_recovers_what_a_start_would(
        tmp_path, caplog, seed, leadership):
    """The same after a workload of every kind of change: the promoted follower recovers what a start would. The
    standby reads its data dir again at once for a copy of another leadership, whose files may hold another history;
    for the same leadership only where it cannot follow, saying why (here: the segment it was reading was compacted
    by the leader meanwhile), at its retry or its promotion."""
    caplog.set_level(logging.INFO, logger="storage.standby")
    rng = random.Random(seed)

    async def main() -> tuple[Follower, int]:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, rng)
        follower.standby.follows(6)
        follower.join(await leader.cut())
        next_id = await workload(leader, follower, rng, rounds=15)
        next_id = await workload(leader, Behind(), rng, rounds=15, first_id=next_id)
        read_whole = len([r for r in caplog.records if "has read its data dir" in r.getMessage()])
        follower.standby.follows(6 if leadership == "the same" else 7)
        follower.rejoin(await leader.cut())
        await workload(leader, follower, rng, rounds=10, first_id=next_id)
        leader.store.close()
        follower.keep_up()
        return follower, read_whole

    follower, read_whole = asyncio.run(main())
    read_again = len([r for r in caplog.records if "has read its data dir" in r.getMessage()]) - read_whole
    if leadership == "the same":  # (a restart reads again later, at its retry or at the promotion)
        assert read_again == 0
    else:
        assert read_again == 1 and follower.standby.restarts == 0
    expected = cold(follower.directory, tmp_path / "copy")
    assert sum(len(messages) for messages in expected["messages"].values()) > 100
    assert state(follower.promote()) == expected


def caught_up_with_frames_applied_as_it_lists(follower: Follower, frames: list, monkeypatch,
                                             after_the_listing: bool) -> None:
    """The standby's catch-up with frames applied as the stream's thread would meanwhile, just after its listing of
    the segments or just before it (after it read the definitions log); then its next catch-up."""
    listed = standby_module.segment_numbers

    def listing(directory: Path) -> list[int]:
        if not after_the_listing:
            follower.apply(frames)
        numbers = listed(directory)
        if after_the_listing:
            follower.apply(frames)
        return numbers

    monkeypatch.setattr(standby_module, "segment_numbers", listing)
    follower.standby.catch_up()
    monkeypatch.setattr(standby_module, "segment_numbers", listed)
    follower.standby.catch_up()


def test_a_spent_segment_deleted_as_the_standby_lists_the_segments_is_found_deleted_at_its_next_look(
        tmp_path, monkeypatch):
    """The stream deletes a spent segment between the standby's listing of the segments and its look at that one
    (the leader's deletions during a deep queue's settlement): the standby goes on, and finds it deleted at its next
    catch-up, rather than start again from the whole data dir."""
    async def main() -> tuple[Follower, list]:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(6))
        follower.join(await leader.cut())
        for msg_id in range(3000):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id + b"." * 100)
        await durable(leader.store)
        follower.keep_up()
        leader.store.append_removed("/|q", range(1500))
        await settle(leader.store)
        leader.store.close()
        return follower, leader.frames[follower.applied:]

    follower, missed = asyncio.run(main())
    deletions = [frame for frame in missed if any(kind == DELETE for kind, _, _ in frame[1])]
    assert deletions
    caught_up_with_frames_applied_as_it_lists(follower, missed, monkeypatch, after_the_listing=True)
    assert follower.standby.restarts == 0 and follower.standby.whole
    expected = cold(follower.directory, tmp_path / "copy")
    assert len(expected["messages"]["/|q"]) == 1500
    assert state(follower.promote()) == expected


def test_a_purge_that_comes_as_the_standby_lists_the_segments_leaves_their_messages_gone(tmp_path, monkeypatch):
    """A queue's purge (a watermark in the definitions log) and the deletion of the segments it emptied arrive after
    the standby read the definitions log and before it listed the segments: it finds them deleted with messages it
    holds live, takes those as gone with their segments, as a start does, and goes on, rather than start again from
    the whole data dir."""
    async def main() -> tuple[Follower, list]:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(7))
        follower.join(await leader.cut())
        await publish_followed(leader, follower, 3000)
        leader.store.drop_messages("/|q")
        await settle(leader.store)
        for msg_id in range(3000, 3010):
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d" % msg_id)
        await durable(leader.store)
        leader.store.close()
        return follower, leader.frames[follower.applied:]

    follower, missed = asyncio.run(main())
    assert any(kind == DELETE for _, frame in missed for kind, _, _ in frame)
    caught_up_with_frames_applied_as_it_lists(follower, missed, monkeypatch, after_the_listing=False)
    assert follower.standby.restarts == 0 and follower.standby.whole
    expected = cold(follower.directory, tmp_path / "copy")
    assert [m[4] for m in expected["messages"]["/|q"]] == [b"m%d" % msg_id for msg_id in range(3000, 3010)]
    assert state(follower.promote()) == expected


@pytest.mark.parametrize("emptied_by", ["purge", "removals"])
def test_a_segment_deleted_before_the_standby_read_it_to_its_end_is_forgotten_as_a_whole_one_is(tmp_path, emptied_by):
    """The head segment, read in part, gets more messages and later ones are begun, then the queue is emptied (a
    purge, or the removals of every message, which go in the part of the head not read) and the leader deletes the
    segments, all before the standby's next catch-up (both followers of a deep purge read their 4 million messages
    again so): what it did not read is gone from the files a start reads too, and so are the messages of the deleted
    segments; the standby goes on."""
    async def main() -> tuple[Follower, list]:
        leader = Leader(tmp_path / "leader", **SMALL)
        follower = Follower(tmp_path / "follower", leader, random.Random(8))
        follower.join(await leader.cut())
        await publish_followed(leader, follower, 3000)
        head = max(segment_numbers(messages_directory(follower.directory)))
        if emptied_by == "removals":  # (their records in the head, unread)
            leader.store.append_removed("/|q", range(3000))
        for msg_id in range(3000, 3010):  # (into the head, unread, and on into later segments)
            leader.store.append_message(msg_id, ("/|q",), "", "q", PERSISTENT, b"m%d." % msg_id + b"." * 20000)
        await durable(leader.store)
        if emptied_by == "purge":
            leader.store.drop_messages("/|q")
        else:
            leader.store.append_removed("/|q", range(3000, 3010))
        await settle(leader.store)
        leader.store.append_message(3010, ("/|q",), "", "q", PERSISTENT, b"m3010")
        await settle(leader.store)
        leader.store.close()
        assert head not in segment_numbers(messages_directory(tmp_path / "leader")), "the head read in part is gone"
        return follower, leader.frames[follower.applied:]

    follower, missed = asyncio.run(main())
    follower.apply(missed)
    follower.standby.catch_up()
    assert follower.standby.restarts == 0 and follower.standby.whole
    expected = cold(follower.directory, tmp_path / "copy")
    assert [m[4] for m in expected["messages"]["/|q"]] == [b"m3010"]
    assert state(follower.promote()) == expected
