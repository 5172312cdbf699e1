"""Message rates, as RabbitMQ's management API gives them (rates_mode basic): the node's and each queue's counters
(model.counters) sampled every ``collect_statistics_interval`` ms, the last HISTORY samples kept, and each total
reported with its rate per second over the last interval (and, when asked with msg_rates_age, its samples).

Sampling walks every queue once per interval (a few attribute reads each); nothing is done per message."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from broker.model.counters import QUEUE_COUNTERS

if TYPE_CHECKING:
    from broker.connection.connection import Connection
    from broker.connection.server import Server
    from broker.model.queue import Queue
    from broker.session.channel import Channel

HISTORY = 120  # samples kept per node and per queue (ten minutes at RabbitMQ's default interval)

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


class History:
    """Totals sampled over time: the sample times (ms since the epoch) and each key's totals, oldest first."""

    __slots__ = ("times", "totals")

    def __init__(self, keys) -> None:
        self.times: deque[int] = deque(maxlen=HISTORY)
        self.totals: dict[str, deque[int]] = {key: deque(maxlen=HISTORY) for key in keys}

    def add(self, now_ms: int, values: dict[str, int]) -> None:
        self.times.append(now_ms)
        for key, series in self.totals.items():
            series.append(values[key])

    def message_stats(self, age: float | None = None, every: int = 1) -> dict:
        """RabbitMQ's message_stats: each key's latest total and {"rate": per second over the last interval};
        with age (seconds), also that period's samples (newest first, every ``every``-th one) and its average."""
        stats: dict = {}
        times = self.times
        if not times:
            return stats
        recent = sum(1 for at in times if at >= times[-1] - age * 1000) if age is not None else 0
        for key, series in self.totals.items():
            details: dict = {"rate": _rate(times, series, 2)}
            if age is not None:
                samples = [{"sample": series[-1 - n], "timestamp": times[-1 - n]} for n in range(0, recent, every)]
                details.update(samples=samples, avg_rate=_rate(times, series, recent),
                               avg=sum(sample["sample"] for sample in samples) / len(samples))
            stats[key] = series[-1]
            stats[f"{key}_details"] = details
        return stats


def _rate(times: deque, series: deque, span: int) -> float:
    """Per second over the last ``span`` samples (0.0 with fewer than two)."""
    span = min(span, len(times))
    if span < 2:
        return 0.0
    elapsed = (times[-1] - times[-span]) / 1000
    return (series[-1] - series[-span]) / elapsed if elapsed > 0 else 0.0


class Rates:
    """The node's history and one per live queue, sampled on a timer of the event loop."""

    def __init__(self, server: "Server", interval_ms: int):
        self.server = server
        self.interval = interval_ms / 1000  # seconds between samples
        self.node = History([*QUEUE_STATS, *NODE_STATS])
        self.queues: dict["Queue", History] = {}
        self.channels: dict["Channel", History] = {}
        self.connections: dict["Connection", History] = {}
        self._timer: asyncio.TimerHandle | None = None

    def every(self, increment: float) -> int:
        """How many samples apart two samples ``increment`` seconds apart are (at least 1)."""
        return max(1, round(increment / self.interval))

    def start(self) -> None:
        self._sample()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _sample(self) -> None:
        now_ms = int(time.time() * 1000)
        counters = self.server.node.counters
        sums = dict.fromkeys(QUEUE_COUNTERS, 0)
        for per_type in counters.deleted_queues.values():
            for name, value in per_type.items():
                sums[name] += value
        live = {}
        for vhost in self.server.node.vhosts.values():
            for queue in vhost.queues.values():
                values = {name: getattr(queue, name) for name in QUEUE_COUNTERS}
                for name, value in values.items():
                    sums[name] += value
                history = self.queues.get(queue) or History(QUEUE_STATS)
                history.add(now_ms, _stats(values))
                live[queue] = history
        self.queues = live  # deleted queues' histories go
        self._sample_connections(now_ms)
        node_values = _stats(sums)
        node_values.update({key: getattr(counters, field) for key, field in NODE_STATS.items()})
        self.node.add(now_ms, node_values)
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._sample)


    def _sample_connections(self, now_ms: int) -> None:
        """Each open connection's bytes in and out, and each of its channels' publishes, deliveries and acks."""
        connections, channels = {}, {}
        for connection in self.server.connections:
            history = self.connections.get(connection) or History(CONNECTION_STATS)
            history.add(now_ms, {"recv_oct": connection.received_bytes, "send_oct": connection.sent_bytes})
            connections[connection] = history
            for channel in connection.channels.values():
                history = self.channels.get(channel) or History(CHANNEL_STATS)
                history.add(now_ms, {"publish": channel.publish_count, "deliver_get": channel.next_tag - 1,
                                     "ack": channel.ack_count})
                channels[channel] = history
        self.connections, self.channels = connections, channels


def _stats(counters: dict[str, int]) -> dict[str, int]:
    """A queue's (or the node's summed) counters as RabbitMQ's message_stats keys."""
    return {key: sum(counters[name] for name in names) for key, names in QUEUE_STATS.items()}
