"""A queue's messages as recovery found them, kept as columns (message id, where its record is, body size) rather
than as one object per message, and read back from their segments when the broker asks: all at once, or in runs
that a deep queue pages in one at a time. So a restart with millions of queued messages neither builds millions of
objects nor copies their bodies anywhere before the broker serves.

Every segment is mapped (mmap) as recovery reads it, before it repairs anything and before the store may compact or
delete a segment: a mapping keeps reading the file it mapped, so the places recorded stay right whatever happens to
the file afterwards. A mapping goes with the last run (or list of messages) that needs it; nothing of it is read
until then, and a run reads only its own byte range. A record is checked against its CRC again when read back: one
damaged since the start is logged and left out, never delivered.
"""

from __future__ import annotations

import logging
import mmap
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path

from storage import records

log = logging.getLogger(__name__)

PLACE_BITS = 40  # a place is (segment number << PLACE_BITS) | offset of the record's frame in the segment
_OFFSET_MASK = (1 << PLACE_BITS) - 1


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


class SegmentMaps:
    """The mapping of every segment recovery read, by segment number."""

    def __init__(self) -> None:
        self.maps: dict[int, mmap.mmap] = {}

    def map(self, path: Path, number: int) -> None:
        with open(path, "rb") as file:
            if file.seek(0, 2):  # an empty file cannot be mapped (and holds no record)
                self.maps[number] = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


class RecoveredMessages:
    """One queue's recovered messages in queue order (= id order, as are their places)."""

    __slots__ = ("ids", "places", "sizes", "redelivered", "transient", "removed", "segments")

    def __init__(self, segments: SegmentMaps) -> None:
        self.ids = array("Q")  # message ids, ascending
        self.places = array("Q")  # where each record is (place()), ascending too
        self.sizes = array("I")  # body bytes of each
        self.redelivered: set[int] = set()  # ids delivered from this queue before the stop
        # ids of messages not marked persistent (a quorum queue stores them too): a set, sorted by finish()
        self.transient: set[int] | array = set()
        self.removed: set[int] = set()  # ids removed by a later record (dropped from the columns by finish())
        self.segments = segments

    def add(self, msg_id: int, where: int, size: int, persistent: bool, delivered: bool) -> None:
        self.ids.append(msg_id)
        self.places.append(where)
        self.sizes.append(size)
        if delivered:
            self.redelivered.add(msg_id)
        if not persistent:
            self.transient.add(msg_id)

    def __contains__(self, msg_id: int) -> bool:
        ids = self.ids
        position = bisect_left(ids, msg_id)
        return position < len(ids) and ids[position] == msg_id

    def finish(self) -> int:
        """Drop the removed messages from the columns; return how many are left."""
        removed = self.removed
        if removed:
            kept = [position for position, msg_id in enumerate(self.ids) if msg_id not in removed]
            self.ids = array("Q", [self.ids[position] for position in kept])
            self.places = array("Q", [self.places[position] for position in kept])
            self.sizes = array("I", [self.sizes[position] for position in kept])
            self.redelivered -= removed
            self.transient -= removed
            self.removed = set()
        self.transient = array("Q", sorted(self.transient))
        return len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __iter__(self) -> Iterator[StoredMessage]:
        for run in self.runs(0):
            yield from run.read()

    def read(self, start: int, stop: int) -> list[StoredMessage]:
        """Messages start..stop-1, read now."""
        return [message for run in self.runs(start, stop=stop) for message in run.read()]

    def runs(self, start: int, max_bytes: int = 1 << 20, stop: int | None = None) -> Iterator["StoredRun"]:
        """Messages start..stop-1 (to the end by default) as runs of records that lie within max_bytes of each other
        in one segment (a run holds at least one message)."""
        places = self.places
        stop = len(places) if stop is None else stop
        while start < stop:
            first = places[start]
            end = min(stop, bisect_left(places, first + max_bytes, start),
                      bisect_left(places, place((first >> PLACE_BITS) + 1, 0), start))
            end = max(end, start + 1)
            yield self._run(start, end)
            start = end

    def _run(self, start: int, end: int) -> "StoredRun":
        ids = self.ids[start:end]
        transient = self.transient[bisect_left(self.transient, ids[0]):bisect_right(self.transient, ids[-1])]
        sizes = self.sizes[start:end]
        body_bytes = sum(sizes)
        transient_bytes = sum(sizes[bisect_left(ids, msg_id)] for msg_id in transient)
        mapping = self.segments.maps[self.places[start] >> PLACE_BITS]
        return StoredRun(ids, self.places[start:end], mapping, self.redelivered, body_bytes,
                         len(ids) - len(transient), body_bytes - transient_bytes)


class StoredRun:
    """Recovered messages of one queue whose records lie close together in one segment: what a deep queue pages in
    at once. read() may run on any thread."""

    __slots__ = ("ids", "places", "mapping", "redelivered", "body_bytes", "persistent", "persistent_bytes")

    def __init__(self, ids: array, places: array, mapping: mmap.mmap, redelivered: set[int], body_bytes: int,
                 persistent: int, persistent_bytes: int):
        self.ids = ids  # message ids, ascending
        self.places = places  # where their records are in the segment mapped by mapping
        self.mapping = mapping
        self.redelivered = redelivered  # the queue's set of ids delivered before the stop (read, never changed)
        self.body_bytes = body_bytes  # body bytes of the run's messages
        self.persistent = persistent  # of them, messages marked persistent
        self.persistent_bytes = persistent_bytes  # their body bytes

    def __len__(self) -> int:
        return len(self.ids)

    def read(self) -> list[StoredMessage]:
        """The run's messages, each checked against its record's CRC (a damaged one is logged and left out)."""
        mapping, places = self.mapping, self.places
        first = places[0] & _OFFSET_MASK
        last = places[-1] & _OFFSET_MASK
        (length, _) = records.FRAME.unpack_from(mapping, last)
        data = mapping[first:last + records.FRAME_SIZE + length]
        reader = records.PublishReader()
        unpack, frame_size, crc32 = records.FRAME.unpack_from, records.FRAME_SIZE, zlib.crc32
        view = memoryview(data)
        redelivered = self.redelivered
        messages = []
        for msg_id, where in zip(self.ids, places):
            offset = (where & _OFFSET_MASK) - first
            length, crc = unpack(data, offset)
            start = offset + frame_size
            end = start + length
            if end > len(data) or crc32(view[start:end]) != crc or data[start] != records.PUBLISH:
                log.error("message %d is damaged in segment %d at offset %d since the start (CRC mismatch): it is "
                          "left out", msg_id, where >> PLACE_BITS, where & _OFFSET_MASK)
                continue
            found, (_, exchange, routing_key, header_payload), body_start = reader.read(data, start, end)
            if found != msg_id:
                log.error("segment %d at offset %d holds message %d where message %d was: it is left out",
                          where >> PLACE_BITS, where & _OFFSET_MASK, found, msg_id)
                continue
            messages.append(StoredMessage(msg_id, exchange, routing_key, header_payload, data[body_start:end],
                                          msg_id in redelivered))
        view.release()
        return messages
