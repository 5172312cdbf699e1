"""The broker's policy for the cyclic garbage collector (broker.collector): a collection that took too long (full or
young) freezes what survived it, frozen objects are still freed by their last reference, and the frozen ones go back to
the collector once a full walk is cheap again or after the period, so that no garbage cycle waits longer.

The clock and the heap's size are the test's: a collection "takes" what the test says, the heap is as large as it
says; the freezing, the freeing and the collecting are CPython's own."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from broker.collector import Collector, collect_unfrozen, out_of_sight

FREEZE_AFTER = 0.02
PERIOD = 900.0
LOOK_EVERY = 1.0


class Cycle:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


class Scene:
    """A Collector watching the real collector, with a clock that a collection moves on by ``takes`` seconds and a
    heap of ``blocks``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.takes = 0.0  # seconds each collection seems to take
        self.blocks = 1_000_000  # the heap's size the policy reads
        self.soon: list = []  # what the collector asked to run on the event loop
        self.collector = Collector(self.soon.append, FREEZE_AFTER, PERIOD, LOOK_EVERY, clock=lambda: self.now,
                                   heap=lambda: self.blocks)

    def tick(self, phase: str, info: dict) -> None:
        """(Called before the collector, as it ends a collection): the collection took ``takes``."""
        if phase == "stop":
            self.now += self.takes

    def collection(self, generation: int, takes: float = 0.0) -> None:
        self.takes = takes
        gc.collect(generation)

    def full_collection(self, takes: float) -> None:
        self.collection(2, takes)

    def young_collection(self, takes: float = 0.0) -> None:
        self.collection(0, takes)


@pytest.fixture
def scene():
    frozen_before = gc.get_freeze_count() > 0  # (a broker started in this process froze what its recovery made)
    gc.unfreeze()
    gc.collect()
    kept = list(gc.callbacks)
    scene = Scene()
    gc.callbacks[:] = [scene.tick, scene.collector]
    yield scene
    gc.callbacks[:] = kept
    gc.unfreeze()
    if frozen_before:  # (out of sight again, as the later tests of this process would have found it)
        gc.freeze()


def frozen_garbage_cycle() -> weakref.ref:
    """A cycle that is alive when frozen, then dropped: a weak reference that says whether it was collected."""
    cycle = Cycle()
    gc.freeze()
    reference = weakref.ref(cycle)
    del cycle
    return reference


@pytest.mark.parametrize("generation", [2, 0], ids=["full", "young"])
def test_a_collection_longer_than_the_bound_freezes_what_survived_it(scene, generation):
    kept = [[] for _ in range(100_000)]
    scene.collection(generation, takes=0.5)
    assert gc.get_freeze_count() >= len(kept)
    assert scene.soon == [collect_unfrozen]  # (a full collection of the rest, on the event loop)
    later = Cycle()  # made after the freeze: collected as ever
    reference = weakref.ref(later)
    del later
    scene.full_collection(takes=0.0)
    assert reference() is None


@pytest.mark.parametrize("generation", [2, 0], ids=["full", "young"])
def test_a_collection_within_the_bound_freezes_nothing(scene, generation):
    kept = [[] for _ in range(100_000)]
    scene.collection(generation, takes=FREEZE_AFTER)
    assert gc.get_freeze_count() == 0
    assert kept


def test_a_slow_young_collection_leaves_a_full_walks_measure_as_it_was(scene):
    scene.full_collection(takes=0.5)  # over 1,000,000 blocks: 40,000 walked within FREEZE_AFTER
    scene.young_collection(takes=5.0)  # (what it would say: 4,000)
    scene.blocks = 40_000
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() == 0


def test_a_frozen_object_is_freed_when_its_last_reference_goes(scene):
    kept = [[] for _ in range(100_000)]
    scene.full_collection(takes=0.5)
    frozen = gc.get_freeze_count()
    del kept
    assert gc.get_freeze_count() <= frozen - 100_000


def test_the_frozen_go_back_to_the_collector_once_a_full_walk_is_cheap_again(scene):
    scene.full_collection(takes=0.5)  # over 1,000,000 blocks: 40,000 walked within FREEZE_AFTER
    reference = frozen_garbage_cycle()
    scene.full_collection(takes=0.0)
    assert reference() is not None, "a frozen cycle was collected"
    scene.blocks = 50_000
    scene.young_collection()
    assert gc.get_freeze_count() > 0, "unfrozen while a full walk still costs more than the bound"
    scene.blocks = 40_000
    scene.young_collection()
    assert gc.get_freeze_count() > 0, "the heap looked at again within LOOK_EVERY"
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() == 0
    scene.full_collection(takes=0.0)
    assert reference() is None


def test_a_full_collection_while_objects_are_frozen_says_nothing_of_a_whole_walks_cost(scene):
    """It walks what is not frozen alone: its rate over the whole heap's blocks would unfreeze them too early."""
    scene.full_collection(takes=0.5)  # over 1,000,000 blocks, nothing frozen: 40,000 walked within FREEZE_AFTER
    scene.full_collection(takes=2 * FREEZE_AFTER)  # (the rest only: "500,000 within FREEZE_AFTER")
    scene.blocks = 400_000
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() > 0, "unfrozen where a walk of the whole heap takes ten times the bound"
    scene.blocks = 40_000
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() == 0


def test_no_garbage_waits_frozen_longer_than_the_period(scene):
    scene.full_collection(takes=0.5)
    reference = frozen_garbage_cycle()
    scene.now += PERIOD - LOOK_EVERY
    scene.young_collection()
    scene.full_collection(takes=0.0)
    assert reference() is not None, "unfrozen before the period was over"
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() == 0
    scene.full_collection(takes=0.0)
    assert reference() is None


def test_a_freeze_as_the_event_loop_closes_raises_nothing(scene, monkeypatch):
    def closed(call) -> None:
        raise RuntimeError("Event loop is closed")
    scene.collector.soon = closed
    unraisable = []  # what a collector's callback raised (CPython reports it, and goes on)
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    kept = [[] for _ in range(10_000)]
    scene.full_collection(takes=0.5)
    assert gc.get_freeze_count() >= len(kept)
    assert not unraisable


def test_a_slow_young_collection_alone_says_nothing_of_when_a_full_walk_is_cheap(scene):
    """A young collection walks an unknown part of the heap: the frozen objects it left stay frozen however small
    the heap gets, until a full collection measures the rate or the period ends."""
    scene.young_collection(takes=0.5)
    scene.blocks = 1
    scene.now += LOOK_EVERY
    scene.young_collection()
    assert gc.get_freeze_count() > 0
    scene.now += PERIOD
    scene.young_collection()
    assert gc.get_freeze_count() == 0


def test_what_is_made_out_of_sight_is_walked_by_no_collection_and_frozen_at_its_end(scene):
    started: list[int] = []
    gc.callbacks.append(lambda phase, info: started.append(info["generation"]) if phase == "start" else None)
    with out_of_sight():
        with out_of_sight():  # (another thread's, within the first)
            made = [[] for _ in range(100_000)]  # (CPython's thresholds: young collections every 700 allocations)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.isenabled() and not started
    assert gc.get_freeze_count() >= len(made)


def test_a_collector_turned_off_stays_off_after_a_section_out_of_sight(scene):
    gc.disable()
    try:
        with out_of_sight():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
