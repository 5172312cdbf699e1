"""Helpers of the storage tests: run work on a store until durable, publish, wait for a batch, read a data dir
back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from storage.recovery import Recovered
from storage.store import MessageStore


def run(data_dir: Path, work, **options) -> None:
    """Open the store, recover, run ``work(store)`` on a loop, wait until durable, close."""

    async def main() -> None:
        store = MessageStore(data_dir, **options)
        store.recover()
        work(store)
        assert await durable(store) is True
        store.close()

    asyncio.run(main())


HANG_GUARD = 30.0  # seconds: only a writer that stopped answering takes this long


async def durable(store: MessageStore) -> bool:
    """Whether everything appended so far was written (the store's when_durable outcome)."""
    done = asyncio.get_running_loop().create_future()
    store.when_durable(done.set_result)
    return await asyncio.wait_for(done, HANG_GUARD)


def publish(store: MessageStore, msg_id: int, padding: int = 0) -> None:
    """A message of body b"m<msg_id>" (then padding bytes) to the durable queue "q"."""
    store.append_message(msg_id, ("q",), "", "q", b"h", b"m%d" % msg_id + b"x" * padding)


def reopen(data_dir: Path, **options) -> Recovered:
    """What a fresh store recovers from data_dir (the store is closed again)."""
    store = MessageStore(data_dir, **options)
    recovered = store.recover()
    store.close()
    return recovered
