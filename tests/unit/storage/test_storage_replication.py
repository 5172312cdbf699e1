"""The store's side of replication: the writer's tap hands over every change to the files, so that a follower that
starts from a cut and applies the later frames ends byte-identical to the leader (and recovers the same messages),
through compactions, deletions, stream resets and failed batches; the gate holds callbacks back in order."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from storage import writer as writer_module
from storage.replica import APPEND, DELETE, REPLACE, RESET, RMTREE, TRUNCATE, Op, ReplicaWriter, replicated_files
from storage.store import MessageStore
from tests.unit.storage.storage_support import HANG_GUARD, durable, reopen

SMALL = {"segment_bytes": 64 * 1024, "min_compact_bytes": 8 * 1024}
STREAM_LIMITS = {"max_segment_bytes": 4096, "max_bytes": 16384, "max_age_ms": None}

Held = list[tuple[str, int, int]]


class Leader:
    """A store with replication on: every frame the tap got, every cut, and what the gate held."""

    def __init__(self, data_dir: Path, gate: Callable[[int, Callable[[], None]], None] | None = None,
                 **options) -> None:
        self.frames: list[tuple[int, list[Op]]] = []
        self.cuts: list[tuple[int, Held]] = []
        self.store = MessageStore(data_dir, **options)
        self.store.recover()
        self.store.replicate(self._tap, gate or (lambda sequence, release: release()))

    def _tap(self, sequence: int, ops: list[Op]) -> None:
        assert threading.current_thread().name == "warren-store-writer"
        self.frames.append((sequence, ops))

    async def cut(self) -> tuple[int, Held]:
        """Ask for a cut and wait for it (it comes with the next batch, even if nothing else is pending)."""
        self.store.request_cut(lambda sequence, held: self.cuts.append((sequence, held)))
        await durable(self.store)
        return self.cuts[-1]

    async def durable_framed(self) -> tuple[bool, int]:
        """Whether everything appended so far was written, and how many frames the tap had then: counted in the
        batch's own callback, before a batch the store hands over next (a failed one's retry) can add its own."""
        done: asyncio.Future[tuple[bool, int]] = asyncio.get_running_loop().create_future()
        self.store.when_durable(lambda ok: done.set_result((ok, len(self.frames))))
        return await done

    def kinds_after(self, sequence: int) -> set[int]:
        return {kind for number, ops in self.frames if number > sequence for kind, _, _ in ops}


async def settle(store: MessageStore) -> None:
    """Flush until compactions queued by earlier batches have finished and been acted upon."""
    for _ in range(50):
        await durable(store)
        if not store.stats()["compactions_running"]:
            break
        await asyncio.to_thread(lambda: None)
    await durable(store)


def copy_ops(held: Held) -> list[Op]:
    """What a joining follower is sent for a cut: RESET, then each held file up to its size (the fds closed)."""
    ops: list[Op] = [(RESET, "", b"")]
    for path, fd, size in held:
        ops.append((APPEND, path, os.pread(fd, size, 0)))
        os.close(fd)
    return ops


def replay(directory: Path, frames: list[tuple[int, list[Op]]]) -> None:
    """Apply the frames to directory with a ReplicaWriter, as one group."""
    writer = ReplicaWriter(directory)
    try:
        assert writer.apply(frames) == frames[-1][0]
    finally:
        writer.close()


def follow(directory: Path, leader: Leader, cut: tuple[int, Held]) -> None:
    """A follower that joins at the cut: the copy, then every frame after it."""
    sequence, held = cut
    replay(directory, [(sequence, copy_ops(held)), *[frame for frame in leader.frames if frame[0] > sequence]])


def contents(data_dir: Path) -> dict[str, bytes]:
    return {path.as_posix(): (data_dir / path).read_bytes() for path in replicated_files(data_dir)}


def messages(data_dir: Path) -> dict[str, list[tuple[int, bytes, bool]]]:
    recovered = reopen(data_dir)
    return {queue: [(m.msg_id, m.body, m.redelivered) for m in stored] for queue, stored in recovered.messages.items()}


def test_a_follower_fed_the_tap_ends_byte_identical_through_every_kind_of_change(tmp_path):
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"

    async def main() -> tuple[Leader, tuple[int, Held]]:
        leader = Leader(leader_dir, **SMALL)
        first_cut = await leader.cut()
        store = leader.store
        store.append_definition("exchange", "/|x", {"name": "x"})
        store.append_definition("queue", "/|q", {"name": "q"})
        store.append_definition("queue", "/|gone", {"name": "gone"})
        for msg_id in range(3000):
            store.append_message(msg_id, ("/|q",) if msg_id % 7 else ("/|q", "/|gone"), "x", "k", b"h", b"b" * 200)
            if msg_id % 500 == 499:
                await durable(store)
        store.append_delivered("/|q", range(0, 3000, 3))
        store.append_removed("/|q", [msg_id for msg_id in range(3000) if msg_id % 50])  # compactions
        store.append_removed("/|q", range(2000, 3000))  # whole segments spent
        store.delete_queue("/|gone")
        events = store.streams.open("/|events", fresh=True, **STREAM_LIMITS)
        doomed = store.streams.open("/|doomed", fresh=True, **STREAM_LIMITS)
        for number in range(200):
            events.append("", "events", b"h", b"e" * 200)  # retention drops head segments
            doomed.append("", "doomed", b"h", b"doomed %d" % number)
            if number % 20 == 19:
                await durable(store)
        store.streams.delete("/|doomed")
        for revision in range(300):  # outgrows the live definitions: the log is rewritten whole
            store.append_definition("queue", "/|churn", {"name": "churn", "revision": revision, "pad": "p" * 400})
        await settle(store)
        store.close()
        return leader, first_cut

    leader, first_cut = asyncio.run(main())
    follow(follower_dir, leader, first_cut)
    assert leader.kinds_after(0) == {APPEND, REPLACE, DELETE, RMTREE}
    replaced = {path for _, ops in leader.frames for kind, path, _ in ops if kind == REPLACE}
    assert "definitions.log" in replaced and any(path.startswith("messages/") for path in replaced)
    assert any(kind == DELETE and path.startswith("streams/") for _, ops in leader.frames for kind, path, _ in ops)
    assert [sequence for sequence, _ in leader.frames] == list(range(1, len(leader.frames) + 1))
    assert contents(follower_dir) == contents(leader_dir)
    expected = messages(leader_dir)
    assert len(expected["/|q"]) == 40 and "/|gone" not in expected
    assert messages(follower_dir) == expected


def test_a_cut_read_after_a_compaction_and_an_unlink_still_gives_the_leaders_files(tmp_path):
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    (follower_dir / "quarantine").mkdir(parents=True)
    for name, content in {".lock": b"1", "cluster-state": b"epoch", "quarantine/x@0": b"bad", "junk.seg": b"j"}.items():
        (follower_dir / name).write_bytes(content)

    async def main() -> tuple[Leader, tuple[int, Held], dict[str, int]]:
        leader = Leader(leader_dir, **SMALL)
        store = leader.store
        for msg_id in range(3000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"c" * 200)
        store.append_definition("queue", "q", {"name": "q"})
        await durable(store)
        cut = await leader.cut()
        cut_sizes = {path: size for path, _, size in cut[1]}
        store.append_removed("q", range(0, 300))  # segment 0 spent: unlinked
        store.append_removed("q", [msg_id for msg_id in range(300, 3000) if msg_id % 3])  # compactions
        for msg_id in range(3000, 3500):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"d" * 200)
        await settle(store)
        store.close()
        return leader, cut, cut_sizes

    leader, cut, cut_sizes = asyncio.run(main())
    after = [(kind, path) for sequence, ops in leader.frames if sequence > cut[0] for kind, path, _ in ops]
    assert (DELETE, "messages/0000000000.seg") in after
    assert any(kind == REPLACE and path in cut_sizes for kind, path in after)
    assert not (leader_dir / "messages/0000000000.seg").exists()
    follow(follower_dir, leader, cut)  # the held fds are read only now
    assert contents(follower_dir) == contents(leader_dir)
    assert (follower_dir / "cluster-state").read_bytes() == b"epoch"
    assert (follower_dir / "quarantine/x@0").read_bytes() == b"bad"
    assert messages(follower_dir) == messages(leader_dir)


class FailOnce:
    """os.<name> raising ENOSPC once on the store's writer thread, at the call ``arm(skip)`` says."""

    def __init__(self, monkeypatch, name: str) -> None:
        self._countdown = -1  # calls on the writer thread to let through before the one that fails
        self.failed = 0
        self._original = getattr(os, name)
        monkeypatch.setattr(writer_module.os, name, self)

    def arm(self, skip: int = 0) -> None:
        self._countdown = skip

    def __call__(self, *args):
        if self._countdown >= 0 and threading.current_thread().name == "warren-store-writer":
            self._countdown -= 1
            if self._countdown < 0:
                self.failed += 1
                raise OSError(errno.ENOSPC, "No space left on device")
        return self._original(*args)


