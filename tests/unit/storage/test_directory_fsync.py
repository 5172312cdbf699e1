"""A file or directory the store makes (or renames into place) is only as durable as its entry in the directory
holding it: that directory is fsynced before anything written into the file is confirmed, a follower acks, or a
rewrite counts as done. The tests keep, for every directory, its entries as of its last fsync (what a power cut
would leave of it) and check at the moment of each confirm that the files it depends on are among them."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.compaction import Compaction
from storage.replica import APPEND, REPLACE, RESET, ReplicaWriter
from storage.segments import DEFINITIONS_LOG, messages_directory, segment_path
from storage.store import MessageStore
from storage.streams import segment_name
from tests.unit.storage.storage_support import durable, run

STREAM_LIMITS = {"max_segment_bytes": 1 << 20, "max_bytes": None, "max_age_ms": None}


class PowerCut:
    """What a power cut would leave of the tree under ``base``: each directory's entries (name -> inode) as of its
    last fsync. What the tree holds when this is made counts as durable already."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.base = base
        self.synced = {Path(root): self._entries(Path(root)) for root, _, _ in os.walk(base)}  # at their last fsync
        self.directory_fsyncs = 0  # fsyncs of a directory under base since this was made
        real_fsync = os.fsync

        def fsync(fd) -> None:
            fd = fd if isinstance(fd, int) else fd.fileno()
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                return real_fsync(fd)
            directory = Path(os.readlink(f"/proc/self/fd/{fd}"))
            entries = self._entries(directory)  # taken before the fsync: an entry made meanwhile is not counted
            real_fsync(fd)
            if directory.is_relative_to(base):
                self.synced[directory] = entries
                self.directory_fsyncs += 1

        monkeypatch.setattr(os, "fsync", fsync)

    @staticmethod
    def _entries(directory: Path) -> dict[str, int]:
        with os.scandir(directory) as entries:
            return {entry.name: entry.inode() for entry in entries}

    def lost(self, *paths: Path) -> list[str]:
        """Those of ``paths`` (as they are now) a power cut now would lose: an entry on the way to one is missing,
        or names another file, in the last fsynced state of its directory."""
        lost = []
        for path in paths:
            step = path
            while step != self.base:
                if self.synced.get(step.parent, {}).get(step.name) != step.lstat().st_ino:
                    lost.append(f"{path.relative_to(self.base)} (the entry of {step.name} in {step.parent})")
                    break
                step = step.parent
        return lost


async def lost_when_confirmed(store: MessageStore, cut: PowerCut, *paths: Path) -> list[str]:
    """Wait for everything appended so far to be confirmed; what of ``paths`` a power cut at that moment loses."""
    done: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
    store.when_durable(lambda ok: done.set_result(cut.lost(*paths) if ok else ["the batch failed"]))
    return await done


def lost_after(data_dir: Path, cut: PowerCut, write: Callable[[MessageStore], list[Path]]) -> list[str]:
    """Start a store on ``data_dir`` and write with it (``write`` names the files what it wrote depends on); what of
    those files a power cut at the moment it is confirmed loses."""
    async def main() -> list[str]:
        store = MessageStore(data_dir)
        store.recover()
        paths = write(store)
        try:
            return await lost_when_confirmed(store, cut, *paths)
        finally:
            store.close()
    return asyncio.run(main())


