"""The retained messages a connection's new subscriptions match, sent a slice at a time: a few milliseconds of
matching a loop turn, while the client reads what it is sent, and at QoS 1 no more unacknowledged at once than its
prefetch. However many retained messages a vhost holds, or subscriptions a client makes, it costs the other clients
nothing, and the client's memory in the broker stays bounded."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Final, Iterator

from broker.connection.mqtt import topics
from broker.model.turns import next_turn

if TYPE_CHECKING:
    from broker.model.retained import Retained, RetainedMessages

SLICE_SECONDS: Final = 0.003  # matching and sending a loop turn, at most
MAX_WAITING: Final = 10_000  # subscriptions whose retained messages wait to be sent; past them, none are


class RetainedSender:
    """What one connection's subscriptions have still to be sent of the retained messages."""

    def __init__(self, store: "RetainedMessages", vhost: str, send: Callable[["Retained", str, int], None],
                 may_send: Callable[[int], bool]):
        self.store = store
        self.vhost = vhost
        self.send = send  # sends a retained message for a subscription (topic filter, QoS)
        self.may_send = may_send  # whether a message may go at this QoS now (the client reads, has credit)
        self.waiting: deque[tuple[str, int]] = deque()  # subscriptions (topic filter, QoS) not yet begun
        self.current: tuple[str, int, Iterator["Retained"]] | None = None  # the one being sent
        self.held: "Retained | None" = None  # the next message of the current one, waiting for may_send
        self.scheduled = False

    def add(self, topic_filter: str, qos: int) -> bool:
        """Send the retained messages the subscription matches; False when too many wait already (none are)."""
        if len(self.waiting) >= MAX_WAITING:
            return False
        self.waiting.append((topic_filter, qos))
        self.resume()
        return True

    def resume(self) -> None:
        """Go on at the next loop turn (the client read, or acknowledged)."""
        if not self.scheduled and (self.current is not None or self.waiting):
            self.scheduled = True
            next_turn(self._slice)

    def stop(self) -> None:
        self.waiting.clear()
        self.current = None
        self.held = None

    def _slice(self) -> None:
        self.scheduled = False
        ends = time.perf_counter() + SLICE_SECONDS
        while time.perf_counter() < ends:
            if self.current is None:
                if not self.waiting:
                    return
                topic_filter, qos = self.waiting.popleft()
                self.current = (topic_filter, qos, self._matching(topic_filter))
            topic_filter, qos, messages = self.current
            message = self.held if self.held is not None else next(messages, None)
            self.held = None
            if message is None:
                self.current = None
                continue
            if not self.may_send(min(qos, message.qos)):
                self.held = message  # (resume() comes when the client reads or acknowledges)
                return
            self.send(message, topic_filter, qos)
        self.resume()

    def _matching(self, topic_filter: str) -> Iterator["Retained"]:
        """The vhost's retained messages the filter matches: looked up for a filter without wildcards, else the
        topics matched one by one (a slice at a time, as the caller asks for them)."""
        held = self.store.by_vhost.get(self.vhost, {})
        if "+" not in topic_filter and "#" not in topic_filter:
            message = held.get(topic_filter)
            return iter(() if message is None else (message,))
        return (message for topic, message in list(held.items()) if topics.matches(topic_filter, topic))
