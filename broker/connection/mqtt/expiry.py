"""Sessions that outlive their connection for their expiry interval (MQTT 5.0's, which a DISCONNECT may change;
3.1.1's persistent sessions: a day), then end: their queues deleted, as their user may. A connection that takes the
session up in time cancels it. The timers live in memory; across a restart the queues' own x-expires (a day, the
longest interval granted) ends a session instead."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from broker.connection.peer_log import PeerLog
from broker.model.access import ChannelAccess
from broker.model.operations import Actor, delete_queue
from broker.model.vhost import OPERATOR_OWNER
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.node import Node

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

Key = tuple[str, str]  # (vhost, client id): a session
# The longest session expiry granted, in seconds (as RabbitMQ 4.x's), and 3.1.1's persistent sessions' (RabbitMQ's
# subscription_ttl): a session's queues live unused that long at most, across a restart too (their x-expires)
MAX_SESSION_EXPIRY: Final = 86_400


class SessionExpiry:
    """A server's sessions waiting for their expiry."""

    def __init__(self, node: "Node"):
        self.node = node
        self.timers: dict[Key, asyncio.TimerHandle] = {}

    def start(self, key: Key, user: str, delay: float, queues: list[str]) -> None:
        """End the session after delay seconds: its queues go, if no connection took it up meanwhile."""
        self.cancel(key)
        self.timers[key] = asyncio.get_running_loop().call_later(delay, self._expire, key, user, queues)

    def cancel(self, key: Key) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()

    def _expire(self, key: Key, user: str, queues: list[str]) -> None:
        del self.timers[key]
        vhost = self.node.vhosts.get(key[0])
        if vhost is None:
            return
        actor = Actor(vhost, ChannelAccess(self.node, user, vhost.name), OPERATOR_OWNER)
        for name in queues:
            if name in vhost.queues:
                try:
                    delete_queue(actor, name, True, False)  # (if unused: a consumer took it up after all)
                except AMQPError as error:
                    log.warning("MQTT session %.200r of vhost %.200r: its queue %.200r stays past the session's "
                                "expiry: %s", key[1], key[0], name, error.reply_text)
