"""A deep queue's paged ready list: entries past the in-memory threshold go to page files and come back in order,
with what their queue entries knew, read ahead of consumers or at once when needed; pages on disk are deleted once
read, and a page whose write fails stays in memory."""

import asyncio
import functools
import logging

import pytest
from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.features import paging
from broker.model.features.paging import PagedEntries, decode, encode
from broker.model.features.ready import FifoEntries
from protocol.codec import encode_header_payload
from storage import pages
from storage.pages import PageStore

BODY = b"b" * 4000  # big enough that a few entries fill a page of the size the tests set


def entry(seq: int, body: bytes = BODY, msg_id: int = 0, persistent: bool = False) -> messages.QueueEntry:
    header = messages.Header(encode_header_payload(len(body), Basic.Properties(delivery_mode=2 if persistent else 1)))
    return messages.QueueEntry(seq, messages.Message(messages.Address("ex", "key"), header, body, msg_id))


def in_loop(test):
    """Run an async test in an event loop of its own."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(paging, "PAGE_BYTES", 10_000)  # two or three entries per page
    page_store = PageStore(tmp_path / "pages", chunk_bytes=30_000)
    page_store.start()
    yield page_store
    page_store.close()


def paged_list(store: PageStore, in_memory: int = 4) -> tuple[PagedEntries, list[list[int]]]:
    back: list[list[int]] = []  # the seqs of each batch the queue is told is back in memory
    return PagedEntries(FifoEntries(), store.open(), in_memory, lambda entries: back.append([e.seq for e in entries])), back


async def settle(store: PageStore) -> None:
    """Let the page thread finish what it was given and its reports reach the loop."""
    done = asyncio.get_running_loop().create_future()
    store.submit(lambda: None, done=lambda _result, _error: done.set_result(None))
    await done
    await asyncio.sleep(0)


def page_files(store: PageStore) -> list[str]:
    return sorted(path.name for path in store.directory.iterdir())


def test_a_record_keeps_what_the_entry_knew_and_consecutive_messages_share_address_and_header():
    first, second = entry(7, b"one", msg_id=41, persistent=True), entry(8, b"two", msg_id=42, persistent=True)
    first.redelivered, first.expires_at, first.acquired_count, first.delivery_count = True, 123456, 3, 2
    data = bytearray()
    encode(first, data)
    encode(second, data)
    one, two = decode(bytes(data))
    assert [one.seq, one.redelivered, one.expires_at, one.acquired_count, one.delivery_count] == [7, True, 123456, 3, 2]
    assert [one.message.msg_id, one.message.body, one.message.exchange, one.message.routing_key] == [
        41, b"one", "ex", "key"]
    assert one.message.persistent and two.message.body == b"two" and not two.redelivered
    assert two.message.address is one.message.address and two.message.header is one.message.header


@in_loop
async def test_entries_past_the_threshold_are_paged_and_come_back_in_order(store):
    entries, back = paged_list(store)
    assert [entries.append(entry(seq)) for seq in range(12)] == [False] * 4 + [True] * 8
    assert (len(entries), len(entries.inner), entries.paged, entries.paged_bytes) == (12, 4, 8, 8 * len(BODY))
    await settle(store)
    assert page_files(store)  # the sealed pages were written
    taken = []
    while entries:
        taken.append(entries.popleft().seq)
        await settle(store)  # read-ahead happens on the page thread
    assert taken == list(range(12))
    assert sum(back, []) == list(range(4, 12))
    await settle(store)
    assert page_files(store) == []  # every chunk was deleted once read


@in_loop
async def test_a_page_of_small_messages_is_sealed_at_page_entries_and_comes_back_whole(store, monkeypatch):
    """However small the messages, a page holds PAGE_ENTRIES at most: each page read back makes its entries in one
    turn of the event loop."""
    monkeypatch.setattr(paging, "PAGE_ENTRIES", 5)
    entries, back = paged_list(store, in_memory=1)
    for seq in range(13):
        entries.append(entry(seq, b"small"))
    assert [page.count for page in entries.pages] == [5, 5] and entries.filling.count == 2
    assert [entries.popleft().seq for _ in range(13)] == list(range(13))
    assert back == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12]]


@in_loop
async def test_the_next_page_is_read_at_once_when_memory_runs_dry(store):
    entries, _ = paged_list(store, in_memory=1)
    for seq in range(9):
        entries.append(entry(seq))
    await settle(store)
    assert [entries.popleft().seq for _ in range(9)] == list(range(9))  # no loop turn between takes
    assert not entries and entries.paged == 0


@in_loop
async def test_requeued_entries_go_before_the_paged_ones(store):
    entries, _ = paged_list(store, in_memory=2)
    for seq in range(8):
        entries.append(entry(seq))
    first, second = entries.popleft(), entries.popleft()
    entries.put_back([first, second])
    await settle(store)
    assert [entries.popleft().seq for _ in range(8)] == list(range(8))


@in_loop
async def test_new_arrivals_wait_behind_the_paged_ones_until_all_are_back(store):
    entries, _ = paged_list(store, in_memory=2)
    for seq in range(6):
        entries.append(entry(seq))
    await settle(store)
    assert entries.popleft().seq == 0
    assert entries.append(entry(6))  # still paged: others wait on disk before it
    taken = [entries.popleft().seq for _ in range(6)]
    assert taken == [1, 2, 3, 4, 5, 6]
    assert not entries.append(entry(7))  # nothing paged any more: it stays in memory


@in_loop
async def test_take_all_drops_the_pages_and_lists_the_stored_ids_before(store):
    entries, _ = paged_list(store, in_memory=1)
    for seq in range(7):
        entries.append(entry(seq, msg_id=100 + seq if seq % 2 else 0, persistent=bool(seq % 2)))
    assert sorted(entries.stored_ids()) == [101, 103, 105]  # the store ids of the paged entries
    entries.popleft()  # seq 0, the one in memory: the first page (seqs 1-3) comes back at once, from memory
    assert sorted(entries.stored_ids()) == [105]
    assert (entries.paged_persistent, entries.paged_persistent_bytes) == (1, len(BODY))
    await settle(store)
    rest, taken = entries.take_all()
    await settle(store)
    assert (len(entries), list(entries.stored_ids()), page_files(store)) == (0, [], [])
    assert rest is entries and [item.seq for item in taken] == [1, 2, 3]  # the part in memory, handed over


@in_loop
async def test_a_page_whose_write_fails_stays_in_memory(store, monkeypatch, caplog):
    def no_room(_fd, _data, _offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pages, "_write_at", no_room)
    entries, _ = paged_list(store, in_memory=1)
    with caplog.at_level(logging.WARNING, logger="storage.pages"):
        for seq in range(7):
            entries.append(entry(seq))
        await settle(store)
    assert "No space left on device" in caplog.text and caplog.text.count("cannot write page file") == 1
    assert [entries.popleft().seq for _ in range(7)] == list(range(7))


@in_loop
async def test_a_page_that_cannot_be_read_back_is_logged_and_its_entries_are_gone(store, monkeypatch, caplog):
    entries, back = paged_list(store, in_memory=1)
    for seq in range(7):
        entries.append(entry(seq))
    await settle(store)

    def unreadable(_fd, _length, _offset):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(pages, "_read_at", unreadable)
    with caplog.at_level(logging.ERROR, logger="storage.pages"):
        assert entries.popleft().seq == 0
        assert not entries  # asked, it reads the pages at once: none can be read
    assert "cannot read page file" in caplog.text and "Input/output error" in caplog.text
    assert len(entries) == 0  # the unreadable pages' entries left the count with them


