"""Message rates, as RabbitMQ's management API gives them (rates_mode basic): the node's and each queue's counters
(model.counters) sampled every ``collect_statistics_interval`` ms, the last HISTORY samples kept, and each total
reported with its rate per second over the last interval (and, when asked with msg_rates_age, its samples).

Sampling walks every queue once per interval (a few attribute reads each); nothing is done per message."""

from __future__ import annotations

import asyncio
import logging
import time
from array import array
from typing import TYPE_CHECKING

from broker.collector import unwalked
from broker.model.counters import QUEUE_COUNTERS
from broker.model.features.ready import let_go

if TYPE_CHECKING:
    from broker.connection.connection import Connection
    from broker.connection.server import Server
    from broker.model.queue import Queue
    from broker.session.channel import Channel

log = logging.getLogger(__name__)

HISTORY = 120  # samples kept per node and per queue (ten minutes at RabbitMQ's default interval)
SLICE = 0.005  # seconds of event-loop time a sampling takes at a stretch before letting other work run
# histories a sample replaced that are freed a loop turn, those of the channels or connections that went with
# them (let_go: about 0.5 µs each with HISTORY samples; with a tuple a sample, 8 µs, and 100,000 queues' freed at
# once held the loop 0.38 s)
HISTORIES_FREED = 1_000
# histories of gone queues forgotten between two looks at the clock (each may free its queue: a few µs)
FORGOTTEN_AT_ONCE = 64

# RabbitMQ's message_stats keys of a queue -> the queue counters (model.counters.QUEUE_COUNTERS) they sum
QUEUE_STATS = {
    "publish": ("published",),
    "deliver": ("delivered_consume_manual_ack",),
    "deliver_no_ack": ("delivered_consume_auto_ack",),
    "get": ("delivered_get_manual_ack",),
    "get_no_ack": ("delivered_get_auto_ack",),
    "get_empty": ("get_empty",),
    "deliver_get": ("delivered_consume_manual_ack", "delivered_consume_auto_ack", "delivered_get_manual_ack",
                    "delivered_get_auto_ack"),
    "redeliver": ("redelivered",),
    "ack": ("acknowledged",),
}
# the node's keys that are not sums of queue counters -> the model.counters.NodeCounters field
NODE_STATS = {
    "publish": "received",
    "confirm": "confirmed",
    "return_unroutable": "unroutable_returned",
    "drop_unroutable": "unroutable_dropped",
}


CHANNEL_STATS = ("publish", "deliver_get", "ack")  # a channel's message_stats keys
CONNECTION_STATS = ("recv_oct", "send_oct")  # a connection's byte counters, RabbitMQ's names


class Samples(array):
    """An array of sampled numbers (a History's), which the cyclic collector does not walk where Warren is built: it
    holds numbers only. (Python's arrays are the collector's containers: the first sampling of 100,000 new queues
    made 300,000 of them with their histories, and the young collections that walked them, 10 to 21 ms each, held
    another client's round trips up to 58 ms while those queues were listed.)"""

    __slots__ = ()


class History:
    """Totals sampled over time, oldest first, the HISTORY latest: each sample's time (ms since the epoch) in
    ``times``, its totals in ``keys`` order in ``totals``: two arrays of numbers, however many samples. (With a tuple
    a sample, each sampling of 100,000 queues made 200,000 objects for the cyclic collector to walk: 8 to 14 ms at
    once, every half second while those queues were listed.) Untracked by the collector as its Samples are: it holds
    them and its keys, a tuple of strings, and so can be part of no cycle."""

    __slots__ = ("keys", "times", "totals", "sampled")

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys
        self.times = Samples("q")
        self.totals = Samples("q")
        self.sampled = 0  # the number of the sampling that last added to it (Rates.samplings)

    def add(self, now_ms: int, values: tuple[int, ...]) -> None:
        self.times.append(now_ms)
        self.totals.extend(values)
        if len(self.times) > HISTORY:
            del self.times[0]
            del self.totals[:len(self.keys)]

    def total(self, back: int, index: int) -> int:
        """The total of ``keys[index]`` in the sample ``back`` samples before the latest."""
        return self.totals[(len(self.times) - 1 - back) * len(self.keys) + index]

    def message_stats(self, age: float | None = None, every: int = 1) -> dict:
        """RabbitMQ's message_stats: each key's latest total and {"rate": per second over the last interval};
        with age (seconds), also that period's samples (newest first, every ``every``-th one) and its average."""
        times = self.times
        if not times:
            return {}
        recent = sum(1 for at in times if at >= times[-1] - age * 1000) if age is not None else 0
        stats: dict = {}
        for index, key in enumerate(self.keys):
            details: dict = {"rate": self._rate(index, 2)}
            if age is not None:
                chosen = [{"sample": self.total(back, index), "timestamp": times[-1 - back]}
                          for back in range(0, recent, every)]
                details.update(samples=chosen, avg_rate=self._rate(index, recent),
                               avg=sum(sample["sample"] for sample in chosen) / len(chosen))
            stats[key] = self.total(0, index)
            stats[f"{key}_details"] = details
        return stats

    def _rate(self, index: int, span: int) -> float:
        """Per second over the last ``span`` samples of the key at ``index`` (0.0 with fewer than two)."""
        span = min(span, len(self.times))
        if span < 2:
            return 0.0
        elapsed = (self.times[-1] - self.times[-span]) / 1000
        return (self.total(0, index) - self.total(span - 1, index)) / elapsed if elapsed > 0 else 0.0


