"""The cyclic garbage collector in a broker's process (one process, a worker, a node of a cluster, the supervisor of
several workers).

CPython's collector walks every object of a generation in one go, holding the event loop and every other thread
meanwhile. A broker's oldest generation is mostly its unacked deliveries, which form no cycles, and, where the broker
runs as pure Python, its queued messages (compiled, a message and its entry are never walked:
broker/model/message.py): full collections over 4 million unacked deliveries took 0.65 to 0.9 s each, several while
they were delivered. So, in a broker's process:

- the youngest generation is collected more rarely than CPython's default, the older ones more often (the
  thresholds below);
- a collection of any generation that took longer than FREEZE_AFTER moves what survived it out of the
  collector's sight (``gc.freeze``), so that later ones walk only what was made since. (A full collection of what
  is left follows on the event loop at once: CPython waits for a quarter of what the last one walked, frozen
  included, to become old before the next, which would then walk millions again.) A young collection is slow when
  new containers hold millions of references (a transaction's ack of 4 million deliveries kept them in 62,500
  lists: one middle collection walked them in 86 ms, then the next full one again). A frozen object is still freed
  the moment its last reference goes (a message acked); only a cycle among frozen objects that became garbage after
  the freeze waits;
- the frozen objects go back to the collector (``gc.unfreeze``; its next full collection walks them) once that
  costs no more than FREEZE_AFTER again, the heap having shrunk (deep queues drained), or else FULL_WALK_PERIOD
  after the first freeze, so that no garbage waits longer than that. That full walk takes as long as the heap asks
  (0.9 s over 4 million unacked deliveries on a 2-core machine), once in FULL_WALK_PERIOD while they stay.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

try:
    from broker.model.untracked import untrack as _untrack
except ImportError:  # (not built here: Warren runs as pure Python)
    _untrack = None

log = logging.getLogger(__name__)

# Allocations (less deallocations) between two collections of the youngest generation (CPython's default 700): each
# walks them, and the broker's seldom form cycles
YOUNG_THRESHOLD = 25_000
# Young collections between two middle ones, less one (CPython's default 10): a middle one walks the youngest
# generation together with what the young ones since the last left. 0 (a young and a middle one in turn) keeps that to
# what one young one left: 10,000 queues just declared (60,000 containers) made middle collections of 17 to 28 ms with
# 2, 10 to 17 ms with 0 (and ten young ones of 50,000 took 40 to 67 ms at once under a settlement of 250,000 deliveries)
MIDDLE_THRESHOLD = 0
# Collections of the middle generation before a full one may come (CPython's default 10): a full one walks only what
# is not frozen, what became old since the last freeze, so it comes often to stay short: under a delivery of 4
# million, every 0.3 s, 11 to 30 ms each
OLD_THRESHOLD = 1
FREEZE_AFTER = 0.01  # seconds: a full collection longer than this freezes what survived it
FULL_WALK_PERIOD = 900.0  # seconds frozen objects stay out of the collector's sight at most
# seconds between two looks at the heap's size while objects are frozen (sys.getallocatedblocks walks every pool of
# the heap: a look at each young collection took 1 s of the loop in 40 under a delivery of millions)
LOOK_EVERY = 1.0


class Collector:
    """Watches the collector's collections (a ``gc.callbacks`` entry) and freezes and unfreezes as above."""

    def __init__(self, soon: Callable[[Callable[[], object]], object], freeze_after: float = FREEZE_AFTER,
                 full_walk_period: float = FULL_WALK_PERIOD, look_every: float = LOOK_EVERY,
                 clock: Callable[[], float] = time.monotonic, heap: Callable[[], int] = sys.getallocatedblocks) -> None:
        self.soon = soon  # runs a call on the event loop, from any thread (a collection cannot start inside another)
        self.freeze_after = freeze_after
        self.full_walk_period = full_walk_period
        self.look_every = look_every
        self.clock = clock
        self.heap = heap  # the process's allocated memory blocks: what a full walk's time grows with
        self.started = 0.0  # clock() when the running collection began
        self.frozen_at = 0.0  # clock() of the first freeze since the objects last went back; 0 while none is frozen
        self.cheap_blocks = 0  # allocated memory blocks one full walk within freeze_after covers, as last measured
        self.next_look = 0.0  # clock() before which the frozen objects are not looked at again

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            if info["generation"] != 2 and self.frozen_at:
                self._look_at_frozen()
            self.started = self.clock()
            return
        took = self.clock() - self.started
        if took <= self.freeze_after:
            return
        blocks = self.heap()
        # (a young collection walks an unknown part of the heap, and a full one while objects are frozen the rest
        # alone: neither says what a walk of the whole heap costs; the rest's rate taken over the whole heap's
        # blocks brought the frozen objects back too early, and the next full walk took 44 ms where 10 were due)
        if info["generation"] == 2 and not self.frozen_at:
            self.cheap_blocks = int(blocks * self.freeze_after / took)
        gc.freeze()
        self.froze()
        try:
            self.soon(collect_unfrozen)
        except RuntimeError:  # the event loop is closed: the process is ending
            pass
        log.debug("a collection of generation %d took %.3f s over %d blocks: what survived it is frozen",
                  info["generation"], took, blocks)

    def froze(self) -> None:
        """Objects were frozen: the period they may stay so starts with the first freeze."""
        if not self.frozen_at:
            self.frozen_at = self.clock()

    def _look_at_frozen(self) -> None:
        """At a young collection: the frozen objects go back to the collector when a full walk is cheap again, or
        when they have been frozen for the whole period."""
        now = self.clock()
        if now < self.next_look:
            return
        self.next_look = now + self.look_every
        cheap = self.heap() <= self.cheap_blocks
        if not cheap and now - self.frozen_at < self.full_walk_period:
            return
        gc.unfreeze()
        if not cheap:
            log.info("objects frozen for %.0f s go back to the garbage collector: its next full collection walks "
                     "all of them", now - self.frozen_at)
        self.frozen_at = 0.0