def fail_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next fdatasync fails as on a full disk (the batch is cut back and fails); later ones work."""
    real_fdatasync = os.fdatasync
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def fdatasync(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)


def used_before(data_dir: Path) -> None:
    """A data dir a store has started and stopped in (with a message, so its first segment exists)."""
    run(data_dir, lambda store: store.append_message(0, ("q",), "", "q", b"h", b"first"))


# --- the leader's store ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("made_by", ["the store", "someone else just before"])
def test_the_first_confirm_in_a_fresh_data_dir_survives_a_power_cut(tmp_path, monkeypatch, made_by):
    """The data dir's own entry, messages/ and the first segment, and the definitions log are all durable when
    the first publish and the first durable declare are confirmed, whoever made the data dir."""
    data_dir = tmp_path / "data"
    cut = PowerCut(tmp_path, monkeypatch)
    if made_by != "the store":
        data_dir.mkdir()  # as the broker's start-up or an operator does, without an fsync

    def write(store: MessageStore) -> list[Path]:
        store.append_message(1, ("q",), "", "q", b"h", b"body")
        store.append_definition("queue", "/|q", {"name": "q", "durable": True})
        return [segment_path(messages_directory(data_dir), 0), data_dir / DEFINITIONS_LOG]

    assert lost_after(data_dir, cut, write) == []


def test_a_first_message_survives_a_power_cut_where_recovery_made_the_messages_directory(tmp_path, monkeypatch):
    """A data dir holding definitions but no messages/ (a follower's copy of a leader without segments, promoted)."""
    data_dir = tmp_path / "data"
    run(data_dir, lambda store: store.append_definition("queue", "/|q", {"name": "q", "durable": True}))
    shutil.rmtree(messages_directory(data_dir))
    cut = PowerCut(tmp_path, monkeypatch)

    def write(store: MessageStore) -> list[Path]:
        store.append_message(1, ("q",), "", "q", b"h", b"body")
        return [segment_path(messages_directory(data_dir), 0)]

    assert lost_after(data_dir, cut, write) == []


def test_a_first_durable_declare_survives_a_power_cut_once_confirmed(tmp_path, monkeypatch):
    """A data dir used before, with messages but no definition yet: the first one makes definitions.log."""
    used_before(tmp_path / "data")
    cut = PowerCut(tmp_path, monkeypatch)

    def write(store: MessageStore) -> list[Path]:
        store.append_definition("queue", "/|q", {"name": "q", "durable": True})
        return [tmp_path / "data" / DEFINITIONS_LOG]

    assert lost_after(tmp_path / "data", cut, write) == []


def test_a_first_stream_message_survives_a_power_cut_once_confirmed(tmp_path, monkeypatch):
    """The first stream makes streams/, its directory and its first segment: all three entries are durable."""
    used_before(tmp_path / "data")
    cut = PowerCut(tmp_path, monkeypatch)

    def write(store: MessageStore) -> list[Path]:
        store.streams.open("/|events", fresh=True, **STREAM_LIMITS).append("", "events", b"h", b"first")
        return [store.streams.path_of("/|events") / segment_name(0)]

    assert lost_after(tmp_path / "data", cut, write) == []


def test_a_segment_made_by_a_failed_batch_is_durable_when_the_next_batch_is_confirmed(tmp_path, monkeypatch):
    """The batch that made the new head segment failed (and was cut back); the one that then writes to the same
    file is confirmed only once the file's entry is durable."""
    used_before(tmp_path / "data")
    cut = PowerCut(tmp_path, monkeypatch)
    fail_once(monkeypatch)

    async def main() -> tuple[bool, list[str]]:
        store = MessageStore(tmp_path / "data")
        store.recover()
        store.append_message(1, ("q",), "", "q", b"h", b"refused")
        first = await durable(store)
        store.append_message(2, ("q",), "", "q", b"h", b"taken")
        try:
            return first, await lost_when_confirmed(store, cut, *messages_directory(tmp_path / "data").iterdir())
        finally:
            store.close()

    assert asyncio.run(main()) == (False, [])


def test_a_stream_whose_first_batch_failed_can_be_deleted_and_later_batches_are_confirmed(tmp_path, monkeypatch):
    """The failed batch made the stream's directory (its entry not fsynced yet); the stream is deleted with its
    directory before the next batch, which has nothing of it left to fsync and is written as usual."""
    used_before(tmp_path / "data")
    cut = PowerCut(tmp_path, monkeypatch)
    fail_once(monkeypatch)

    async def main() -> tuple[bool, list[str]]:
        store = MessageStore(tmp_path / "data")
        store.recover()
        store.streams.open("/|events", fresh=True, **STREAM_LIMITS).append("", "events", b"h", b"refused")
        first = await durable(store)
        store.streams.delete("/|events")
        store.append_message(1, ("q",), "", "q", b"h", b"taken")
        try:
            return first, await lost_when_confirmed(store, cut, *messages_directory(tmp_path / "data").iterdir())
        finally:
            store.close()

    assert asyncio.run(main()) == (False, [])
    assert list((tmp_path / "data" / "streams").glob("*")) == []  # the stream left nothing behind


def test_a_definitions_snapshot_is_durable_when_its_batch_is_confirmed(tmp_path, monkeypatch):
    """The log outgrows the live definitions, so a batch replaces it by a snapshot (a new file renamed over)."""
    used_before(tmp_path / "data")
    cut = PowerCut(tmp_path, monkeypatch)
    log = tmp_path / "data" / DEFINITIONS_LOG

    async def main() -> tuple[set[int], list[str]]:
        store = MessageStore(tmp_path / "data")
        store.recover()
        files, lost = set(), []
        try:
            for version in range(60):
                store.append_definition("queue", "/|q", {"name": "q", "arguments": {"pad": f"{version}" * 2000}})
                lost += await lost_when_confirmed(store, cut, log)
                files.add(log.stat().st_ino)
        finally:
            store.close()
        return files, lost

    files, lost = asyncio.run(main())
    assert len(files) > 1, "the log was never replaced by a snapshot"
    assert lost == []


def test_a_compacted_segment_is_durable_once_the_store_learns_of_it(tmp_path, monkeypatch):
    """A rewrite renamed over its segment is durable by the time the store takes it as done (and may drop what only
    the old content needed)."""
    cut = PowerCut(tmp_path, monkeypatch)
    compacted: list[list[str]] = []
    finished = Compaction.steps

    def steps(self):
        yield from finished(self)
        compacted.append(cut.lost(segment_path(messages_directory(tmp_path), self.segment.number)))

    monkeypatch.setattr(Compaction, "steps", steps)

    async def main() -> None:
        store = MessageStore(tmp_path, segment_bytes=64 * 1024, min_compact_bytes=8 * 1024)
        store.recover()
        for msg_id in range(3000):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"y" * 200)
        await durable(store)
        store.append_removed("q", range(1, 3000))  # all but the first: its segment is rewritten
        try:
            for _ in range(100):
                await durable(store)
                if compacted and not store.stats()["compactions_running"]:
                    break
                await asyncio.to_thread(lambda: None)  # the writer's turn
        finally:
            store.close()

    asyncio.run(main())
    assert compacted, "no segment was compacted"
    assert all(lost == [] for lost in compacted)


