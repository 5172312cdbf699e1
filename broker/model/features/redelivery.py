"""Cures for redelivery loops, as RabbitMQ 4.3's quorum queues have them, for every queue type in Warren: counting
how often a message came back (x-acquired-count, and x-delivery-count for the returns that failed), a delivery
limit past which it is dead-lettered (reason delivery_limit), and delayed retry (a returned message waits before it
is ready again, longer each time it failed).

A return fails (counts towards the limit) when the consumer rejects it with basic.reject or its channel or
connection goes with it unacked; basic.nack and basic.recover return it without failing (RabbitMQ 4.3)."""

from __future__ import annotations

from typing import NamedTuple

from broker.model.arguments.common import text_of
from broker.model.message import QueueEntry
from protocol.codec import LongLong

DEFAULT_QUORUM_DELIVERY_LIMIT = 20  # RabbitMQ 4's default for quorum queues; other queue types have none


class DelayedRetry(NamedTuple):
    """delayed-retry-type/min/max: returned messages wait min * (failed returns, at least 1) ms, at most max."""

    kind: str  # "all" returns wait, only "failed" ones, or only "returned" ones that did not fail
    min_ms: int
    max_ms: int

    def delay_ms(self, entry: QueueEntry, failed: bool) -> int:
        """How long entry, just returned, waits before it is ready again (0: not at all)."""
        if self.kind != "all" and (self.kind == "failed") != failed:
            return 0
        return min(self.min_ms * max(1, entry.delivery_count), self.max_ms)


def delayed_retry(settings: dict) -> DelayedRetry | None:
    """The delayed retry of a queue's settings (policy keys), or of a consumer's arguments with their x- removed;
    None when disabled (rabbit_quorum_queue:get_delayed_retry_config)."""
    kind = settings.get("delayed-retry-type")
    low = settings.get("delayed-retry-min")
    if kind is None or low is None or text_of(kind) == "disabled":
        return None
    high = settings.get("delayed-retry-max")
    return DelayedRetry(text_of(kind), low, low if high is None else high)


def consumer_delayed_retry(arguments: dict) -> DelayedRetry | None:
    """A basic.consume's own x-delayed-retry-type/min/max (beyond RabbitMQ), which override its queue's."""
    return delayed_retry({name[2:]: value for name, value in arguments.items() if name.startswith("x-delayed-retry-")})


def delivery_limit(settings: dict, quorum: bool) -> int | None:
    """The failed returns a message may have before it is dead-lettered; None for no limit (a negative value)."""
    limit = settings.get("delivery-limit")
    if limit is None and quorum:
        limit = DEFAULT_QUORUM_DELIVERY_LIMIT
    return None if limit is None or limit < 0 else limit


def count_return(entry: QueueEntry, failed: bool, annotate: bool) -> None:
    """entry came back to its queue: count it, and with annotate let the consumers of its next delivery see the
    counts in its headers (a copy of the message for this queue, keeping its store id)."""
    entry.redelivered = True
    entry.acquired_count += 1
    if failed:
        entry.delivery_count += 1
    if annotate:
        counts = {"x-acquired-count": LongLong(entry.acquired_count)}
        if entry.delivery_count:
            counts["x-delivery-count"] = LongLong(entry.delivery_count)
        entry.message = entry.message.with_headers(counts)