@pytest.mark.parametrize("failing", ["fdatasync", "write"])
def test_a_failed_batch_is_undone_on_the_follower_too(tmp_path, monkeypatch, failing):
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    fault = FailOnce(monkeypatch, failing)

    async def main() -> tuple[Leader, tuple[int, Held], list[tuple[int, list[Op]]]]:
        leader = Leader(leader_dir)
        cut = await leader.cut()
        store = leader.store
        events = store.streams.open("/|events", fresh=True, **STREAM_LIMITS)
        store.append_message(0, ("q",), "", "q", b"h", b"kept")
        events.append("", "events", b"h", b"first")
        store.append_definition("queue", "q", {"name": "q"})
        assert await durable(store) is True
        before = len(leader.frames)
        fault.arm(skip=2 if failing == "write" else 0)  # a write fails on the second stream, after two files
        store.append_message(1, ("q",), "", "q", b"h", b"lost")
        events.append("", "events", b"h", b"lost")
        store.streams.open("/|new", fresh=True, **STREAM_LIMITS).append("", "new", b"h", b"lost")  # a new file
        store.append_definition("queue", "lost", {"name": "lost"})
        written, after = await leader.durable_framed()
        assert written is False
        failed_frames = leader.frames[before:after]
        store.append_message(2, ("q",), "", "q", b"h", b"after")
        events.append("", "events", b"h", b"after")
        assert await durable(store) is True
        store.close()
        return leader, cut, failed_frames

    leader, cut, failed_frames = asyncio.run(main())
    follow(follower_dir, leader, cut)
    assert fault.failed == 1
    truncations = [path for _, ops in failed_frames for kind, path, _ in ops if kind == TRUNCATE]
    assert "messages/0000000000.seg" in truncations
    assert len([path for path in truncations if path.startswith("streams/")]) == 2
    if failing == "write":  # the tap was never told of the writes, only of their undoing
        assert {kind for _, ops in failed_frames for kind, _, _ in ops} == {TRUNCATE}
    else:
        assert "definitions.log" in truncations
    # the new stream's directory, made by the failed batch, goes with the next one (its reset is retried)
    made = {path.rpartition("/")[0] for path in truncations if path.startswith("streams/")}
    assert len(made & {path for _, ops in leader.frames for kind, path, _ in ops if kind == RMTREE}) == 1
    assert contents(follower_dir) == contents(leader_dir)
    assert messages(follower_dir) == messages(leader_dir) == {"q": [(0, b"kept", False), (2, b"after", False)]}


