"""Backlogs bigger than memory: once a queue holds ``messages_in_memory`` ready messages, the ones that arrive after
them wait on disk in the queue's page file (storage.pages), in pages of about PAGE_BYTES or PAGE_ENTRIES messages,
and memory keeps only a few counters per page. The part in memory is topped up ahead of consumers: when it falls
under half the threshold the next page is read back on the page thread, so deliveries rarely wait for the disk (when
they must, the page is read at once). Pages go to disk in arrival order and come back in that order, behind
everything in memory, so delivery order is the queue's order; requeued messages go back into the part in memory, to
their original positions, which always lie before the paged part.

A paged message keeps what its queue entry knew (place in the queue, redelivered flag, return counts, expiry time);
one with a TTL expires once it is back in memory (as a message in RabbitMQ's classic queues expires only at the
head). Persistent messages also stay in the message store as before; the page copy is the one delivered, and the
store's copy is what a restart recovers (page files are emptied at every start). After a restart, a deep queue's
recovered messages past the threshold are pages too, but pages of the message store's own records (runs of
storage.recovered_messages): nothing is copied to a page file, and a run is read back from its segment like a
page. Priority queues keep every message in memory."""

from __future__ import annotations

import logging
import struct
from array import array
from collections import deque
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Callable, Iterator

from broker.model.message import Address, Header, Message, QueueEntry
from storage.recovered_messages import PLACE_BITS

if TYPE_CHECKING:
    from broker.model.features.expiry import ExpiringEntries
    from broker.model.features.ready import FifoEntries, ReadyList
    from storage.pages import PageFile, PageLocation, PageStore
    from storage.recovered_messages import StoredRun
    from storage.store import MessageStore

log = logging.getLogger(__name__)

PAGE_BYTES = 256 << 10  # a page is sealed and written once its records reach this size
# ... or once it holds this many: a page read back makes an entry a message on the event loop, all in one turn (a
# page of 256 KiB held 3,496 messages of 16 bytes, and took 13 to 25 ms of the loop)
PAGE_ENTRIES = 1024

# A record: seq, msg_id, expires_at, acquired_count, delivery_count, redelivered, and the lengths of the exchange,
# routing key, content header and body that follow it.
RECORD = struct.Struct("<QQqIIBHIIQ")


@dataclass
class Paging:
    """Where a node's queues page and past how many ready messages in memory."""
    store: "PageStore"
    messages_in_memory: int  # ready messages a queue keeps in memory before later ones are paged


def encode(entry: QueueEntry, into: bytearray) -> None:
    message = entry.message
    address, header, body = message.address, message.header.payload, message.body
    exchange, routing_key = address.exchange_bytes, address.routing_key_bytes
    into += RECORD.pack(entry.seq, message.msg_id, entry.expires_at, entry.acquired_count, entry.delivery_count,
                        entry.redelivered, len(exchange), len(routing_key), len(header), len(body))
    into += exchange
    into += routing_key
    into += header
    into += body


def decode(data: bytes) -> list[QueueEntry]:
    """The entries of a page, in order; consecutive messages with the same address or header share one object."""
    entries = []
    view = memoryview(data)
    unpack, size = RECORD.unpack_from, RECORD.size
    position, end = 0, len(data)
    address = header = None
    while position < end:
        (seq, msg_id, expires_at, acquired, delivered, redelivered, exchange_length, key_length, header_length,
         body_length) = unpack(data, position)
        position += size
        exchange = data[position:position + exchange_length]
        position += exchange_length
        routing_key = data[position:position + key_length]
        position += key_length
        if address is None or address.exchange_bytes != exchange or address.routing_key_bytes != routing_key:
            address = Address(exchange.decode(), routing_key.decode())
        payload = view[position:position + header_length]
        position += header_length
        if header is None or header.payload != payload:
            header = Header(bytes(payload))
        body = data[position:position + body_length]
        position += body_length
        entry = QueueEntry(seq, Message(address, header, body, msg_id), bool(redelivered), expires_at)
        entry.acquired_count, entry.delivery_count = acquired, delivered
        entries.append(entry)
    return entries