def test_batches_into_files_that_exist_fsync_no_directory(tmp_path, monkeypatch):
    """The cost stays per new file: a run of batches appending to the head segment, the definitions log and a
    stream's segment makes no directory fsync."""
    used_before(tmp_path / "data")

    async def main() -> int:
        store = MessageStore(tmp_path / "data")
        store.recover()
        stream = store.streams.open("/|events", fresh=True, **STREAM_LIMITS)
        store.append_message(1, ("q",), "", "q", b"h", b"first")
        store.append_definition("queue", "/|q", {"name": "q"})
        stream.append("", "events", b"h", b"first")
        await durable(store)
        cut = PowerCut(tmp_path, monkeypatch)
        for msg_id in range(2, 102):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"more")
            store.append_definition("binding", f"/|q|{msg_id}", {"key": str(msg_id)})
            stream.append("", "events", b"h", b"more")
            await durable(store)
        fsyncs = cut.directory_fsyncs
        store.close()
        return fsyncs

    assert asyncio.run(main()) == 0


# --- a follower -----------------------------------------------------------------------------------------------
def test_what_a_follower_acks_survives_a_power_cut(tmp_path, monkeypatch):
    """Files (and their directories) an APPEND makes, a REPLACE renamed into a new directory, and the files of a
    full copy after a RESET are durable when apply() returns, which the follower then acks."""
    cut = PowerCut(tmp_path, monkeypatch)
    follower = tmp_path / "follower"
    writer = ReplicaWriter(follower)
    segment, stream = "messages/0000000000.seg", "streams/abc/00000000000000000000.seg"
    writer.apply([(1, [(APPEND, segment, b"a"), (APPEND, stream, b"s"), (APPEND, DEFINITIONS_LOG, b"d")])])
    assert cut.lost(*(follower / path for path in (segment, stream, DEFINITIONS_LOG))) == []
    writer.apply([(2, [(REPLACE, "streams/new/00000000000000000000.seg", b"r"), (REPLACE, segment, b"c")])])
    assert cut.lost(follower / "streams/new/00000000000000000000.seg", follower / segment) == []
    writer.apply([(3, [(RESET, "", b""), (APPEND, segment, b"copy"), (APPEND, stream, b"copy")])])
    assert cut.lost(follower / segment, follower / stream) == []
    writer.close()