def test_a_segment_a_failed_batch_made_stays_on_the_follower_too_empty(tmp_path, monkeypatch):
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    fault = FailOnce(monkeypatch, "write")

    async def main() -> tuple[Leader, tuple[int, Held]]:
        leader = Leader(leader_dir, segment_bytes=4096)
        cut = await leader.cut()
        leader.store.append_message(0, ("q",), "", "q", b"h", b"f" * 5000)  # fills segment 0
        assert await durable(leader.store) is True
        fault.arm()
        leader.store.append_message(1, ("q",), "", "q", b"h", b"lost")  # the first record of segment 1
        assert await durable(leader.store) is False
        leader.store.close()
        return leader, cut

    leader, cut = asyncio.run(main())
    ops = [op[:2] for _, frame_ops in leader.frames for op in frame_ops]
    assert (TRUNCATE, "messages/0000000001.seg") in ops and (APPEND, "messages/0000000001.seg") not in ops
    assert (leader_dir / "messages/0000000001.seg").stat().st_size == 0
    follow(follower_dir, leader, cut)
    assert contents(follower_dir) == contents(leader_dir)


def test_the_gate_holds_each_batchs_callbacks_until_released_and_keeps_their_order(tmp_path, monkeypatch):
    fault = FailOnce(monkeypatch, "fdatasync")
    held: list[tuple[int, Callable[[], None]]] = []
    outcomes: list[tuple[str, bool]] = []
    health: list[bool] = []

    async def main() -> Leader:
        leader = Leader(tmp_path, gate=lambda sequence, release: held.append((sequence, release)),
                        on_health=health.append)
        store = leader.store
        for number in range(4):
            if number == 2:
                fault.arm()
            store.append_message(number, ("q",), "", "q", b"h", b"m")
            store.when_durable(lambda ok, number=number: outcomes.append((f"batch {number}", ok)))
            for _ in range(1000):  # the next batch is handed over without waiting for the gate
                if len(held) > number:
                    break
                await asyncio.sleep(0.005)
        assert outcomes == [] and health == [False, True]
        for _, release in held:
            release()
        store.close()
        return leader

    leader = asyncio.run(main())
    assert outcomes == [("batch 0", True), ("batch 1", True), ("batch 2", False), ("batch 3", True)]
    sequences = [sequence for sequence, _ in held]
    assert sequences == sorted(sequences)
    # each batch is released at the sequence of its last frame: batch 2's undoing follows its writes
    frames = leader.frames
    assert sequences == [1, 2, 4, 5] and [frame[0] for frame in frames[:5]] == [1, 2, 3, 4, 5]
    assert {kind for kind, _, _ in frames[3][1]} == {TRUNCATE}