class Page:
    """A run of paged entries: its bytes while being written (or if the write failed), else where they are; or
    recovered messages still in the message store (run)."""

    __slots__ = ("data", "location", "count", "body_bytes", "persistent", "persistent_bytes", "stored_ids",
                 "taken", "run", "restore", "places", "pins", "first_seq")

    def __init__(self):
        self.data: bytearray | bytes | None = bytearray()  # the encoded entries, None once safely on disk
        self.location: "PageLocation | None" = None  # where it was written, None while it fills
        self.count = 0  # entries in it
        self.body_bytes = 0  # their body bytes
        self.persistent = 0  # entries whose message is marked persistent (delivery mode 2)
        self.persistent_bytes = 0  # their body bytes
        self.stored_ids = array("Q")  # store ids of entries whose message is in the message store (8 bytes each)
        self.taken = False  # read back (a read still under way is then ignored)
        self.run: "StoredRun | None" = None  # the recovered messages it stands for, read from the store's segments
        # makes the entries of the run from the bytes it read (their places in the queue and TTLs were settled at
        # restore)
        self.restore: Callable[["StoredRun", bytes], list[QueueEntry]] | None = None
        # while every entry so far can be read back from the message store: where their records are (all in one
        # segment, pinned there for the queue); None once one cannot, or once the run holds the pins
        self.places: array | None = None
        self.pins = 0  # pins it holds on their segment: one while it fills, one per record once sealed
        self.first_seq = 0  # the seq of its first entry (those after it follow one by one while places is kept)


@dataclass
class StoreBacking:
    """How the pages of a queue kept on disk stand for messages that the message store holds for it anyway: such a
    page goes to no page file; once its records are durable it becomes a run of the store
    (storage.recovered_messages)."""

    store: "MessageStore"
    key: str  # the queue's name in the store
    stores_all: bool  # the store holds every message of the queue (a quorum queue's), not only persistent ones
    restore: Callable[[int], Callable[["StoredRun", bytes], list[QueueEntry]]]  # first seq -> makes a run's entries