try:
    from broker.model.untracked import untracked
except ImportError:  # (not built here: Warren runs as pure Python, and its collector walks these too)
    pass
else:
    untracked(Samples)
    untracked(History)


class Rates:
    """The node's history and one per live queue, channel and connection, sampled by a task of the event loop
    that walks them in slices of SLICE seconds, so that many queues never hold other work up for long."""

    def __init__(self, server: "Server", interval_ms: int):
        self.server = server
        self.interval = interval_ms / 1000  # seconds between samples
        self.node = History((*QUEUE_STATS, *NODE_STATS))
        # each live queue's history, updated in place: a dict made anew each sampling was young, and the
        # collections of the youngest generation walked its 100,000 entries, 10 ms each time
        self.queues: dict["Queue", History] = {}
        self.samplings = 0  # the samplings of the queues begun
        self.channels: dict["Channel", History] = {}
        self.connections: dict["Connection", History] = {}
        self._task: asyncio.Task | None = None

    def every(self, increment: float) -> int:
        """How many samples apart two samples ``increment`` seconds apart are (at least 1)."""
        return max(1, round(increment / self.interval))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self._sample()
            except Exception:  # a bug here must not stop the rates for good
                log.exception("sampling the message rates failed")
            await asyncio.sleep(max(0.0, started + self.interval - loop.time()))

    async def _sample(self) -> None:
        counters = self.server.node.counters
        sums = [0] * len(QUEUE_COUNTERS)
        for per_type in counters.deleted_queues.values():
            for index, name in enumerate(QUEUE_COUNTERS):
                sums[index] += per_type[name]
        self.samplings += 1
        histories, sampling, sampled = self.queues, self.samplings, 0
        slice_started = time.perf_counter()
        now_ms = int(time.time() * 1000)  # the time of the samples of this slice
        for vhost in list(self.server.node.vhosts.values()):
            for queue in unwalked(list(vhost.queues.values())):
                values = tuple(getattr(queue, name) for name in QUEUE_COUNTERS)
                for index, value in enumerate(values):
                    sums[index] += value
                history = histories.get(queue)
                if history is None:
                    history = histories[queue] = History(QUEUE_KEYS)
                history.add(now_ms, _queue_stats(values))
                history.sampled = sampling
                sampled += 1
                if time.perf_counter() - slice_started > SLICE:
                    await asyncio.sleep(0)
                    slice_started = time.perf_counter()
                    now_ms = int(time.time() * 1000)
        if len(histories) > sampled:  # (queues went since the last sampling)
            await self._forget_gone(sampling)
        node = self.server.node  # (publishes of every protocol)
        node_values = _queue_stats(tuple(sums)) + tuple(node.total(field) for field in NODE_STATS.values())
        now_ms = int(time.time() * 1000)
        self.node.add(now_ms, node_values)
        await self._sample_connections()

    async def _forget_gone(self, sampling: int) -> None:
        """The histories of the queues not sampled by the given sampling (gone since the one before) go, in slices
        of SLICE seconds. A history may hold the last reference to its queue, which goes with it: 100,000 of a
        deleted vhost forgotten in one piece held the event loop 37 to 59 ms."""
        histories = self.queues
        queues = unwalked(list(histories))
        slice_started = time.perf_counter()
        while queues:
            for _ in range(min(FORGOTTEN_AT_ONCE, len(queues))):
                queue = queues.pop()  # (the list lets each go as it is looked at, not all at its end)
                if histories[queue].sampled != sampling:
                    del histories[queue]
            del queue
            if time.perf_counter() - slice_started > SLICE:
                await asyncio.sleep(0)
                slice_started = time.perf_counter()

    async def _sample_connections(self) -> None:
        """Each open connection's bytes in and out, and each of its channels' publishes, deliveries and acks, in
        slices as the queues' (10,000 connections of a channel each took 7 to 31 ms)."""
        connections, channels = {}, {}
        slice_started = time.perf_counter()
        now_ms = int(time.time() * 1000)
        for connection in list(self.server.connections):
            history = self.connections.get(connection) or History(CONNECTION_STATS)
            history.add(now_ms, (connection.received_bytes, connection.sent_bytes))
            connections[connection] = history
            for channel in connection.channels.values():
                history = self.channels.get(channel) or History(CHANNEL_STATS)
                history.add(now_ms, (channel.publish_count, channel.next_tag - 1, channel.ack_count))
                channels[channel] = history
            if time.perf_counter() - slice_started > SLICE:
                await asyncio.sleep(0)
                slice_started = time.perf_counter()
                now_ms = int(time.time() * 1000)
        let_go(self.connections, HISTORIES_FREED)
        let_go(self.channels, HISTORIES_FREED)
        self.connections, self.channels = connections, channels


QUEUE_KEYS = tuple(QUEUE_STATS)  # the order of a queue history's totals
# for each of QUEUE_KEYS, the positions in QUEUE_COUNTERS of the counters it sums
_SUMMED = tuple(tuple(QUEUE_COUNTERS.index(name) for name in names) for names in QUEUE_STATS.values())


def _queue_stats(counters: tuple[int, ...]) -> tuple[int, ...]:
    """A queue's (or the node's summed) QUEUE_COUNTERS as the totals of QUEUE_KEYS."""
    return tuple(sum(counters[index] for index in positions) for positions in _SUMMED)
