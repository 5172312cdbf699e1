"""Items due at given times, kept in one heap and served by one event-loop timer: a queue or exchange that waits
for many things (message expiries, delayed requeues, delayed messages) holds one of these, never a timer per item."""

from __future__ import annotations

import asyncio
import heapq
from itertools import chain
from typing import Callable, Generic, Iterator, TypeVar

from broker.model.turns import next_turn

Item = TypeVar("Item")
# Items handed to on_due at most per firing (those due beyond wait for the next loop turn): millions due at once,
# each dead-lettered or routed, would hold the event loop for seconds
FIRE_SLICE = 256
# Items prune() looks at a loop turn: a queue drained of millions left as many expiry times behind
PRUNE_SLICE = 16_384


def now_ms() -> int:
    """The event loop's clock in whole milliseconds (what due times are measured in)."""
    return int(asyncio.get_running_loop().time() * 1000)


class Deadlines(Generic[Item]):
    """A min-heap of (due time, arrival order, item) with one timer armed for the earliest due time. When it fires,
    on_due gets every item whose time has come, earliest first (items due at the same time in arrival order).

    Items are not removed when they stop mattering (a message consumed before it expires): on_due is expected to
    skip those, and an owner that drops many of them early calls prune() to let them go."""

    __slots__ = ("heap", "timer", "on_due", "arrivals", "aside")

    def __init__(self, on_due: Callable[[list[Item]], None]):
        self.heap: list[tuple[int, int, Item]] = []  # (due ms, arrival number, item), earliest first
        self.timer: asyncio.TimerHandle | None = None  # armed for heap[0]'s due time while the heap is not empty
        self.on_due = on_due  # takes the items whose time has come
        self.arrivals = 0  # numbers items in arrival order, so that equal due times keep it (and items never compare)
        self.aside: list[tuple[int, int, Item]] | None = None  # what prune() has yet to look at, while it does

    def __len__(self) -> int:
        return len(self.heap) + len(self.aside or ())

    def __iter__(self) -> Iterator[Item]:
        """The items waiting, in no particular order (those a prune has yet to look at too)."""
        return (item for _, _, item in chain(self.heap, self.aside or ()))

    def add(self, due_ms: int, item: Item) -> None:
        heap = self.heap
        earliest = heap[0][0] if heap else None
        heapq.heappush(heap, (due_ms, self.arrivals, item))
        self.arrivals += 1
        if earliest is None or due_ms < earliest:
            self._arm()

    def next_due(self) -> int | None:
        """The earliest due time, or None when nothing waits."""
        return self.heap[0][0] if self.heap else None

    def take_due(self, now: int) -> list[Item]:
        """Remove and return the items due at or before now, earliest first, FIRE_SLICE at most (without waiting
        for the timer; it fires again at once for the rest)."""
        heap = self.heap
        due = []
        while heap and heap[0][0] <= now and len(due) < FIRE_SLICE:
            due.append(heapq.heappop(heap)[2])
        return due

    def prune(self, keep: Callable[[Item], bool]) -> None:
        """Drop the items keep() says no longer matter, looking at PRUNE_SLICE a loop turn: the items are set aside
        and those kept come back as they are looked at (one of them due meanwhile fires that many turns late)."""
        if self.aside is not None:
            return
        self.aside, self.heap = self.heap, []
        self._disarm()
        self._prune_slice(keep)

    def _prune_slice(self, keep: Callable[[Item], bool]) -> None:
        aside, heap = self.aside, self.heap
        if aside is None:
            return  # (take_all took them meanwhile)
        for entry in aside[-PRUNE_SLICE:]:
            if keep(entry[2]):
                heapq.heappush(heap, entry)
        del aside[-PRUNE_SLICE:]
        self._arm()
        if aside:
            next_turn(lambda: self._prune_slice(keep))
        else:
            self.aside = None

    def take_all(self) -> list[tuple[int, int, Item]]:
        """Everything waiting, handed over as it is (freed at once, millions would hold the event loop: see
        features.ready.let_go); nothing waits from now on."""
        heap, self.heap = self.heap, []
        aside, self.aside = self.aside, None
        self._disarm()
        if aside:  # (a prune under way: what it set aside goes too)
            aside += heap
            return aside
        return heap

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _arm(self) -> None:
        self._disarm()
        if self.heap:
            # +1 ms: the loop may wake a little early, and an item is due only once its whole millisecond has passed
            self.timer = asyncio.get_running_loop().call_at((self.heap[0][0] + 1) / 1000, self._fire)

    def _fire(self) -> None:
        self.timer = None
        due = self.take_due(now_ms())
        self._arm()  # (at once, when more were due)
        if due:
            self.on_due(due)