def test_writer_progress_moves_with_every_batch_even_an_empty_one(tmp_path):
    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        before = store.writer_progress()
        await asyncio.sleep(0.01)
        await durable(store)
        assert store.writer_progress() > before
        store.close()

    asyncio.run(main())


def test_writer_progress_moves_with_every_compaction_slice_between_batches(tmp_path, monkeypatch):
    """A writer that compacts between two batches (what it owes for the bytes written, a deep settlement's megabytes)
    is not stuck: a leader's lease is kept while it compacts (cluster.node)."""
    reached, go_on = threading.Event(), threading.Event()
    step = writer_module.Writer._step_compaction

    def first_held(writer) -> int:  # (the first slice waits for the test to read the progress of the batch before)
        if not reached.is_set():
            reached.set()
            go_on.wait(HANG_GUARD)
        return step(writer)

    monkeypatch.setattr(writer_module.Writer, "_step_compaction", first_held)

    async def main() -> None:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        for msg_id in range(3000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"m%d" % msg_id + b"." * 100)
        await durable(store)
        store.append_removed("q", [msg_id for msg_id in range(3000) if msg_id % 4])  # (most of each segment)
        for _ in range(5):  # (a batch hands the writer the compactions an earlier one made due)
            await durable(store)
            if await asyncio.to_thread(reached.wait, 1):
                break
        assert reached.is_set()
        before_the_slices = store.writer_progress()
        go_on.set()
        deadline = asyncio.get_running_loop().time() + HANG_GUARD
        while store.stats()["compactions_running"]:  # (told on the loop as each ends: nothing to await)
            assert asyncio.get_running_loop().time() < deadline, "the compactions never ended"
            await asyncio.sleep(0.001)
        assert store.writer_progress() > before_the_slices
        store.close()

    asyncio.run(main())


def test_without_replication_the_writer_makes_no_frames_and_takes_no_cut(tmp_path):
    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        store.append_message(0, ("q",), "", "q", b"h", b"m")
        await durable(store)
        assert store._writer.sequence == 0 and store._writer._frame is None
        store.close()

    asyncio.run(main())


def test_a_cut_that_cannot_be_taken_is_logged_answered_as_failed_and_the_writer_goes_on(tmp_path, monkeypatch,
                                                                                         caplog):
    def too_many_open_files(data_dir: Path) -> list[Path]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(writer_module, "replicated_files", too_many_open_files)

    async def main() -> list[tuple[int, Held]]:
        leader = Leader(tmp_path)
        leader.store.request_cut(lambda sequence, held: leader.cuts.append((sequence, held)))
        leader.store.append_message(0, ("q",), "", "q", b"h", b"m")
        assert await durable(leader.store) is True
        leader.store.append_message(1, ("q",), "", "q", b"h", b"m")
        assert await durable(leader.store) is True
        leader.store.close()
        return leader.cuts

    assert asyncio.run(main()) == [(-1, [])]
    assert "cannot take a cut of its files for a joining follower" in caplog.text
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [0, 1]
