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

_END: Final = object()  # what a subscription's matching gives once it is done

if TYPE_CHECKING:
    from broker.model.retained import Retained, RetainedMessages

SLICE_SECONDS: Final = 0.003  # matching and sending a loop turn, at most
CHECKED: Final = 256  # topics matched between two looks at the time
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
            message = self.held if self.held is not None else next(messages, _END)
            self.held = None
            if message is _END:
                self.current = None
                continue
            if message is None:  # (topics looked at, none matching: the time is looked at again)
                continue
            if not self.may_send(min(qos, message.qos)):
                self.held = message  # (resume() comes when the client reads or acknowledges)
                return
            self.send(message, topic_filter, qos)
        self.resume()

    def _matching(self, topic_filter: str) -> Iterator["Retained | None"]:
        """The vhost's retained messages the filter matches (not those of a topic that begins with "$" where the
        filter begins with a wildcard, nor those expired), with None after every CHECKED topics looked at, so that
        the caller looks at the time."""
        held = self.store.by_vhost.get(self.vhost, {})
        wildcard_first = topic_filter.startswith(("+", "#"))
        now = int(time.time() * 1000)
        for index, topic in enumerate(list(held)):
            if index % CHECKED == CHECKED - 1:
                yield None
            message = held.get(topic)
            if (message is not None and topics.matches(topic_filter, topic)
                    and not (wildcard_first and topic.startswith("$"))
                    and not (message.expires_at and message.expires_at <= now)):
                yield message
