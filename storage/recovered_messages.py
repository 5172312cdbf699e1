"""A queue's messages as recovery found them, kept as columns (message id, where its record is, body size) rather
than as one object per message, and read back from their segments when the broker asks: all at once, or in runs
that a deep queue pages in one at a time. So a restart with millions of queued messages neither builds millions of
objects nor copies their bodies anywhere before the broker serves.

A segment holding recovered messages that are yet to be read back is pinned in the index for their queue: the store
does not compact it meanwhile, since that would move their records (it may still delete it, once nothing in it is
live: then nobody reads it). Deleting the queue unpins it. A run reads only its own byte range, with a file opened
for that read alone, so a deep backlog holds no file descriptor and no memory mapping. Recovery checked every
record against its CRC; read back, a record is checked to be the publish of the message expected there, not
against its CRC again (nor are a page file's pages: a CRC per message would cost a deep queue's drain a quarter of
its rate).
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import compress
from pathlib import Path
from typing import TypeVar

from storage import records
from storage.index import MessageIndex
from storage.segments import segment_path

log = logging.getLogger(__name__)

PLACE_BITS = 40  # a place is (segment number << PLACE_BITS) | offset of the record's frame in the segment
_OFFSET_MASK = (1 << PLACE_BITS) - 1
T = TypeVar("T")


def place(number: int, offset: int) -> int:
    return (number << PLACE_BITS) | offset


class StoredMessage:
    """A message read back from the store, for one queue."""

    __slots__ = ("msg_id", "exchange", "routing_key", "header_payload", "body", "redelivered")

    def __init__(self, msg_id: int, exchange: str, routing_key: str, header_payload: bytes, body: bytes,
                 redelivered: bool):
        self.msg_id = msg_id  # broker-wide id, assigned by the broker, increasing
        self.exchange = exchange
        self.routing_key = routing_key
        self.header_payload = header_payload  # raw AMQP content-header payload (class 60, ... , properties)
        self.body = body
        self.redelivered = redelivered  # it had been delivered from this queue before the stop


REDELIVERED = 1  # a message's flag: delivered from its queue before the stop
REMOVED = 2  # removed from its queue by a later record (dropped from the columns by drop_removed())
TRANSIENT = 4  # not marked persistent (a quorum queue stores those too)
_REDELIVERED_BIT = bytes(flags & REDELIVERED for flags in range(256))  # flags -> their REDELIVERED bit alone
_TRANSIENT_BIT = bytes(flags & TRANSIENT for flags in range(256))  # flags -> their TRANSIENT bit alone
_NOT_REMOVED = bytes(not flags & REMOVED for flags in range(256))  # flags -> 1 unless REMOVED
# positions drop_removed() compacts at once: compress() runs in C, keeping the interpreter throughout (4 million at
# once held a follower's event loop 0.27 s, as its standby swept what a nack had removed)
SWEEP_SLICE = 1 << 16


class RecoveredMessages:
    """One queue's recovered messages in queue order (= id order, as are their places).

    What later records say of a message is a flag beside it (``flags``), not a set of ids: a set of the ids of
    millions of deliveries grew by rehashing itself whole, up to a second at a time on a busy follower, holding its
    interpreter (and the replication stream's acks) meanwhile."""

    __slots__ = ("queue", "ids", "places", "sizes", "flags", "removed", "transient_ids", "segments_dir", "index",
                 "found")

    def __init__(self, queue: str, segments_dir: Path, index: MessageIndex) -> None:
        self.queue = queue  # the queue's name in the store
        self.ids = array("Q")  # message ids, ascending
        self.places = array("Q")  # where each record is (place()), ascending too
        self.sizes = array("I")  # body bytes of each
        self.flags = bytearray()  # REDELIVERED, REMOVED and TRANSIENT bits of each
        self.removed = 0  # messages flagged REMOVED
        self.transient_ids = array("Q")  # ids of the TRANSIENT ones, sorted, once finish() has gathered them
        self.segments_dir = segments_dir
        self.index = index  # the store's, where the segments holding these messages are pinned
        self.found = -1  # position in ids of the id positions() found last

    def add(self, msg_id: int, where: int, size: int, persistent: bool, delivered: bool) -> None:
        self.ids.append(msg_id)
        self.places.append(where)
        self.sizes.append(size)
        self.flags.append((REDELIVERED if delivered else 0) | (0 if persistent else TRANSIENT))

    def add_run(self, first_id: int, places: list[int], sizes: list[int], persistent: bool, delivered: bool) -> None:
        """Messages with the ids from first_id on, at places, with those body sizes, all flagged alike."""
        self.ids.extend(range(first_id, first_id + len(places)))
        self.places.extend(places)
        self.sizes.extend(sizes)
        self.flags.extend(bytes(((REDELIVERED if delivered else 0) | (0 if persistent else TRANSIENT),)) * len(places))

    def positions(self, msg_ids: Sequence[int]) -> list[int]:
        """Where those of msg_ids that are among these messages are in the columns, in the order given."""
        ids = self.ids
        count = len(ids)
        found = self.found
        positions = []
        for msg_id in msg_ids:
            position = found + 1  # acks mostly come in queue order: the id after the one found last comes first
            if not (position < count and ids[position] == msg_id):
                position = bisect_left(ids, msg_id)
                if not (position < count and ids[position] == msg_id):
                    continue
            found = position
            positions.append(position)
        self.found = found
        return positions

    def flag(self, positions: Sequence[int], msg_ids: Sequence[int], flag: int) -> None:
        """Flag the messages msg_ids, found at positions: msg_ids are the ids of some of those positions, in their
        order (what the index said of the ids there: live, or not yet delivered)."""
        ids, flags = self.ids, self.flags
        taken = 0
        for position in positions:
            if taken == len(msg_ids):
                break
            if ids[position] == msg_ids[taken]:
                taken += 1
                if flag == REMOVED and not flags[position] & REMOVED:
                    self.removed += 1
                flags[position] |= flag

    def remove(self, queue: str, positions: list[int]) -> list[int]:
        """Remove the messages at positions (in order) from queue in the index (this queue, or the one that adopted
        them), flagging REMOVED those it held; the ids it removed."""
        ids = self.ids
        # (the ids as a generator: the index is compiled and would keep the interpreter throughout a list, as it did
        # 0.9 to 1.1 s for a deleted queue's 4 million messages, holding a follower's event loop and its stream)
        removed = self.index.remove(queue, (ids[position] for position in positions))
        self.flag(positions, removed, REMOVED)
        return removed

    def gone(self, queue: str, positions: list[int]) -> None:
        """The messages at positions (in order) are gone with their segment: removed from queue in the index where
        it holds them, and flagged REMOVED all."""
        ids = self.ids
        self.index.remove(queue, (ids[position] for position in positions))  # (a generator: see remove())
        self.flag(positions, [ids[position] for position in positions], REMOVED)

    def deliver(self, queue: str, positions: list[int]) -> None:
        """The messages at positions (in order) were delivered from queue: flagged REDELIVERED where the index
        says they were not delivered before."""
        ids = self.ids
        self.flag(positions, self.index.deliver(queue, (ids[position] for position in positions)), REDELIVERED)

    def moved(self, number: int, dropped: list[tuple[int, int]]) -> None:
        """Byte ranges (sorted, disjoint) were taken out of segment number: its records after them moved up."""
        places = self.places
        starts = [start for start, _ in dropped]
        shifts = [0]  # bytes taken out before each range's end
        for start, end in dropped:
            shifts.append(shifts[-1] + end - start)
        for position in range(bisect_left(places, place(number, 0)), bisect_left(places, place(number + 1, 0))):
            offset = places[position] & _OFFSET_MASK
            places[position] -= shifts[bisect_right(starts, offset)]

    def drop_removed(self) -> None:
        """Drop the removed messages from the columns, SWEEP_SLICE positions at a time."""
        if self.removed:
            ids, places, sizes, flags = array("Q"), array("Q"), array("I"), bytearray()
            for start in range(0, len(self.ids), SWEEP_SLICE):
                end = start + SWEEP_SLICE
                sliced = self.flags[start:end]
                kept = sliced.translate(_NOT_REMOVED)
                ids.extend(compress(self.ids[start:end], kept))
                places.extend(compress(self.places[start:end], kept))
                sizes.extend(compress(self.sizes[start:end], kept))
                flags.extend(compress(sliced, kept))
            self.ids, self.places, self.sizes, self.flags = ids, places, sizes, flags
            self.removed = 0
            self.found = -1

    def absorb(self, other: "RecoveredMessages") -> None:
        """other's messages (those a transaction held for this queue, which adopted them) join these, in id order
        (before finish())."""
        self.drop_removed()
        other.drop_removed()
        if not self.ids or not other.ids or other.ids[0] > self.ids[-1]:
            self.ids.extend(other.ids)
            self.places.extend(other.places)
            self.sizes.extend(other.sizes)
            self.flags.extend(other.flags)
            return
        ids, places, sizes = self.ids + other.ids, self.places + other.places, self.sizes + other.sizes
        flags = self.flags + other.flags
        order = sorted(range(len(ids)), key=ids.__getitem__)
        self.ids = array("Q", [ids[position] for position in order])
        self.places = array("Q", [places[position] for position in order])
        self.sizes = array("I", [sizes[position] for position in order])
        self.flags = bytearray(flags[position] for position in order)
        self.found = -1

    def finish(self) -> int:
        """Drop the removed messages from the columns and pin the segments of the rest; return how many are
        left."""
        self.drop_removed()
        self.transient_ids = array("Q", compress(self.ids, self.flags.translate(_TRANSIENT_BIT)))
        places, start = self.places, 0
        while start < len(places):
            number = places[start] >> PLACE_BITS
            end = bisect_left(places, place(number + 1, 0), start)
            self.index.pin(number, self.queue, end - start)
            start = end
        return len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __iter__(self) -> Iterator[StoredMessage]:
        for run in self.runs(0):
            yield from run.read_and_release()

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages start..stop-1, read now."""
        return [message for run in self.runs(start, stop=stop) for message in run.read_and_release()]

    def runs(self, start: int, max_bytes: int = 1 << 20, stop: int | None = None,
             max_messages: int | None = None) -> Iterator["StoredRun"]:
        """Messages start..stop-1 (to the end by default) as runs of records that lie within max_bytes of each other
        in one segment, max_messages at most (a run holds at least one message). Each run must be released once
        read, or once its messages are dropped unread."""
        places = self.places
        stop = len(places) if stop is None else stop
        while start < stop:
            first = places[start]
            end = min(stop, bisect_left(places, first + max_bytes, start),
                      bisect_left(places, place((first >> PLACE_BITS) + 1, 0), start))
            if max_messages is not None:
                end = min(end, start + max_messages)
            end = max(end, start + 1)
            yield self._run(start, end)
            start = end

    def _run(self, start: int, end: int) -> "StoredRun":
        ids = self.ids[start:end]
        transient_ids = self.transient_ids
        transient = transient_ids[bisect_left(transient_ids, ids[0]):bisect_right(transient_ids, ids[-1])]
        sizes = self.sizes[start:end]
        body_bytes = sum(sizes)
        transient_bytes = sum(sizes[bisect_left(ids, msg_id)] for msg_id in transient)
        places = self.places
        number = places[start] >> PLACE_BITS
        if end < len(places) and places[end] >> PLACE_BITS == number:
            stop = places[end] & _OFFSET_MASK  # the next message's record: the run's last one ends before it
        else:
            segment = self.index.segments.get(number)
            stop = segment.size if segment is not None else None  # the size a recovered segment keeps
        redelivered = set(compress(ids, self.flags[start:end].translate(_REDELIVERED_BIT)))
        return StoredRun(ids, places[start:end], stop, segment_path(self.segments_dir, number), self.index,
                         self.queue, redelivered, body_bytes, len(ids) - len(transient),
                         body_bytes - transient_bytes)


def _stored_message(msg_id: int, metadata: records.Metadata, body: bytes, redelivered: bool) -> StoredMessage:
    _, exchange, routing_key, header_payload = metadata
    return StoredMessage(msg_id, exchange, routing_key, header_payload, body, redelivered)



class StoredRun:
    """Messages of one queue whose records lie close together in one segment, pinned there for it: what a deep
    queue pages in at once from the store (recovered ones, or ones it paged while running). fetch() may run on any
    thread; release() runs on the store's (the event loop's)."""

    __slots__ = ("ids", "places", "stop", "path", "index", "queue", "redelivered", "body_bytes", "persistent",
                 "persistent_bytes")

    def __init__(self, ids: array, places: array, stop: int | None, path: Path, index: MessageIndex | None,
                 queue: str, redelivered: set[int] | frozenset[int], body_bytes: int, persistent: int,
                 persistent_bytes: int):
        self.ids = ids  # message ids, ascending
        self.places = places  # where their records are in the segment file path
        self.stop = stop  # an offset in it at or after the end of the last one (None: found from the last one)
        self.path = path
        self.index = index  # where the segment is pinned for queue until release(); None once released
        self.queue = queue
        self.redelivered = redelivered  # the ids of the run delivered before the stop (read, never changed)
        self.body_bytes = body_bytes  # body bytes of the run's messages
        self.persistent = persistent  # of them, messages marked persistent
        self.persistent_bytes = persistent_bytes  # their body bytes

    def __len__(self) -> int:
        return len(self.ids)

    def release(self) -> None:
        """The run's messages are read back or dropped: their segment may be compacted again."""
        if self.index is not None:
            self.index.unpin(self.places[0] >> PLACE_BITS, self.queue, len(self.ids))
            self.index = None

    def read_and_release(self) -> list[StoredMessage]:
        try:
            return self.read()
        finally:
            self.release()

    def read(self) -> list[StoredMessage]:
        return self.messages(self.fetch())

    def fetch(self) -> bytes:
        """The bytes of the run's records (and of whatever lies between them): file work only, for any thread."""
        first = self.places[0] & _OFFSET_MASK
        fd = os.open(self.path, os.O_RDONLY)
        try:
            stop = self.stop
            if stop is None:  # the last record's frame says where it ends
                last = self.places[-1] & _OFFSET_MASK
                frame = os.pread(fd, records.FRAME_SIZE, last)
                stop = last + records.FRAME_SIZE + (records.FRAME.unpack(frame)[0] if len(frame) == 8 else 0)
            return os.pread(fd, max(0, stop - first), first)
        finally:
            os.close(fd)

    def messages(self, data: bytes,
                 make: Callable[[int, records.Metadata, bytes, bool], T] | None = None) -> list[T]:
        """The run's messages from what fetch() read, each checked to be the publish of its id (those that are not
        are logged, in one line, and left out); each made by make(msg_id, metadata, body, redelivered), where
        metadata is (queues, exchange, routing key, content header payload), one object for the records in a row
        that have the same: StoredMessage objects, unless the caller makes its own at once."""
        make = make or _stored_message
        places = self.places
        first = places[0] & _OFFSET_MASK
        reader = records.PublishReader()
        unpack, frame_size = records.FRAME.unpack_from, records.FRAME_SIZE
        unpack_id, publish = records.MSG_ID.unpack_from, records.PUBLISH
        size = len(data)
        redelivered = self.redelivered
        meta = b""  # the metadata bytes of the record before, and what they decode to
        metadata: records.Metadata = ((), "", "", b"")
        messages = []
        left_out: list[str] = []  # what was found instead of each message left out
        for msg_id, where in zip(self.ids, places):
            offset = (where & _OFFSET_MASK) - first
            length = unpack(data, offset)[0] if offset + frame_size <= size else 0
            start = offset + frame_size
            end = start + length
            if not length or end > size or data[start] != publish:
                left_out.append(f"no publish record at offset {where & _OFFSET_MASK}, where message {msg_id} was")
                continue
            if meta and data.startswith(meta, start + 9):  # after the type and the id
                found, body_start = unpack_id(data, start + 1)[0], start + 9 + len(meta)
            else:
                found, metadata, body_start = reader.read(data, start, end)
                meta = reader.metadata_bytes
            if found != msg_id:
                left_out.append(f"message {found} at offset {where & _OFFSET_MASK} where message {msg_id} was")
                continue
            messages.append(make(msg_id, metadata, data[body_start:end], msg_id in redelivered))
        if left_out:  # one line per run, however many it lost
            log.error("%s no longer holds %d of the %d recovered messages a queue read back from it (%s%s): they are "
                      "left out", self.path, len(left_out), len(places), "; ".join(left_out[:3]),
                      "; ..." if len(left_out) > 3 else "")
        return messages
