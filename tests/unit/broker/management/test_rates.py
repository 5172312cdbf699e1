"""The message rates' sampling (broker.management.rates) walks the queues, connections and channels a slice at a
time, and the histories of those that went since the last sample are freed a slice at a time (100,000 queues'
histories of HISTORY samples freed at once held the event loop 0.38 s)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from types import SimpleNamespace

from broker.management import rates
from broker.management.rates import HISTORY, History, Rates
from broker.model.node import Node
from broker.model.queue import Queue
from tests.unit.broker.model.test_exclusive_queues import Owner

QUEUES = 3_000  # deleted between two samplings: many slices of rates.FORGOTTEN_AT_ONCE
UNTRACKED = importlib.util.find_spec("broker.model.untracked") is not None  # (built here: see broker/model/untracked.c)


def queues_alive(vhost) -> int:
    """The queues of vhost still alive (another test of the process may have left one of its own)."""
    return sum(isinstance(held, Queue) and held.vhost is vhost for held in gc.get_objects())


def histories() -> int:
    """The histories alive, as the containers the collector tracks hold them (where Warren is built, a history is out
    of its sight)."""
    return sum(isinstance(held, History) for container in gc.get_objects() for held in gc.get_referents(container))


def test_the_histories_of_queues_gone_go_a_few_at_a_time_and_their_queues_with_them(monkeypatch):
    """A sampling forgets the histories of the queues gone since the one before a slice of SLICE seconds at a time,
    and a deleted queue whose last reference its history held goes with it: the 100,000 of a deleted vhost forgotten
    in one piece held the event loop 37 to 59 ms."""
    monkeypatch.setattr(rates, "SLICE", 0.0)  # (every look at the clock ends a slice: one per FORGOTTEN_AT_ONCE)

    async def scenario() -> tuple[int, list[tuple[int, int]]]:
        node = Node()
        vhost = node.add_vhost("v")
        sampler = Rates(SimpleNamespace(node=node, connections=[]), 5_000)
        queues = [vhost.declare_queue(f"q{number}", Owner(), False, False, False, False, {})
                  for number in range(QUEUES)]
        await sampler._sample()
        before = histories()
        while queues:
            vhost.delete_queue(queues.pop())  # (held from here on by their histories alone)
        sampling = asyncio.ensure_future(sampler._sample())
        seen = []  # (histories, queues) alive after each loop turn of the sampling
        while not sampling.done():
            await asyncio.sleep(0)
            seen.append((histories(), queues_alive(vhost)))
        return before, seen

    before, seen = asyncio.run(scenario())
    assert before >= QUEUES
    assert seen[-1] == (before - QUEUES, 0)
    assert all(alive == kept - (before - QUEUES) for kept, alive in seen)  # (each queue with its history)
    assert len(seen) > QUEUES // rates.FORGOTTEN_AT_ONCE
    assert all(earlier[1] - later[1] <= rates.FORGOTTEN_AT_ONCE for earlier, later in zip(seen, seen[1:]))
    assert QUEUES - seen[0][1] <= rates.FORGOTTEN_AT_ONCE


def test_a_history_keeps_its_latest_samples_as_numbers_and_no_sample_adds_an_object_for_the_collector():
    """Samples a second apart, each total growing by its index plus one a sample: the HISTORY latest are kept,
    newest first, with their rates; no sample adds an object the cyclic collector walks."""
    history = History(("first", "second"))
    tracked = len(gc.get_objects())
    for number in range(2 * HISTORY):
        history.add(1000 * number, (number, 2 * number))
    assert len(gc.get_objects()) - tracked < 5
    if UNTRACKED:  # (where Warren is built, the history itself is out of the collector's sight too)
        assert not any(gc.is_tracked(each) for each in (history, history.times, history.totals))
    stats = history.message_stats(age=3600)
    latest = 2 * HISTORY - 1
    assert stats["first"] == latest and stats["second"] == 2 * latest
    assert stats["first_details"]["rate"] == 1.0 and stats["second_details"]["rate"] == 2.0
    assert [sample["sample"] for sample in stats["second_details"]["samples"]] == [
        2 * number for number in range(latest, latest - HISTORY, -1)]
    assert stats["first_details"]["samples"][0]["timestamp"] == 1000 * latest
    assert stats["first_details"]["avg_rate"] == 1.0 and stats["first_details"]["avg"] == latest - (HISTORY - 1) / 2
    assert history.message_stats(age=2, every=2)["first_details"]["samples"] == [
        {"sample": latest, "timestamp": 1000 * latest}, {"sample": latest - 2, "timestamp": 1000 * (latest - 2)}]


class Connection:
    """What the sampling reads of an open connection and its one channel."""

    def __init__(self) -> None:
        self.received_bytes, self.sent_bytes = 100, 200
        self.channels = {1: Channel()}


class Channel:
    def __init__(self) -> None:
        self.publish_count, self.next_tag, self.ack_count = 0, 1, 0


def test_many_connections_are_sampled_a_slice_at_a_time():
    connections = [Connection() for _ in range(20_000)]  # (15 to 60 ms to sample here)

    async def scenario() -> tuple[int, int, int]:
        rates = Rates(SimpleNamespace(node=Node(), connections=connections), 5_000)
        sampling = asyncio.ensure_future(rates._sample())
        turns = 0
        while not sampling.done():
            await asyncio.sleep(0)
            turns += 1
        return turns, len(rates.connections), len(rates.channels)

    turns, connections_sampled, channels_sampled = asyncio.run(scenario())
    assert turns > 2 and connections_sampled == channels_sampled == 20_000


def test_a_sampling_of_many_queues_makes_no_container_of_them_for_the_collector_to_walk():
    """Between the slices of a sampling of many queues, no container the collector tracks holds them all but the
    vhost's own and the histories' (kept from one sampling to the next): a dict of their histories made anew, or a
    young list of them, cost each collection of the youngest generation 6 to 10 ms while they were sampled."""
    many = 20_000

    async def scenario() -> tuple[list[int], bool]:
        node = Node()
        vhost = node.add_vhost("v")
        rates = Rates(SimpleNamespace(node=node, connections=[]), 5_000)
        for number in range(many):
            vhost.declare_queue(f"q{number}", Owner(), False, False, False, False, {})
        await rates._sample()
        kept = rates.queues
        # containers as big held before the sampling: the vhost's queues, the histories kept from the first sampling,
        # and whatever earlier tests of this process left
        before = [held for held in gc.get_objects() if isinstance(held, (list, dict)) and len(held) >= many]
        sampling = asyncio.ensure_future(rates._sample())
        holding = []
        while not sampling.done():
            await asyncio.sleep(0)
            holding.append(sum(1 for held in gc.get_objects() if isinstance(held, (list, dict)) and len(held) >= many
                               and not any(held is old for old in before)))
        return holding, rates.queues is kept

    holding, kept = asyncio.run(scenario())
    assert len(holding) > 2 and kept
    if UNTRACKED:  # (where Warren runs as pure Python, the sampling's list of the queues is walked as any list)
        assert holding == [0] * len(holding)