class PagedEntries:
    """The ready list of a queue that has paged: its part in memory (inner: FIFO, wrapped in ExpiringEntries once
    the queue has held a message with a TTL) followed by pages. Offers what a queue asks of its ready list (append,
    popleft, put_back, take_all, bury, len, truth, iteration); iteration walks the part in memory only, the pages being
    summed up by the counters below. Asked whether it is empty while the part in memory is, it reads the next page
    at once, so that the answer holds for the popleft that follows even if a page cannot be read."""

    __slots__ = ("inner", "file", "in_memory", "low", "pages", "filling", "paged", "paged_bytes",
                 "paged_persistent", "paged_persistent_bytes", "requested", "requested_entries", "paged_in", "backing")

    def __init__(self, inner: "FifoEntries | ExpiringEntries", file: "PageFile", in_memory: int,
                 paged_in: Callable[[list[QueueEntry]], None], backing: StoreBacking | None = None):
        self.inner = inner  # the entries in memory, in delivery order (requeued ones merged in by seq)
        self.file = file  # where sealed pages go
        self.in_memory = in_memory  # entries in memory past which arrivals are paged
        self.low = max(1, in_memory // 2)  # entries in memory under which the next page is read back
        self.pages: deque[Page] = deque()  # sealed pages, oldest first
        self.paged = 0  # entries in pages (including filling)
        self.paged_bytes = 0  # their body bytes
        self.paged_persistent = 0  # of them, messages marked persistent
        self.paged_persistent_bytes = 0  # their body bytes
        self.requested: deque[Page] = deque()  # the oldest pages, being read back on the page thread in order
        self.requested_entries = 0  # entries in them
        self.paged_in = paged_in  # told of entries back in memory (before they are delivered)
        self.backing = backing  # for a queue kept on disk: how pages of stored messages stay in the store
        # the page arrivals go to (read back from memory if reached before it is sealed)
        self.filling = self._new_page()

    def __len__(self) -> int:
        return len(self.inner) + self.paged

    def __bool__(self) -> bool:
        if not self.inner and self.paged:
            self._page_in_now()
        return bool(self.inner)

    def __iter__(self) -> Iterator[QueueEntry]:
        """The entries in memory (the paged ones are in the counters)."""
        return iter(self.inner)

    def append(self, entry: QueueEntry) -> bool:
        """Add entry at the tail; True if it was paged (the queue then keeps no reference to it)."""
        if not self.paged and len(self.inner) < self.in_memory:
            self.inner.append(entry)
            return False
        page = self.filling
        encode(entry, page.data)
        message = entry.message
        size = len(message.body)
        page.count += 1
        page.body_bytes += size
        self.paged += 1
        self.paged_bytes += size
        if message.header.scan.delivery_mode == 2:
            page.persistent += 1
            page.persistent_bytes += size
            self.paged_persistent += 1
            self.paged_persistent_bytes += size
        if message.msg_id:
            page.stored_ids.append(message.msg_id)
        places = page.places
        if places is not None:
            where = message.place
            follows = not places or (entry.seq == page.first_seq + len(places)
                                     and where >> PLACE_BITS == places[0] >> PLACE_BITS)  # the segment's next record
            if follows and self._readable_from_store(entry):
                if not places:
                    page.first_seq = entry.seq
                    self.backing.store.pin(self.backing.key, where, 1)  # the segment waits while the page fills
                    page.pins = 1
                places.append(where)
            else:
                self._unpin(page)
        if len(page.data) >= PAGE_BYTES or page.count >= PAGE_ENTRIES:
            self._seal()
        return True

    def _new_page(self) -> Page:
        page = Page()
        if self.backing is not None:
            page.places = array("Q")
        return page

    def _readable_from_store(self, entry: QueueEntry) -> bool:
        """Whether entry, added to a page, can be read back from the message store (if it follows the page's other
        records there, which the caller checks): its very message was written there for this queue, and the entry
        is fresh (no TTL, never delivered)."""
        message = entry.message
        return (message.place >= 0 and (self.backing.stores_all or message.header.scan.delivery_mode == 2)
                and not entry.expires_at and not entry.redelivered and not entry.acquired_count)

    def _unpin(self, page: Page) -> None:
        """page is no longer to be read back from the store."""
        if page.pins:
            self.backing.store.unpin(self.backing.key, page.places[0], page.pins)
            page.pins = 0
        page.places = None

    def add_stored(self, run: "StoredRun", restore: Callable[["StoredRun", bytes], list[QueueEntry]]) -> None:
        """Recovered messages still in the message store join the tail as a page (at restore, before any arrival
        is paged); restore makes their entries once they are read."""
        page = Page()
        page.data = None
        page.run, page.restore = run, restore
        page.count = len(run)
        page.body_bytes, page.persistent, page.persistent_bytes = run.body_bytes, run.persistent, run.persistent_bytes
        page.stored_ids = run.ids
        self.pages.append(page)
        self.paged += page.count
        self.paged_bytes += page.body_bytes
        self.paged_persistent += page.persistent
        self.paged_persistent_bytes += page.persistent_bytes

    def _seal(self) -> None:
        page, self.filling = self.filling, self._new_page()
        page.data = bytes(page.data)
        self.pages.append(page)
        if page.places:  # every entry is in the store: the page waits in memory until their records are durable
            self.backing.store.pin(self.backing.key, page.places[0], len(page.places) - page.pins)
            page.pins = len(page.places)
            self.backing.store.when_durable(lambda ok: self._stored(page, ok))
        else:
            self._write(page)

    def _stored(self, page: Page, ok: bool) -> None:
        """The records of page's messages are durable (ok) or could not be written: it becomes a run of the store,
        or goes to the page file after all."""
        if page.taken:
            return  # read back from memory meanwhile (its pins went then)
        if not ok:
            self._unpin(page)
            self._write(page)
            return
        backing = self.backing
        page.run = backing.store.run_of(backing.key, page.stored_ids, page.places, page.body_bytes, page.persistent,
                                        page.persistent_bytes)
        page.restore = backing.restore(page.first_seq)
        page.places, page.pins = None, 0  # the run holds the pins now
        page.data = None

    def _write(self, page: Page) -> None:
        def written(ok: bool) -> None:
            if ok and not page.taken:
                page.data = None  # on disk: memory lets it go
            else:  # back already, or kept in memory since the write failed: the disk copy is not needed
                self.file.release(page.location)

        page.location = self.file.write(page.data, written)

    def popleft(self) -> QueueEntry:
        inner = self.inner
        if not inner and self.paged:
            self._page_in_now()
        entry = inner.popleft()
        if self.paged and len(inner) + self.requested_entries < self.low:
            self._read_ahead()
        return entry

    def top_up(self) -> None:
        """Entries left the part in memory other than from the head (they expired): read pages back if it runs
        low."""
        if self.paged and len(self.inner) + self.requested_entries < self.low:
            self._read_ahead()

    def _read_ahead(self) -> None:
        """Ask for the pages after those asked for already, until they would bring the part in memory back over
        its low mark: those on disk are read on the page thread, one after the other (several may be on their
        way, so that one loop turn need not wait for the next); one still in memory comes back at once, once
        nothing before it is on its way."""
        requested, pages = self.requested, self.pages
        while len(self.inner) + self.requested_entries < self.low:
            if len(requested) < len(pages):
                page = pages[len(requested)]
            elif self.filling.count and not requested:
                page = self.filling
            else:
                return
            if page.data is not None:
                if requested:
                    return  # after the pages on their way
                self._arrived(page, page.data)
                continue
            requested.append(page)
            self.requested_entries += page.count
            if page.run is not None:  # only the file work on the thread: decoding there would wait for the loop
                self.file.store.submit(_fetch_run, page.run,
                                       done=lambda data, _, page=page: self._read_done(page, data))
            else:
                self.file.read(page.location, lambda data, page=page: self._read_done(page, data))

    def _read_done(self, page: Page, data: bytes | None) -> None:
        if page.taken:
            return  # taken meanwhile (read at once, or dropped by a purge)
        self._arrived(page, data)
        if self.paged:
            self.top_up()

    def _page_in_now(self) -> None:
        """The part in memory is empty and the next page is needed now: read it here, on the loop."""
        while not self.inner and self.paged:
            page = self.pages[0] if self.pages else self.filling
            if page.data is not None:
                self._arrived(page, page.data)
            elif page.run is not None:
                self._arrived(page, _fetch_run(page.run))
            else:
                self._arrived(page, self.file.read_now(page.location))

    def _arrived(self, page: Page, data: bytes | None) -> None:
        """page is back: its bytes, or its run's (data None: it could not be read, and its messages are lost to this
        run; persistent ones come back after a restart, from the message store)."""
        page.taken = True
        if page is self.filling:
            self.filling = self._new_page()
        else:
            self.pages.popleft()
        if self.requested and self.requested[0] is page:
            self.requested.popleft()
            self.requested_entries -= page.count
        if page.location is not None and page.data is None:
            self.file.release(page.location)  # else written() releases it once its write ends
        if page.run is not None:
            page.run.release()  # the store may compact its segment again
        elif page.places:
            self._unpin(page)
        self.paged -= page.count
        self.paged_bytes -= page.body_bytes
        self.paged_persistent -= page.persistent
        self.paged_persistent_bytes -= page.persistent_bytes
        if data is None:
            return
        if page.run is not None:
            entries = page.restore(page.run, data)
            page.run = page.restore = None
        else:
            entries = decode(bytes(data) if isinstance(data, bytearray) else data)  # a filling page is a bytearray
        inner = self.inner  # (after restore, which may have made it an ExpiringEntries)
        for entry in entries:
            inner.append(entry)
        self.paged_in(entries)

    def stored_ids(self) -> Iterator[int]:
        """Store ids of the paged messages that are in the message store, those of the pages held now (a take_all()
        after this leaves them to be read)."""
        return chain.from_iterable([page.stored_ids for page in (*self.pages, self.filling)])

    def put_back(self, requeued: list[QueueEntry]) -> None:
        self.inner.put_back(requeued)

    def bury(self, entry: QueueEntry) -> None:
        """entry expired in the part in memory (see features.expiry)."""
        self.inner.bury(entry)

    def take_all(self) -> tuple[PagedEntries, ReadyList]:
        """Everything at once (see features.ready): the part in memory handed over, the pages dropped."""
        self.inner, taken = self.inner.take_all()
        for page in (*self.pages, self.filling):
            page.taken = True
            if page.run is not None:
                page.run.release()
            elif page.places:
                self._unpin(page)
            page.run = page.restore = None
        self.pages.clear()
        self.filling = self._new_page()
        self.file.discard()
        self.requested.clear()
        self.requested_entries = 0
        self.paged = self.paged_bytes = self.paged_persistent = self.paged_persistent_bytes = 0
        return self, taken


def _fetch_run(run: "StoredRun") -> bytes | None:
    """A run's bytes (on the page thread, or on the loop when its messages are needed at once); None if its segment
    cannot be read (logged)."""
    try:
        return run.fetch()
    except OSError as error:
        log.error("cannot read recovered messages back from the message store: %s", error)
        return None