def collect_unfrozen() -> None:
    """A full collection of what is not frozen (cheap right after a freeze): the next one comes once a quarter of
    what this one walked has become old, not a quarter of all there is."""
    gc.collect()


_installed: Collector | None = None  # the process's policy, once install() has run


def install() -> None:
    """Set a broker process's thresholds and its collector policy, from its event loop (at its start)."""
    global _installed
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    soon = asyncio.get_running_loop().call_soon_threadsafe
    if _installed is None:
        _installed = Collector(soon)
        gc.callbacks.append(_installed)
    _installed.soon = soon


@contextmanager
def out_of_sight() -> Iterator[None]:
    """No collection runs meanwhile; what was made (on any thread) is frozen at its end, to come back as the policy
    says. For a thread that makes many objects that form no cycles (a supervisor's decoding of its workers'
    listings of 100,000 queues: the collections it made walked them again and again, 13 to 38 ms at a time, holding
    the event loop's thread too). A cycle another thread let go meanwhile is frozen too, and waits for the frozen
    objects' return (up to FULL_WALK_PERIOD)."""
    global _unseen, _was_enabled
    with _unseen_lock:
        if not _unseen:
            _was_enabled = gc.isenabled()
        _unseen += 1
        gc.disable()
    try:
        yield
    finally:
        with _unseen_lock:
            _unseen -= 1
            if not _unseen:
                freeze()
                if _was_enabled:
                    gc.enable()


_unseen = 0  # the out_of_sight() sections under way, on any thread
_was_enabled = True  # whether the collector ran as the first of them began (it runs again after the last, if so)
_unseen_lock = threading.Lock()  # (taken to count them)


def unwalked(items: list) -> list:
    """items out of the collector's sight (where Warren is built; walked as any list where it runs as pure Python):
    a snapshot of many long-lived objects that can be part of no cycle, kept over loop turns (the queues a listing
    or a sampling goes through). Its objects are still counted and freed as ever; the collector only stops walking
    the list itself, which costs a collection of the youngest generation a memory read an item: 6 ms for 100,000
    queues, each time one ran while it was young (a listing of 100,000 queues and a sampling of their rates together
    made collections of 26 to 50 ms)."""
    return items if _untrack is None else _untrack(items)


def freeze() -> None:
    """Everything alive now goes out of the collector's sight (what a store's recovery made, millions of long-lived
    objects at once), to come back as the policy says."""
    gc.freeze()
    if _installed is not None:
        _installed.froze()
