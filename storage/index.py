"""In-memory index of the message segments: which messages are live, where, and which segments can go.

Message ids increase, and each segment holds the publishes of one contiguous id range (compaction rewrites a
segment in place, so the range stays). A segment keeps one state byte per id of its range, so the index costs about
one byte per queued message (more when the broker's ids are sparse, e.g. many transient messages in between).

An empty segment can only be deleted once no older segment needs its REMOVED/DELIVERED records: ``refers``
remembers, per older segment, the sequence number of the latest such record; the need ends when the older segment is
deleted, or compacted after that record (the rewrite no longer holds the removed publish, and carries the delivered
flag itself).

Compaction waits until a segment has stopped losing messages for one batch: a segment being consumed (typically
the one closed last, mostly consumed already when the head rolls) would be rewritten only to be deleted soon
after. A segment that empties is deleted even while its compaction is queued or running (the writer drops the job).

The writer thread reads ``states``, ``multi`` and ``deleted_below`` while compacting; the event loop only ever turns
messages from live to dead there (or sets DELIVERED or ADOPTED), and replaces ``multi`` values whole, so a concurrent
reader sees either the old or the new value and at worst keeps a record that just died (its REMOVED record is newer)
or writes an adopted message under its held key (its ADOPTED record is newer, and kept until a rewrite after it).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import Final

from storage.records import held_parts

LIVE: Final = 1  # the message is live in the one queue of its publish record
DELIVERED: Final = 2  # (with LIVE) the message was delivered at least once
MULTI: Final = 4  # the message was routed to several queues: MessageIndex.multi holds their states
# (with LIVE) its record names a held key (storage.records.HELD_PREFIX): the message is the queue's that key names
ADOPTED: Final = 8


class Segment:
    __slots__ = (
        "number", "first_id", "states", "refs", "queue_refs", "base_refs", "size", "refers", "compacted_upto",
        "compacting", "pinned",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.first_id = -1  # id of states[0]; -1 until the segment holds a publish (message ids are never negative)
        self.states = bytearray()  # LIVE/DELIVERED/MULTI bits per id from first_id; 0 = not live here
        self.refs = 0  # live (queue, message) pairs published here
        self.queue_refs: dict[str, int] = {}  # the same, per queue (so deleting a queue needs no message list)
        self.base_refs = 0  # refs when written or last compacted: the yardstick for "mostly dead"
        self.size = 0  # bytes in the file, including bytes still in the pending batch
        self.refers: dict[int, int] = {}  # older segment -> seq of the latest REMOVED/DELIVERED record aimed at it
        self.compacted_upto = 0  # records aimed here with seq <= this were folded in by the last compaction
        self.compacting = False  # a compaction job for this segment is queued or running
        # queue -> its recovered messages in this segment that it has yet to read back (storage.recovered_messages): the
        # segment is not compacted meanwhile, since their records would move
        self.pinned: dict[str, int] = {}

    def state(self, msg_id: int) -> int:
        offset = msg_id - self.first_id
        return self.states[offset] if 0 <= offset < len(self.states) else 0


class MessageIndex:
    def __init__(self) -> None:
        self.segments: dict[int, Segment] = {}  # by number, oldest first
        self.head: Segment | None = None  # the segment new records go to
        self._firsts: list[int] = []  # first ids of segments that hold publishes, ascending
        self._homes: list[Segment] = []  # the segments of _firsts, same order
        self.multi: dict[int, tuple[tuple[str, bool], ...]] = {}  # MULTI message -> live (queue, delivered) pairs
        self.deleted_below: dict[str, int] = {}  # deleted queue -> its messages with lower ids are gone
        self.last_id = -1  # highest message id seen
        self.seq = 0  # counts REMOVED/DELIVERED records, to order them against compactions
        self.live_refs = 0  # live (queue, message) pairs in all segments
        self.dirty: set[int] = set()  # segments whose refs dropped since the last housekeeping
        self.waiting: set[int] = set()  # empty segments kept only for records older segments still need
        self.draining: set[int] = set()  # worth compacting, but they were still losing messages at the last look
        self.recheck_waiting = False  # a compaction ended: some waiting segment may be free to go

    # --- segments -------------------------------------------------------------------------------------------
    def add_segment(self, number: int) -> Segment:
        segment = Segment(number)
        self.segments[number] = segment
        return segment

    def roll(self, number: int) -> Segment:
        """Make a new head segment; the old head becomes a candidate for compaction."""
        if self.head is not None:
            self.dirty.add(self.head.number)
        self.head = self.add_segment(number)
        return self.head

    def forget(self, segment: Segment) -> None:
        """The segment's file is being deleted."""
        del self.segments[segment.number]
        if segment.first_id < 0:
            return  # it held no publish (only removal or delivery records): nothing of it is indexed
        position = self._homes.index(segment)
        del self._homes[position]
        del self._firsts[position]
        multi, states, first = self.multi, segment.states, segment.first_id
        if len(multi) <= len(states):  # (whichever is shorter: every message routed to several, or the segment's)
            for msg_id in [m for m in multi if segment.state(m) & MULTI]:
                del multi[msg_id]
        else:
            for offset in range(len(states)):
                if states[offset] & MULTI:
                    multi.pop(first + offset, None)

    def homes_snapshot(self) -> tuple[list[int], list[Segment]]:
        """Copies of the id -> segment lookup lists, for the writer thread."""
        return list(self._firsts), list(self._homes)

    def home(self, msg_id: int) -> Segment | None:
        position = bisect_right(self._firsts, msg_id) - 1
        return self._homes[position] if position >= 0 else None

    # --- publishes ------------------------------------------------------------------------------------------
    def _slot(self, segment: Segment, msg_id: int) -> bytearray:
        """The states array of ``segment`` grown so that its next append is the state of ``msg_id``."""
        if msg_id <= self.last_id:
            raise ValueError(f"message ids must increase: {msg_id} after {self.last_id}")
        self.last_id = msg_id
        if segment.first_id < 0:
            segment.first_id = msg_id
            self._firsts.append(msg_id)
            self._homes.append(segment)
        states = segment.states
        gap = msg_id - segment.first_id - len(states)
        if gap:
            states.extend(bytes(gap))
        return states

    def add(self, msg_id: int, queues: tuple[str, ...]) -> None:
        """A fresh publish in the head segment."""
        segment = self.head
        assert segment is not None, "roll() first"
        states = self._slot(segment, msg_id)
        queue_refs = segment.queue_refs
        if len(queues) == 1:
            states.append(LIVE)
            queue = queues[0]
            queue_refs[queue] = queue_refs.get(queue, 0) + 1
            count = 1
        else:
            unique = tuple(dict.fromkeys(queues))
            states.append(MULTI)
            self.multi[msg_id] = tuple((queue, False) for queue in unique)
            for queue in unique:
                queue_refs[queue] = queue_refs.get(queue, 0) + 1
            count = len(unique)
        segment.refs += count
        segment.base_refs += count
        self.live_refs += count

    def add_recovered(self, msg_id: int, queues: tuple[tuple[str, bool], ...]) -> tuple[tuple[str, bool], ...]:
        """A publish read back from the head segment during recovery, with its record's (queue, delivered) pairs;
        returns the pairs still live (``queues`` itself unless one of them was deleted since)."""
        segment = self.head
        assert segment is not None, "roll() first"
        states = self._slot(segment, msg_id)
        live = queues
        if self.deleted_below:
            deleted_below = self.deleted_below
            live = tuple(pair for pair in queues if msg_id >= deleted_below.get(pair[0], -1))
        if not live:
            states.append(0)
            return live
        queue_refs = segment.queue_refs
        if len(queues) == 1:
            queue, delivered = live[0]
            states.append(LIVE | DELIVERED if delivered else LIVE)
            queue_refs[queue] = queue_refs.get(queue, 0) + 1
        else:
            states.append(MULTI)
            self.multi[msg_id] = live
            for queue, _ in live:
                queue_refs[queue] = queue_refs.get(queue, 0) + 1
        count = len(live)
        segment.refs += count
        segment.base_refs += count
        self.live_refs += count
        return live

    def add_recovered_more(self, queue: str, state: int, count: int) -> None:
        """count publishes read back from the head segment with the ids after the last one, each live in queue
        alone with state (what a run of a queue's messages that follow one another in a segment adds)."""
        segment = self.head
        assert segment is not None, "roll() first"
        segment.states.extend(bytes((state,)) * count)
        segment.queue_refs[queue] += count
        segment.refs += count
        segment.base_refs += count
        self.live_refs += count
        self.last_id += count

    def state_of(self, msg_id: int) -> int:
        segment = self.home(msg_id)
        return segment.state(msg_id) if segment is not None else 0

    def undo(self, msg_id: int, queues: tuple[str, ...]) -> None:
        """Forget a publish whose write failed (its publisher gets a nack)."""
        segment = self.home(msg_id)
        if segment is None or not segment.state(msg_id):
            return
        state = segment.state(msg_id)
        segment.states[msg_id - segment.first_id] = 0
        live = [queue for queue, _ in self.multi.pop(msg_id, ())] or [self._queue_of(queues[0], state)]
        for queue in live:
            self._unref(segment, queue, 1)

    # --- removals and deliveries ----------------------------------------------------------------------------
    def remove(self, queue: str, msg_ids: Iterable[int]) -> list[int]:
        """Mark messages gone from ``queue``; return the ids that were live there."""
        self.seq += 1
        below = self.deleted_below.get(queue, -1)
        removed = []
        segment = None
        for msg_id in msg_ids:
            if msg_id < below:
                continue
            if segment is None or not 0 <= msg_id - segment.first_id < len(segment.states):
                segment = self.home(msg_id)
                if segment is None:
                    continue
            offset = msg_id - segment.first_id
            if not 0 <= offset < len(segment.states):
                continue
            state = segment.states[offset]
            if state & LIVE:
                segment.states[offset] = 0
            elif state & MULTI:
                entries = self.multi[msg_id]
                left = tuple(entry for entry in entries if entry[0] != queue)
                if len(left) == len(entries):
                    continue
                if left:
                    self.multi[msg_id] = left
                else:
                    del self.multi[msg_id]
                    segment.states[offset] = 0
            else:
                continue
            self._unref(segment, queue, 1)
            removed.append(msg_id)
            self._refer(segment)
        return removed

    def _unref(self, segment: Segment, queue: str, count: int) -> None:
        left = segment.queue_refs.get(queue, 0) - count
        if left > 0:
            segment.queue_refs[queue] = left
        else:
            segment.queue_refs.pop(queue, None)
        segment.refs -= count
        self.live_refs -= count
        self.dirty.add(segment.number)

    def _refer(self, segment: Segment) -> None:
        """The head segment now holds a record that ``segment`` depends on until it is compacted or deleted."""
        head = self.head
        assert head is not None, "roll() first"
        if segment is not head:
            head.refers[segment.number] = self.seq

    def deliver(self, queue: str, msg_ids: Iterable[int]) -> list[int]:
        """Mark messages delivered from ``queue``; return the ids that were live there and not yet marked."""
        self.seq += 1
        marked = []
        for msg_id in msg_ids:
            segment = self.home(msg_id)
            if segment is None:
                continue
            offset = msg_id - segment.first_id
            if not 0 <= offset < len(segment.states):
                continue
            state = segment.states[offset]
            if state & LIVE:
                if state & DELIVERED:
                    continue
                segment.states[offset] = state | DELIVERED
            elif state & MULTI:
                entries = self.multi[msg_id]
                if (queue, False) not in entries:
                    continue
                self.multi[msg_id] = tuple((name, flag or name == queue) for name, flag in entries)
            else:
                continue
            marked.append(msg_id)
            self._refer(segment)
        return marked

    def adopt(self, held: str, queue: str, msg_ids: Iterable[int]) -> list[int]:
        """Messages written under the held key ``held`` become ``queue``'s; return the ids that were live there."""
        self.seq += 1
        adopted = []
        for msg_id in msg_ids:
            segment = self.home(msg_id)
            if segment is None:
                continue
            state = segment.state(msg_id)
            if state & LIVE:
                segment.states[msg_id - segment.first_id] = state | ADOPTED
            elif state & MULTI:
                entries = self.multi[msg_id]
                if not any(name == held for name, _ in entries):
                    continue
                self.multi[msg_id] = tuple((queue if name == held else name, flag) for name, flag in entries)
            else:
                continue
            refs = segment.queue_refs  # (the same pair stays live: its reference moves to the queue)
            left = refs.get(held, 0) - 1
            if left > 0:
                refs[held] = left
            else:
                refs.pop(held, None)
            refs[queue] = refs.get(queue, 0) + 1
            adopted.append(msg_id)
            self._refer(segment)
        return adopted

    def drop_queue(self, queue: str) -> int:
        """Every message of ``queue`` is gone; return the watermark below which its ids are dead."""
        below = self.last_id + 1
        self.deleted_below[queue] = below
        for segment in self.segments.values():
            count = segment.queue_refs.get(queue, 0)
            if count:
                self._unref(segment, queue, count)
            segment.pinned.pop(queue, None)  # nobody will read its recovered messages back
        return below

    def pin(self, number: int, queue: str, count: int) -> None:
        """count recovered messages of queue in segment number are yet to be read back: it waits with compaction."""
        pinned = self.segments[number].pinned
        pinned[queue] = pinned.get(queue, 0) + count

    def unpin(self, number: int, queue: str, count: int) -> None:
        """count of those were read back (or dropped unread)."""
        segment = self.segments.get(number)
        if segment is None or queue not in segment.pinned:
            return  # the segment or the queue is gone
        left = segment.pinned[queue] - count
        if left > 0:
            segment.pinned[queue] = left
            return
        del segment.pinned[queue]
        if not segment.pinned:
            self.dirty.add(number)  # worth compacting now, maybe

    # --- what compaction and recovery ask ------------------------------------------------------------------
    def live_queues(self, segment: Segment, msg_id: int, queues: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """The (queue, delivered) pairs of a publish record in ``segment`` that are still live."""
        state = segment.state(msg_id)
        if state & LIVE:
            queue = self._queue_of(queues[0][0], state)  # (a rewrite names the queue that adopted it)
            if msg_id < self.deleted_below.get(queue, -1):
                return []
            return [(queue, bool(state & DELIVERED))]
        if state & MULTI:
            entries = self.multi.get(msg_id, ())
            return [(q, flag) for q, flag in entries if msg_id >= self.deleted_below.get(q, -1)]
        return []

    @staticmethod
    def _queue_of(name: str, state: int) -> str:
        """The queue a LIVE message is in, whose record names name."""
        if state & ADOPTED and (parts := held_parts(name)) is not None:
            return parts[1]
        return name

    def depends_on(self, segment: Segment, older: int) -> bool:
        """Whether ``segment``'s records aimed at segment ``older`` are still needed."""
        target = self.segments.get(older)
        return target is not None and segment.refers.get(older, 0) > target.compacted_upto

    def still_needed_below(self) -> int:
        """Queue-deletion watermarks at or below this id no longer matter (no segment holds such ids)."""
        return self._firsts[0] if self._firsts else self.last_id + 1

    # --- housekeeping ---------------------------------------------------------------------------------------
    def housekeeping(self, compact_ratio: float, min_compact_bytes: int) -> tuple[list[Segment], list[Segment]]:
        """Segments to delete (oldest first, forgotten here) and segments worth compacting (marked compacting).

        An empty segment goes even while it is being compacted. One that is worth compacting but lost messages since
        the last call is only noted in ``draining``: the next call compacts it unless it lost more meanwhile.
        """
        losing = self.dirty  # segments that lost messages (or were closed, or compacted) since the last call
        candidates = losing | self.draining
        if self.recheck_waiting:
            candidates |= self.waiting
        self.dirty = set()
        self.draining = set()
        self.recheck_waiting = False
        to_delete: list[Segment] = []
        to_compact: list[Segment] = []
        while candidates:
            deleted_before = len(to_delete)
            for number in sorted(candidates):
                segment = self.segments.get(number)
                if segment is None or segment is self.head:
                    continue
                if segment.refs <= 0:
                    if any(self.depends_on(segment, older) for older in segment.refers):
                        self.waiting.add(number)
                    else:
                        self.waiting.discard(number)
                        self.forget(segment)
                        to_delete.append(segment)
                        continue
                if segment.compacting or segment.pinned:
                    continue
                dead = segment.base_refs - segment.refs
                if dead > 0 and dead >= segment.base_refs * compact_ratio and segment.size >= min_compact_bytes:
                    if number in losing:
                        self.draining.add(number)
                    else:
                        segment.compacting = True
                        to_compact.append(segment)
            # a deletion may free segments that were only waiting for it
            candidates = set(self.waiting) if len(to_delete) > deleted_before else set()
        return to_delete, to_compact

    def compacted(self, segment: Segment, size: int, upto: int, refers: dict[int, int]) -> None:
        segment.compacting = False
        segment.size = size
        segment.base_refs = segment.refs
        segment.compacted_upto = upto
        segment.refers = refers
        self.dirty.add(segment.number)  # it may have emptied meanwhile
        self.recheck_waiting = True
