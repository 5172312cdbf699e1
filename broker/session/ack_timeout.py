"""Delivery acknowledgement timeouts (RabbitMQ's consumer_timeout): a channel holding a delivery unacked for longer
than the timeout that applies to it is closed with 406, and its unacked deliveries go back to their queues.

A consumer's timeout is its own (basic.consume argument x-consumer-timeout, as RabbitMQ 4 has it), else its
queue's (argument x-consumer-timeout, policy key consumer-timeout: the lower applies), else the broker's
(consumer_timeout in the config); a basic.get's is its queue's, else the broker's. 0 means none.

One timer per channel, armed while the channel holds deliveries with a timeout; no clock is read per delivery.
Each tick notes (time, next delivery tag): every delivery with a lower tag was made before that time, so a
delivery's age is known to within a tick, a tenth of the shortest timeout the channel has used.

A tick looks at WALK deliveries at most, oldest first, from where the last one stopped: where timeouts differ (a
consumer without one, or with a longer one, beside one with a short one), millions of old deliveries may not be due
yet, and each tick walked them all. The walk starts again from the oldest when one it passed comes due."""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.model.queue import Queue
    from broker.session.channel import Channel
    from broker.session.unacked import Unacked

log = logging.getLogger(__name__)

NONE = float("inf")  # the timeout of a delivery that may wait for its ack for ever
TICKS_PER_TIMEOUT = 10  # ticks within the shortest timeout: how late past its timeout a delivery may be caught
SHORTEST_TICK = 0.005  # seconds
WALK = 4096  # unacked deliveries a tick looks at, at most


def timeout_of(own, queue: "Queue", default: int) -> int | float:
    """The timeout in ms of a delivery from queue: own (a consumer's argument, or None), else the queue's, else the
    broker's default; NONE for 0. (An int, or NONE: RabbitMQ's texts print it as given.)"""
    for timeout in (own, queue.consumer_timeout, default):
        if timeout is not None:
            return timeout or NONE
    return NONE


class AckTimer:
    __slots__ = ("channel", "shortest", "marks", "timer", "walked_to", "walked_due")

    def __init__(self, channel: "Channel"):
        self.channel = channel
        self.shortest = NONE  # the shortest timeout (ms) of the deliveries watched since the timer started
        self.marks: deque[tuple[float, int]] = deque()  # (loop time, the channel's next delivery tag then)
        self.timer: asyncio.TimerHandle | None = None
        self.walked_to = 0  # deliveries with lower tags were looked at since the walk began, none due then
        self.walked_due = NONE  # the loop time the first of those comes due

    def watch(self, timeout: float) -> None:
        """A delivery just made waits for its ack at most timeout ms, less than self.shortest."""
        self.shortest = timeout
        if self.timer is None:
            self._mark(asyncio.get_running_loop().time())
        else:
            self.timer.cancel()
        self._arm()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.marks.clear()
        self.shortest = NONE
        self.walk_again()

    def walk_again(self) -> None:
        """The next tick looks at every delivery from the oldest (older ones are unacked again: a rollback)."""
        self.walked_to = 0
        self.walked_due = NONE

    def _mark(self, now: float) -> None:
        self.marks.append((now, self.channel.next_tag))

    def _arm(self) -> None:
        interval = max(self.shortest / 1000 / TICKS_PER_TIMEOUT, SHORTEST_TICK)
        self.timer = asyncio.get_running_loop().call_later(interval, self._tick)

    def _tick(self) -> None:
        self.timer = None
        channel = self.channel
        unacked = channel.unacked
        if not len(unacked):
            self.stop()
            return
        now = asyncio.get_running_loop().time()
        self._mark(now)
        marks = self.marks
        while marks[0][1] <= unacked.first_tag():  # made before any delivery still unacked: no longer needed
            marks.popleft()
        timed_out = self._first_timed_out(now)
        if timed_out is None:
            self._arm()
            return
        delivery, timeout = timed_out
        self.stop()
        channel.ack_timed_out(delivery, timeout)

    def _first_timed_out(self, now: float) -> "tuple[Unacked, float] | None":
        """The oldest delivery known to be older than its timeout, with that timeout, among the next WALK."""
        if now >= self.walked_due:
            self.walk_again()  # one passed over is due now
        marks = self.marks
        # index of the first mark after the delivery at hand (the last mark names the next tag: the walk stops there)
        made_before = bisect.bisect_right(marks, self.walked_to, key=_next_tag)
        looked = 0
        for tag, delivery in self.channel.unacked.items_from(self.walked_to):
            while marks[made_before][1] <= tag:
                made_before += 1
            made = marks[made_before][0]
            age = (now - made) * 1000
            if age < self.shortest:
                return None  # this delivery and every later one are too young for any timeout
            timeout = self.channel.ack_timeout(delivery)
            if age >= timeout:
                return delivery, timeout
            self.walked_to = tag + 1
            self.walked_due = min(self.walked_due, made + timeout / 1000)
            looked += 1
            if looked == WALK:
                return None
        return None


def _next_tag(mark: tuple[float, int]) -> int:
    return mark[1]


def log_timeout(channel: "Channel", delivery: "Unacked", timeout: int | float) -> None:
    """RabbitMQ's warning for a delivery that waited too long."""
    consumer = f"Consumer '{delivery.consumer.tag}'" if delivery.consumer is not None else "A basic.get"
    log.warning("%s on channel %d and queue '%s' in vhost '%s' has timed out waiting for a consumer acknowledgement "
                "of a delivery with delivery tag = %d. Timeout used: %d ms. This timeout value can be configured, "
                "see consumers doc guide to learn more", consumer, channel.number, delivery.queue.name,
                channel.vhost.name, delivery.tag, timeout)
