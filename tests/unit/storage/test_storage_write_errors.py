"""A failed write reports callback(False), keeps what was already durable, and lets later batches succeed."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import subprocess

import pytest

from storage.store import MessageStore
from tests.tmpfs import fill
from tests.unit.storage.storage_support import durable, publish, reopen


class FailingDisk:
    """Stands in for os.write (and optionally os.ftruncate) while ``failing`` is set."""

    def __init__(self, monkeypatch, partial: bool = False, truncate_fails: bool = False) -> None:
        self.failing = False
        self._partial = partial  # write half the bytes before failing, like a disk filling up mid-write
        self._write = os.write
        self._truncate = os.ftruncate
        monkeypatch.setattr(os, "write", self.write)
        if truncate_fails:
            monkeypatch.setattr(os, "ftruncate", self.ftruncate)

    def write(self, fd: int, data) -> int:
        if not self.failing:
            return self._write(fd, data)
        if self._partial and len(data) > 1:
            self._partial = False
            return self._write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def ftruncate(self, fd: int, size: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        self._truncate(fd, size)


@pytest.mark.parametrize("partial", [False, True], ids=["nothing-written", "half-written"])
def test_failed_batch_is_nacked_and_later_batches_succeed(tmp_path, monkeypatch, partial):
    disk = FailingDisk(monkeypatch, partial=partial)
    health: list[bool] = []

    async def main() -> None:
        store = MessageStore(tmp_path, on_health=health.append)
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        disk.failing = True
        publish(store, 1)
        store.append_definition("queue", "made-during-failure", {"name": "made-during-failure"})
        assert await durable(store) is False
        assert store.healthy is False
        disk.failing = False
        publish(store, 2)
        store.append_removed("q", [1])  # the broker drops the nacked message; the store already forgot it
        assert await durable(store) is True
        assert store.stats()["failed"] is False
        assert store.healthy is True
        store.close()

    asyncio.run(main())
    assert health == [False, True]
    recovered = reopen(tmp_path)
    assert [m.body for m in recovered.messages["q"]] == [b"m0", b"m2"]
    assert recovered.queues == [{"name": "made-during-failure"}]
    assert recovered.report["torn_tail_bytes"] == 0


def test_a_write_that_cannot_be_undone_fails_every_later_batch_but_keeps_earlier_ones(tmp_path, monkeypatch):
    disk = FailingDisk(monkeypatch, partial=True, truncate_fails=True)
    health: list[bool] = []

    async def main() -> None:
        store = MessageStore(tmp_path, on_health=health.append)
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        disk.failing = True
        publish(store, 1)
        assert await durable(store) is False
        disk.failing = False
        publish(store, 2)
        assert await durable(store) is False
        store.when_durable(lambda ok: None)  # a batch that writes nothing says nothing about the disk
        assert await durable(store) is False
        assert store.stats()["failed"] is True
        assert store.healthy is False
        store.close()

    asyncio.run(main())
    assert health == [False]
    recovered = reopen(tmp_path)
    assert [m.body for m in recovered.messages["q"]] == [b"m0"]
    assert recovered.report["clean_shutdown"] is False


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                            capture_output=True)
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount_point
    subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def test_a_full_disk_nacks_and_the_store_recovers_when_space_returns(tiny_tmpfs):
    filler = tiny_tmpfs / "filler"

    async def main() -> None:
        store = MessageStore(tiny_tmpfs / "data")
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # take every byte that is left
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as error:
            assert error.errno == errno.ENOSPC
        finally:
            os.close(fd)
        store.append_message(1, ("q",), "", "q", b"h", b"big" * 20_000)
        assert await durable(store) is False
        filler.unlink()
        publish(store, 2)
        assert await durable(store) is True
        store.close()

    asyncio.run(main())
    assert [m.body for m in reopen(tiny_tmpfs / "data").messages["q"]] == [b"m0", b"m2"]


async def fill_a_segment(store) -> list[int]:
    """Messages of 4 KB to "q" until the disk refuses one; the ids stored (the store goes on in a fresh segment)."""
    stored = []
    for msg_id in range(1000):
        store.append_message(msg_id, ("q",), "", "q", b"h", b"%d:" % msg_id + b"x" * 4000)
        if not await durable(store):
            return stored
        stored.append(msg_id)
    pytest.fail("the disk never filled")


def test_the_segment_that_filled_the_disk_goes_once_consumed(tiny_tmpfs):
    """Nothing else frees space here: the store must stop appending to the full segment so that it can delete it."""
    data_dir = tiny_tmpfs / "data"

    async def main() -> None:
        store = MessageStore(data_dir)
        store.recover()
        stored = await fill_a_segment(store)
        store.append_removed("q", stored)  # consumed
        await durable(store)  # may fail for want of room, but the spent segment goes with the batch after it
        await durable(store)
        for msg_id in range(2000, 2010):  # more than was free when the disk filled
            store.append_message(msg_id, ("q",), "", "q", b"h", b"%d:" % msg_id + b"x" * 4000)
            assert await durable(store) is True
        assert store.healthy is True
        store.close()

    asyncio.run(main())
    assert [m.msg_id for m in reopen(data_dir).messages["q"]] == list(range(2000, 2010))


def test_a_removal_with_no_byte_left_makes_room_by_deleting_the_segment_it_empties(tiny_tmpfs):
    """Not even the removal records fit: the batch fails, and frees the segment they empty for the next one."""
    data_dir = tiny_tmpfs / "data"

    async def main() -> None:
        store = MessageStore(data_dir)
        store.recover()
        stored = await fill_a_segment(store)
        fill(tiny_tmpfs)  # every byte left
        store.append_removed("q", stored)  # consumed
        assert await durable(store) is False
        store.append_definition("queue", "after", {"name": "after"})
        assert await durable(store) is True
        assert store.healthy is True
        store.close()

    asyncio.run(main())
    assert "q" not in reopen(data_dir).messages


def test_a_compaction_the_full_disk_refuses_is_tried_again_after_a_pause_and_said_once(tiny_tmpfs, caplog):
    data_dir = tiny_tmpfs / "data"
    first = data_dir / "messages" / "0000000000.seg"

    async def main() -> list[int]:
        ballast = tiny_tmpfs / "ballast"  # room given back later
        ballast.write_bytes(b"\0" * 65536)
        store = MessageStore(data_dir, min_compact_bytes=1)
        store.recover()
        stored = await fill_a_segment(store)
        fill(tiny_tmpfs)  # every byte left
        full_size = first.stat().st_size
        for msg_id in stored[: len(stored) * 3 // 4]:  # the segment worth compacting, the disk too full for it
            store.append_removed("q", [msg_id])
            await durable(store)
        # (the compaction runs on the writer's time: the room comes back once it has been refused)
        await wait_until(lambda: any("compaction of segment" in record.getMessage() for record in caplog.records),
                         5.0)
        ballast.unlink()
        await wait_until(lambda: first.stat().st_size < full_size, 5.0)  # compacted once the pause is over
        store.append_removed("q", [stored[-1]])
        assert await durable(store) is True
        store.close()
        return stored

    stored = asyncio.run(main())
    failures = [record for record in caplog.records if "compaction of segment" in record.getMessage()]
    assert len(failures) == 1, [record.getMessage() for record in failures]
    assert [message.msg_id for message in reopen(data_dir).messages["q"]] == stored[len(stored) * 3 // 4:-1]


async def wait_until(condition, seconds: float) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within %s s" % seconds
        await asyncio.sleep(0.05)


def test_writes_that_fail_and_succeed_in_turn_are_said_once_not_at_each_turn(tmp_path, monkeypatch, caplog):
    """On a full disk a small write fits and a big one does not, one of each per client action: the log says the
    failure once (then again at most every storage.writer.FAILURE_SAID_EVERY), not at each of them."""
    disk = FailingDisk(monkeypatch)

    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        for msg_id in range(50):
            disk.failing = msg_id % 2 == 1
            publish(store, msg_id)
            assert await durable(store) is not disk.failing
        store.close()

    asyncio.run(main())
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert sum("store write failed" in line for line in said) == 1, said
    assert sum("store writes are failing" in line for line in said) == 1, said
    assert sum("store writes succeed again" in line for line in said) == 1, said


def test_a_callback_asked_for_while_its_bytes_are_being_written_hears_that_they_failed(tmp_path, monkeypatch):
    """The message's batch is handed to the writer before the callback is asked for, which so goes with the next
    batch: that one writes nothing and succeeds, but the message is not on disk, and the callback must say so."""
    disk = FailingDisk(monkeypatch)

    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        disk.failing = True
        publish(store, 1)
        await asyncio.sleep(0)  # the batch with the message is handed over
        assert await durable(store) is False
        disk.failing = False
        publish(store, 2)
        assert await durable(store) is True
        store.close()

    asyncio.run(main())
    assert [message.msg_id for message in reopen(tmp_path).messages["q"]] == [2]
