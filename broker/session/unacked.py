"""A channel's unacked deliveries (LavinMQ's unacked_store): delivery tags in order, the deliveries an ack, nack or
reject names (one tag, or every tag up to one with `multiple`), and the prefetch counts they hold: per consumer
(on the consumer, which its credit reads) and channel-wide (basic.qos global)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple

from protocol import errors

if TYPE_CHECKING:
    from broker.model.message import QueueEntry
    from broker.model.queue import Queue
    from broker.session.consumer import Consumer


class Unacked(NamedTuple):
    """A delivery awaiting ack: where it came from and who got it."""
    tag: int
    entry: QueueEntry
    queue: Queue
    consumer: Consumer | None  # None for basic.get


class UnackedStore:
    __slots__ = ("deliveries", "consumer_count", "global_prefetch")

    def __init__(self) -> None:
        self.deliveries: OrderedDict[int, Unacked] = OrderedDict()  # delivery tag -> unacked delivery, tag order
        self.consumer_count = 0  # unacked deliveries made to consumers (what the global limit counts)
        self.global_prefetch = 0  # channel-wide limit of unacked consumer deliveries (basic.qos global), 0 = none

    def __len__(self) -> int:
        return len(self.deliveries)

    def push(self, delivery: Unacked) -> None:
        """A delivery was sent; a consumer's takes one of its prefetch slots and one of the channel's."""
        self.deliveries[delivery.tag] = delivery
        counted(delivery, 1)
        consumer = delivery.consumer
        if consumer is not None:
            consumer.unacked += 1
            self.consumer_count += 1

    def pop(self, tag: int) -> Unacked:
        """Remove the delivery a single ack names, releasing its prefetch slots (the common case, in one step)."""
        delivery = self.deliveries.pop(tag, None)
        if delivery is None:
            raise errors.precondition_failed(f"unknown delivery tag {tag}")
        counted(delivery, -1)
        consumer = delivery.consumer
        if consumer is not None:
            consumer.unacked -= 1
            self.consumer_count -= 1
        return delivery

    def take(self, tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the deliveries an ack/nack/reject names (RabbitMQ's collect_acks); their prefetch
        slots stay taken until release()."""
        deliveries = self.deliveries
        if multiple and tag == 0:
            taken = list(deliveries.values())
            deliveries.clear()
        elif tag not in deliveries:
            raise errors.precondition_failed(f"unknown delivery tag {tag}")
        elif not multiple:
            taken = [deliveries.pop(tag)]
        else:
            return self.take_up_to(tag, len(deliveries))
        for delivery in taken:
            counted(delivery, -1)
        return taken

    def holds(self, tag: int) -> bool:
        return tag in self.deliveries

    def holds_up_to(self, tag: int) -> bool:
        """Whether a delivery with a tag up to ``tag`` is still unacked."""
        deliveries = self.deliveries
        return bool(deliveries) and next(iter(deliveries)) <= tag

    def take_up_to(self, tag: int, most: int) -> list[Unacked]:
        """Remove and return the first deliveries with tags up to ``tag``, at most ``most`` of them (a multiple ack
        of millions is taken a slice at a time); their prefetch slots stay taken until release()."""
        deliveries = self.deliveries
        taken: list[Unacked] = []
        while deliveries and len(taken) < most:
            if next(iter(deliveries)) > tag:
                break
            delivery = deliveries.popitem(last=False)[1]
            counted(delivery, -1)
            taken.append(delivery)
        return taken

    def release(self, taken: list[Unacked]) -> None:
        """Taken deliveries are settled: their consumers' prefetch windows open up again."""
        for delivery in taken:
            consumer = delivery.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.consumer_count -= 1

    def restore(self, taken: list[Unacked]) -> None:
        """Taken deliveries are unacked again (a rollback undid their acks), in tag order."""
        for delivery in taken:
            self.deliveries[delivery.tag] = delivery
            counted(delivery, 1)
        self.deliveries = OrderedDict(sorted(self.deliveries.items()))


def counted(delivery: Unacked, sign: int) -> None:
    """The delivery's queue counts it among its unacked deliveries (sign 1), or no longer (-1)."""
    queue = delivery.queue
    queue.unacked_count += sign
    message = delivery.entry.message
    if message is not None:  # (it is: only an entry that expired in the ready list has none)
        queue.unacked_bytes += sign * len(message.body)
