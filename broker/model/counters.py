"""What the node did since it started, counted where it happens and read by the Prometheus endpoint (RabbitMQ's
global counters). An increment is one attribute addition, the only cost on the path of a message; every rate and
total is computed from these when scraped."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.model.queue import Queue

# What each queue counts of its own messages (attributes of broker.model.queue.Queue, 0 when it is made); the
# node keeps the sums of the queues deleted since it started, by queue type.
QUEUE_COUNTERS = (
    "published",  # messages enqueued by publishers (RabbitMQ's queue_messages_published_total)
    "delivered_consume_manual_ack",  # deliveries to consumers that acknowledge
    "delivered_consume_auto_ack",  # deliveries to no-ack consumers
    "delivered_get_manual_ack",  # basic.get-ok answers awaiting an ack
    "delivered_get_auto_ack",  # basic.get-ok answers with no-ack
    "get_empty",  # basic.get-empty answers
    "redelivered",  # deliveries and get-oks flagged redelivered
    "acknowledged",  # deliveries acknowledged (basic.ack, alone or multiple)
)


AMQP_LABEL = "amqp091"  # RabbitMQ's protocol label of AMQP 0-9-1's counters


class NodeCounters:
    """The node's counters that are not a queue's."""

    __slots__ = ("received", "received_confirm", "routed", "unroutable_dropped", "unroutable_returned",
                 "confirmed", "connections_opened", "connections_closed", "channels_opened", "channels_closed",
                 "queues_declared", "queues_created", "queues_deleted", "auth_attempts", "auth_failed",
                 "deleted_queues", "dead_lettered")

    def __init__(self) -> None:
        self.received = 0  # messages published by clients
        self.received_confirm = 0  # of those, published on channels in confirm mode
        self.routed = 0  # published messages routed to at least one queue (or held by a delayed exchange)
        self.unroutable_dropped = 0  # published messages routed nowhere and dropped
        self.unroutable_returned = 0  # published messages routed nowhere and returned (mandatory)
        self.confirmed = 0  # publisher confirms sent as acks
        self.connections_opened = 0  # AMQP connections that reached connection.open-ok
        self.connections_closed = 0  # of those, the ones gone since
        self.channels_opened = 0
        self.channels_closed = 0
        self.queues_declared = 0  # queue.declare (not passive) answered with declare-ok, new queue or not
        self.queues_created = 0
        self.queues_deleted = 0
        self.auth_attempts = 0  # logins tried (connection.start-ok)
        self.auth_failed = 0  # of those, the refused ones
        # (reason, queue type, "at_most_once" with a dead-letter exchange or "disabled") -> messages that left a
        # queue for that reason (expired, rejected, maxlen, delivery_limit), dead-lettered or dropped
        self.dead_lettered: dict[tuple[str, str, str], int] = {}
        # queue type ("classic"/"quorum") -> the QUEUE_COUNTERS summed over the queues of that type deleted so far
        self.deleted_queues: dict[str, dict[str, int]] = {}

    def count_dead_lettered(self, reason: str, queue: "Queue", count: int) -> None:
        """count messages left queue for reason: dead-lettered if it has a dead-letter exchange, else dropped."""
        key = (reason, queue.queue_type, "at_most_once" if queue.dead_letter_exchange is not None else "disabled")
        self.dead_lettered[key] = self.dead_lettered.get(key, 0) + count

    def queue_deleted(self, queue: "Queue") -> None:
        """Keep a deleted queue's counters in its type's sums, so that totals never go down."""
        self.queues_deleted += 1
        sums = self.deleted_queues.setdefault(queue.queue_type, dict.fromkeys(QUEUE_COUNTERS, 0))
        for name in QUEUE_COUNTERS:
            sums[name] += getattr(queue, name)
