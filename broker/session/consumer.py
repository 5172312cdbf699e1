"""A consumer: a queue subscription of one channel, with its prefetch window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from broker.model.features.redelivery import consumer_delayed_retry
from broker.session.ack_timeout import timeout_of

if TYPE_CHECKING:
    from broker.model.queue import Queue
    from broker.session.channel import Channel

UNLIMITED: Final = 1 << 30  # credit of a consumer that no prefetch limit holds back


class Consumer:
    __slots__ = ("tag", "tag_bytes", "channel", "queue", "no_ack", "exclusive", "arguments", "priority", "prefetch",
                 "unacked", "delayed_retry", "ack_timeout", "leaving")

    def __init__(self, tag: str, channel: "Channel", queue: "Queue", no_ack: bool, exclusive: bool,
                 arguments: dict, prefetch: int):
        self.tag = tag
        self.tag_bytes = tag.encode()  # pre-encoded for basic.deliver
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self.priority = arguments.get("x-priority", 0)  # higher-priority consumers are served first
        self.prefetch = prefetch  # per-consumer limit of unacked deliveries (basic.qos global=false), 0 = none
        self.unacked = 0  # deliveries to this consumer not yet acked
        self.delayed_retry = consumer_delayed_retry(arguments)  # its own, over its queue's; None: the queue's
        # ms a delivery to it may wait for its ack (ack_timeout.NONE: for ever)
        self.ack_timeout = timeout_of(arguments.get("x-consumer-timeout"), queue, channel.default_ack_timeout)
        self.leaving = False  # its channel closed: it stays on its queue until its deliveries are back there

    def credit(self) -> int:
        """How many more messages this consumer may be sent right now."""
        channel = self.channel
        if not channel.can_deliver():
            return 0
        if self.no_ack:
            return UNLIMITED
        credit = self.prefetch - self.unacked if self.prefetch else UNLIMITED
        unacked = channel.unacked
        if unacked.global_prefetch:
            credit = min(credit, unacked.global_prefetch - unacked.consumer_count)
        return credit
