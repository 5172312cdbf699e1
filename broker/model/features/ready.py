"""A queue's ready messages in delivery order: first in, first out, or by priority (x-max-priority).

Both kinds offer what the queue asks of its ready messages: append, popleft (the next to deliver; also the one a
drop-head length limit drops, in a priority queue too, as RabbitMQ 3.10 drops it), [0] (that one, for its expiry),
len, iteration in delivery order, take_all (everything at once, without a copy: a purge, a deletion) and
put_back (requeued entries back to their places). What a purge or a deletion took is let go a slice a loop turn
(let_go)."""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from typing import Final, Iterator, Protocol

from broker.model.message import QueueEntry
from broker.model.turns import next_turn

DROP_SLICE: Final = 16_384  # entries a purge or a deletion dropped that are freed a loop turn (let_go)


class ReadyList(Protocol):
    """What a queue asks of its ready list, whichever kind it is: this module's, features.expiry's ExpiringEntries
    or features.paging's PagedEntries."""

    def append(self, entry: QueueEntry) -> bool | None: ...  # True: the entry was paged (features.paging)
    def popleft(self) -> QueueEntry: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[QueueEntry]: ...
    # (the list to go on with, empty; what this one held, handed over as it is: a FIFO or priority list)
    def take_all(self) -> tuple[ReadyList, ReadyList]: ...
    def put_back(self, requeued: list[QueueEntry]) -> None: ...


def _by_seq(entry: QueueEntry) -> int:
    return entry.seq


class FifoEntries(deque):
    """The ready entries of a queue without priorities, oldest first (a deque, so the hot path stays in C)."""

    __slots__ = ()

    def take_all(self) -> tuple[FifoEntries, FifoEntries]:
        return FifoEntries(), self

    def put_back(self, requeued: list[QueueEntry]) -> None:
        """Requeued entries (sorted by seq) go back to their original positions: ahead of every ready one (the
        usual case), or among them. Then the entries older than each are moved from the front to the back (one
        rotation of the deque in all, in C) and it follows them, found by galloping from the front: a few lookups
        per requeued entry wherever it goes, never a walk of millions in Python."""
        if not self or requeued[-1].seq < self[0].seq:
            self.extendleft(reversed(requeued))
            return
        ahead = len(self)  # ready entries not yet moved to the back: the front of the deque, in seq order
        for entry in requeued:
            older = _older_at_front(self, entry.seq, ahead)
            self.rotate(-older)
            ahead -= older
            self.append(entry)
        self.rotate(-ahead)


def _older_at_front(entries: deque[QueueEntry], seq: int, ahead: int) -> int:
    """How many of the first `ahead` entries (in seq order) are older than seq: galloping (1, 2, 4 ...), then a
    binary search between the last two looks, so a count of n costs about 2 log n lookups near the front."""
    if not ahead or entries[0].seq > seq:
        return 0
    high = 1  # entries[high // 2] is older
    while high < ahead and entries[high].seq < seq:
        high *= 2
    return bisect.bisect_left(entries, seq, high // 2, min(high, ahead), key=_by_seq)


class PriorityEntries:
    """The ready entries of a priority queue: the highest priority first, first in first out within a priority.
    A message's priority property is capped at the queue's maximum; no property counts as 0 (as RabbitMQ)."""

    __slots__ = ("levels", "size", "top")

    def __init__(self, max_priority: int):
        self.levels = [FifoEntries() for _ in range(max_priority + 1)]  # entries of each priority, by priority
        self.size = 0  # entries in every level
        self.top = 0  # no level above this one holds entries

    def _level_of(self, entry: QueueEntry) -> int:
        priority = entry.message.header.scan.priority or 0
        return min(priority, len(self.levels) - 1)

    def append(self, entry: QueueEntry) -> None:
        level = self._level_of(entry)
        self.levels[level].append(entry)
        self.size += 1
        if level > self.top:
            self.top = level

    def _highest(self) -> FifoEntries:
        levels = self.levels
        while not levels[self.top]:
            if self.top == 0:
                raise IndexError("no ready entries")
            self.top -= 1
        return levels[self.top]

    def popleft(self) -> QueueEntry:
        entry = self._highest().popleft()
        self.size -= 1
        return entry

    def __getitem__(self, index: int) -> QueueEntry:
        if index != 0:
            raise IndexError("only the next entry can be looked at")
        return self._highest()[0]

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[QueueEntry]:
        for level in reversed(self.levels):
            yield from level

    def take_all(self) -> tuple[PriorityEntries, PriorityEntries]:
        return PriorityEntries(len(self.levels) - 1), self

    def put_back(self, requeued: list[QueueEntry]) -> None:
        """Requeued entries (sorted by seq) go back to their places within their priorities."""
        by_level: dict[int, list[QueueEntry]] = {}
        for entry in requeued:
            by_level.setdefault(self._level_of(entry), []).append(entry)
        for level, entries in by_level.items():
            self.levels[level].put_back(entries)
            self.top = max(self.top, level)
        self.size += len(requeued)


def ready_entries(arguments: dict) -> FifoEntries | PriorityEntries:
    """The ready-message structure a queue declared with these arguments needs."""
    max_priority = arguments.get("x-max-priority")
    return PriorityEntries(max_priority) if isinstance(max_priority, int) and max_priority > 0 else FifoEntries()


def let_go(dropped: ReadyList | list | dict, per_turn: int = DROP_SLICE) -> None:
    """Entries a purge or a deletion took (take_all; a ready list, or the list of a queue's expiry times) are freed
    per_turn a loop turn: 4 million freed at once held the event loop 0.18 s. (Any list or dict of many objects may
    be let go so, the slice sized to what its objects cost to free: a listing's entries, ENCODE_SLICE.)"""
    if len(dropped) <= per_turn:
        return  # (freed with the caller's reference, a few milliseconds at most)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no event loop (a queue of a unit test): freed at once
        return

    def free_a_slice() -> None:
        if isinstance(dropped, list):
            del dropped[-per_turn:]
        elif isinstance(dropped, dict):
            for _ in range(min(per_turn, len(dropped))):
                dropped.popitem()
        else:
            for _ in range(min(per_turn, len(dropped))):
                dropped.popleft()
        if len(dropped):
            next_turn(free_a_slice)
    next_turn(free_a_slice)
