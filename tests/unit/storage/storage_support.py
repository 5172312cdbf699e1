"""Helpers of the storage tests: run work on a store until durable, wait for a batch, read a data dir back."""

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


async def durable(store: MessageStore) -> bool:
    """Whether everything appended so far was written (the store's when_durable outcome)."""
    done = asyncio.get_running_loop().create_future()
    store.when_durable(done.set_result)
    return await done


def reopen(data_dir: Path, **options) -> Recovered:
    """What a fresh store recovers from data_dir (the store is closed again)."""
    store = MessageStore(data_dir, **options)
    recovered = store.recover()
    store.close()
    return recovered
