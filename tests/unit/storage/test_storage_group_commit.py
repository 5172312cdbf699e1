"""Group commit: appends made while a write+fsync runs share the next one; a lone append is written at once."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from storage.store import MessageStore


def counting_fdatasync(monkeypatch, gate: threading.Event | None = None):
    """Count fdatasync calls; with a gate, the first call waits until the gate opens."""
    calls: list[int] = []
    entered = threading.Event()
    original = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        entered.set()
        if gate is not None:
            assert gate.wait(timeout=30)
        original(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    return calls, entered


def test_appends_made_during_an_fsync_share_the_next_one(tmp_path, monkeypatch):
    gate = threading.Event()
    calls, entered = counting_fdatasync(monkeypatch, gate)
    results: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = MessageStore(tmp_path)
        store.recover()
        all_done = loop.create_future()

        def confirmed(ok: bool) -> None:
            results.append(ok)
            if len(results) == 1001:
                all_done.set_result(None)

        store.append_message(0, ("q",), "", "q", b"h", b"first")
        store.when_durable(confirmed)
        await loop.run_in_executor(None, entered.wait)  # the writer is inside the first fdatasync
        for msg_id in range(1, 1001):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"x" * 100)
            store.when_durable(confirmed)
            if msg_id % 10 == 0:
                await asyncio.sleep(0)  # let other loop callbacks run, as a busy broker would
        gate.set()
        await all_done
        assert store.stats()["batches"] == 2
        store.close()

    asyncio.run(main())
    assert results == [True] * 1001
    assert len(calls) == 2  # one per batch: the first message alone, then the 1000 that queued behind it


def test_a_lone_append_is_written_at_once(tmp_path, monkeypatch):
    calls, _ = counting_fdatasync(monkeypatch)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        store = MessageStore(tmp_path)
        store.recover()
        started = time.perf_counter()
        for msg_id in range(50):
            done = loop.create_future()
            store.append_message(msg_id, ("q",), "", "q", b"h", b"alone")
            store.when_durable(done.set_result)
            assert await done is True
        elapsed = time.perf_counter() - started
        assert store.stats()["batches"] == 50
        store.close()
        return elapsed

    elapsed = asyncio.run(main())
    assert len(calls) == 50  # one fdatasync per lone append, none at close (nothing pending)
    assert elapsed < 1.0  # no timer: 50 round trips cost 50 fsyncs, not 50 ticks


def test_callbacks_run_in_order_and_one_failing_callback_does_not_stop_the_others(tmp_path):
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        store = MessageStore(tmp_path)
        store.recover()
        done = loop.create_future()

        def broken(ok: bool) -> None:
            order.append("broken")
            raise RuntimeError("callback bug")

        store.append_message(0, ("q",), "", "q", b"h", b"x")
        store.when_durable(lambda ok: order.append("first"))
        store.when_durable(broken)
        store.when_durable(lambda ok: order.append("third"))
        store.when_durable(done.set_result)
        await done
        assert store.callback_errors == 1
        store.close()

    asyncio.run(main())
    assert order == ["first", "broken", "third"]


def test_when_durable_with_nothing_pending_still_answers(tmp_path):
    async def main() -> bool:
        store = MessageStore(tmp_path)
        store.recover()
        done = asyncio.get_running_loop().create_future()
        store.when_durable(done.set_result)
        ok = await done
        store.close()
        return ok

    assert asyncio.run(main()) is True


def test_a_store_given_its_loop_explicitly_reports_on_it(tmp_path):
    async def main() -> bool:
        store = MessageStore(tmp_path, asyncio.get_running_loop())
        store.recover()
        store.append_message(0, ("q",), "", "q", b"h", b"x")
        done = asyncio.get_running_loop().create_future()
        store.when_durable(done.set_result)
        ok = await asyncio.wait_for(done, timeout=10)
        store.close()
        return ok

    assert asyncio.run(main()) is True
