"""The writer never dies silently: a bug nacks its batch and is logged CRITICAL, the store reports its health, and
close() never hangs on a writer that is gone or stuck."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading

import pytest

from storage.compaction import Compaction
from storage.lock import DataDirLocked
from storage.store import MessageStore
from storage.writer import Writer
from tests.unit.storage.storage_support import HANG_GUARD, durable, publish, reopen

def critical_records(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno == logging.CRITICAL]


def test_a_bug_while_writing_nacks_the_batch_logs_critical_and_the_next_batch_is_written(tmp_path, monkeypatch,
                                                                                        caplog):
    real_fdatasync = os.fdatasync
    failing = threading.Event()

    def fdatasync(fd: int) -> None:
        if failing.is_set():
            failing.clear()  # once: undoing the write goes through here too
            raise RuntimeError("a bug in the write path")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    health: list[bool] = []

    async def main() -> None:
        store = MessageStore(tmp_path, on_health=health.append)
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        failing.set()
        publish(store, 1)
        assert await durable(store) is False
        assert store.healthy is False
        publish(store, 2)
        assert await durable(store) is True
        assert store.healthy is True
        store.close()

    asyncio.run(main())
    assert health == [False, True]
    [record] = critical_records(caplog)
    assert "store write failed" in record.getMessage() and record.exc_info[0] is RuntimeError
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [0, 2]


def test_a_bug_in_a_compaction_step_abandons_it_and_batches_go_on(tmp_path, monkeypatch, caplog):
    async def main() -> None:
        loop = asyncio.get_running_loop()
        compaction_failed = asyncio.Event()

        def broken_copy(*args) -> None:
            loop.call_soon_threadsafe(compaction_failed.set)
            raise KeyError("a bug in compaction")

        monkeypatch.setattr(Compaction, "_copy", broken_copy)
        store = MessageStore(tmp_path, segment_bytes=16 * 1024, min_compact_bytes=4 * 1024)
        store.recover()
        for msg_id in range(60):  # about four segments
            publish(store, msg_id, padding=1000)
            assert await durable(store) is True
        store.append_removed("q", range(0, 12))  # most of the first segment: worth a rewrite once it stops losing
        assert await durable(store) is True
        assert await durable(store) is True  # the batch that starts the compaction
        await asyncio.wait_for(compaction_failed.wait(), HANG_GUARD)
        publish(store, 60)
        assert await durable(store) is True
        assert store.stats()["compactions_running"] == 0
        store.close()

    asyncio.run(main())
    assert any("compaction of segment 0 failed" in r.getMessage() for r in critical_records(caplog))
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == list(range(12, 61))


def test_a_writer_thread_that_dies_fails_its_batch_and_every_later_one(tmp_path, monkeypatch, caplog):
    health: list[bool] = []

    def dying_write(self, batch) -> bool:
        raise SystemExit("nothing in the writer catches this")

    async def main() -> None:
        store = MessageStore(tmp_path)
        store.on_health = health.append
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        monkeypatch.setattr(Writer, "_write", dying_write)
        publish(store, 1)
        assert await durable(store) is False
        publish(store, 2)
        assert await durable(store) is False
        assert store.healthy is False
        store.close()  # returns: there is no writer left to wait for

    asyncio.run(main())
    assert health == [False]
    assert any("writer thread died" in r.getMessage() for r in critical_records(caplog))
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [0]


def test_close_does_not_wait_for_ever_on_a_stuck_writer(tmp_path, monkeypatch, caplog):
    real_fdatasync = os.fdatasync
    stuck = threading.Event()
    release = threading.Event()

    def fdatasync(fd: int) -> None:
        if stuck.is_set():
            release.wait(HANG_GUARD)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def main() -> None:
        store = MessageStore(tmp_path, stop_timeout=0.2)
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        stuck.set()
        publish(store, 1)
        store.close()

    try:
        asyncio.run(main())
        assert any("did not stop" in r.getMessage() for r in critical_records(caplog))
        with pytest.raises(DataDirLocked):  # the writer may still write: the data dir stays ours
            MessageStore(tmp_path).recover()
    finally:
        release.set()


def test_health_comes_back_when_the_disk_does_even_if_nothing_is_written(tmp_path, monkeypatch):
    real_write = os.write
    full = threading.Event()

    def write(fd: int, data) -> int:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    health: list[bool] = []

    async def main() -> None:
        healthy_again = asyncio.Event()

        def on_health(healthy: bool) -> None:
            health.append(healthy)
            if healthy:
                healthy_again.set()

        store = MessageStore(tmp_path, on_health=on_health)
        store.recover()
        publish(store, 0)
        assert await durable(store) is True
        full.set()
        publish(store, 1)
        assert await durable(store) is False
        full.clear()
        await asyncio.wait_for(healthy_again.wait(), HANG_GUARD)
        store.close()

    asyncio.run(main())
    assert health == [False, True]
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [0]


def test_a_failed_batch_is_not_retried_in_a_loop(tmp_path, monkeypatch, caplog):
    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        store.append_definition("queue", "q", {"name": "q"})
        assert await durable(store) is True
        monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
        publish(store, 1)
        assert await durable(store) is False
        await asyncio.sleep(0.2)  # room for retries that should not happen
        store.close()

    asyncio.run(main())
    failures = [r for r in caplog.records if r.name == "storage.writer" and "write failed" in r.getMessage()]
    assert len(failures) == 1
