"""The pages of a queue kept on disk whose messages the message store holds for it stay in the store: no page file is
written; once their records are durable they are read back from the store's segments, in order, and the segments
they pin are let go once they are read (or the page came back from memory first, or was dropped)."""

import asyncio
import errno
import os

import pytest

from broker.model import message as messages
from broker.model.durability import StoredToMessage
from broker.model.features import paging
from broker.model.features.paging import PagedEntries, StoreBacking
from broker.model.features.ready import FifoEntries
from storage.pages import PageStore
from storage.store import MessageStore
from tests.unit.storage.storage_support import durable
from tests.unit.broker.model.test_paging import BODY, entry, page_files, settle

QUEUE = "vhost|q"


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setattr(paging, "PAGE_BYTES", 10_000)  # two or three entries per page
    page_store = PageStore(tmp_path / "pages", chunk_bytes=30_000)
    page_store.start()
    message_store = MessageStore(tmp_path / "data")
    message_store.recover()
    yield message_store, page_store
    message_store.close()
    page_store.close()


def paged_list(message_store: MessageStore, page_store: PageStore) -> PagedEntries:
    as_message = StoredToMessage()

    def restore(first_seq: int):
        def entries(run, data: bytes) -> list[messages.QueueEntry]:
            return [messages.QueueEntry(seq, as_message(stored), stored.redelivered)
                    for seq, stored in enumerate(run.messages(data), first_seq)]
        return entries

    backing = StoreBacking(message_store, QUEUE, False, restore)
    return PagedEntries(FifoEntries(), page_store.open(), 4, lambda entries: None, backing)


def stored_entry(message_store: MessageStore, seq: int, persistent: bool = True) -> messages.QueueEntry:
    """An entry whose message was written to the store for QUEUE (if persistent) as the broker writes it."""
    queued = entry(seq, BODY[:-5] + b"%05d" % seq, msg_id=seq + 1 if persistent else 0, persistent=persistent)
    message = queued.message
    if persistent:
        message.place = message_store.append_message(message.msg_id, (QUEUE,), message.exchange, message.routing_key,
                                                     message.header_payload, message.body)
    return queued


def twelve_paged(message_store: MessageStore, page_store: PageStore) -> PagedEntries:
    """A list with 4 entries in memory and 8 of stored messages in pages."""
    entries = paged_list(message_store, page_store)
    for seq in range(12):
        entries.append(stored_entry(message_store, seq))
    return entries


def pins(message_store: MessageStore) -> list[dict]:
    return [segment.pinned for segment in message_store._index.segments.values() if segment.pinned]


def test_pages_of_stored_messages_are_read_back_from_the_store_and_no_page_file_is_written(stores):
    message_store, page_store = stores

    async def scenario() -> None:
        entries = twelve_paged(message_store, page_store)
        # of the 8 paged ones: a sealed page pins each of its records, the page still filling its segment once
        sealed = sum(page.count for page in entries.pages)
        assert 0 < sealed < 8 and entries.filling.count == 8 - sealed
        assert pins(message_store) == [{QUEUE: sealed + 1}]
        assert await durable(message_store)
        await settle(page_store)
        assert all(page.run is not None and page.data is None for page in entries.pages)  # memory let them go
        assert page_files(page_store) == []
        bodies = [entries.popleft().message.body[-5:] for _ in range(12)]
        assert bodies == [b"%05d" % seq for seq in range(12)]
        assert not entries and pins(message_store) == []

    asyncio.run(scenario())


def test_a_page_read_back_from_memory_before_its_records_are_durable_lets_its_pins_go(stores):
    message_store, page_store = stores

    async def scenario() -> None:
        entries = twelve_paged(message_store, page_store)
        assert [entries.popleft().seq for _ in range(12)] == list(range(12))  # before any batch was written
        assert pins(message_store) == []
        assert await durable(message_store)
        await settle(page_store)
        assert page_files(page_store) == []

    asyncio.run(scenario())


def test_pages_the_store_cannot_hold_or_did_not_write_go_to_the_page_file(stores, monkeypatch):
    message_store, page_store = stores
    disk_full = False  # while set, the message store's writes fail (the page store writes with os.pwrite)
    write = os.write

    def store_write(fd: int, data) -> int:
        if disk_full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "write", store_write)

    async def scenario() -> None:
        nonlocal disk_full
        entries = paged_list(message_store, page_store)
        for seq in range(10):  # 0-3 stay in memory; pages of 3: 4-6, then 7-9 with a transient message, 8
            entries.append(stored_entry(message_store, seq, persistent=seq != 8))
        assert await durable(message_store)
        await settle(page_store)
        disk_full = True
        for seq in range(10, 14):  # a page of 10-12 whose records were not written; 13 waits in the filling page
            entries.append(stored_entry(message_store, seq))
        assert not await durable(message_store)
        disk_full = False
        await settle(page_store)
        assert [(page.run is not None, page.location is not None) for page in entries.pages] == [
            (True, False), (False, True), (False, True)]
        assert [entries.popleft().seq for _ in range(14)] == list(range(14))
        assert pins(message_store) == []

    asyncio.run(scenario())


def test_dropping_the_pages_lets_their_pins_go(stores):
    message_store, page_store = stores

    async def scenario() -> None:
        entries = twelve_paged(message_store, page_store)
        assert await durable(message_store)
        await settle(page_store)
        entries.take_all()
        assert pins(message_store) == [] and len(entries) == 0

    asyncio.run(scenario())
