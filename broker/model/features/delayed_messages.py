"""Delayed messages: an x-delayed-message exchange (the community plugin's interface) holds a message published with
an x-delay header of 1 to 2^32-1 ms until the delay has passed, then routes it by its x-delayed-type through the
exchange's bindings as they are then, with x-delay turned negative (so that it is not delayed again, and consumers
can tell it was), as the plugin does. Any other x-delay (absent, 0, negative, too large, not a number) routes the
message at once.

Unlike the plugin, a persistent message held by a durable exchange is stored in the message store before its
publisher's confirm, under the exchange's own store key, its due time (wall clock, ms) recorded where a queue's
messages record their exchange (the store key names the exchange): it survives a kill -9 and is routed at its due
time after a restart, or at once if that has passed. Waiting messages sit in one heap served by one timer
(features.deadlines), so a million of them cost no timer each."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, NamedTuple

from broker.model.features.deadlines import Deadlines, now_ms
from broker.model.features.ready import let_go
from broker.model.message import Address, Header, Message, carbon_copy_keys
from protocol.codec import LongLong

if TYPE_CHECKING:
    from broker.model.exchange import DelayedExchange
    from broker.model.vhost import VirtualHost

MAX_DELAY_MS = 4294967295  # the plugin's bound: Erlang's longest timer


def delay_of(message: Message) -> int:
    """The ms message asks to wait (its x-delay header, as the plugin reads it), 0 for none."""
    if not message.header.scan.has_headers:
        return 0
    value = (message.headers or {}).get("x-delay")
    if isinstance(value, bool):
        return 0
    if isinstance(value, (bytes, str)):
        try:
            value = int(value)
        except ValueError:
            return 0
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) else 0
    if not isinstance(value, int) or not 0 < value <= MAX_DELAY_MS:
        return 0
    return value


class Waiting(NamedTuple):
    """A held message and the routing keys it was published with."""
    message: Message
    routing_keys: list[str]


NOT_SERVING_RETRY_MS = 100  # ms before due messages are looked at again while their vhost is not served here yet


class DelayedMessages:
    """The messages an x-delayed-message exchange holds."""

    __slots__ = ("vhost", "exchange", "store_key", "waiting")

    def __init__(self, vhost: "VirtualHost", exchange: "DelayedExchange", store_key: str):
        self.vhost = vhost
        self.exchange = exchange
        self.store_key = store_key  # the exchange's name in the message store
        self.waiting: Deadlines[Waiting] = Deadlines(self._due)

    def __len__(self) -> int:
        return len(self.waiting)

    def hold(self, message: Message, routing_keys: list[str], delay_ms: int) -> bool:
        """Keep message until delay_ms have passed; True if it went to the store (its confirm waits for the disk)."""
        stored = self.vhost.store is not None and self.exchange.durable and message.persistent
        if stored:
            node = self.vhost.node
            message.msg_id = node.next_msg_id
            node.next_msg_id += 1
            due_wall_ms = math.ceil(time.time() * 1000) + delay_ms  # rounded up: never routed early after a restart
            self.vhost.store.append_message(message.msg_id, (self.store_key,), str(due_wall_ms),
                                            message.routing_key, message.header_payload, message.body)
        self.waiting.add(now_ms() + delay_ms, Waiting(message, routing_keys))
        return stored

    def restore(self, stored) -> None:
        """Messages read back from the store (storage.recovery.StoredMessage), their due times in their exchange
        field; BCC keys, which the message no longer names, are not restored."""
        now_wall, now = math.floor(time.time() * 1000), now_ms()
        for item in stored:
            message = Message(Address(self.exchange.name, item.routing_key), Header(item.header_payload), item.body,
                              item.msg_id)
            keys = [item.routing_key, *carbon_copy_keys(message.headers or {}, "CC")]
            self.waiting.add(now + max(0, int(item.exchange) - now_wall), Waiting(message, keys))

    def drop(self) -> None:
        """The exchange is deleted: its waiting messages go, freed a slice a loop turn (the vhost drops their stored
        copies)."""
        let_go(self.waiting.take_all())

    def _due(self, due: list[Waiting]) -> None:
        vhost, exchange = self.vhost, self.exchange
        if exchange.deleted:
            return
        if not vhost.serving():  # (a copy of the vhost started again, its bindings not come yet: a little later)
            later = now_ms() + NOT_SERVING_RETRY_MS
            for waiting in due:
                self.waiting.add(later, waiting)
            return
        removed = []
        for message, routing_keys in due:
            routed = _undelayed(message)
            vhost.publish_to(vhost.route(exchange, routing_keys, routed), routed)
            if message.msg_id:
                removed.append(message.msg_id)
        if removed:
            vhost.store.append_removed(self.store_key, removed)


def _undelayed(message: Message) -> Message:
    """The message as it is routed once due: x-delay negated (the plugin's swap_delay_header), a new message for
    the store."""
    routed = message.with_headers({"x-delay": LongLong(-delay_of(message))})
    routed.msg_id = 0
    return routed
