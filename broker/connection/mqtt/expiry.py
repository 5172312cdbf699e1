"""Sessions that outlive their connection for their expiry interval (MQTT 5.0's, which a DISCONNECT may change;
3.1.1's persistent sessions: a day), then end: their queues deleted, as their user may. A connection that takes the
session up in time cancels it, and goes on with the QoS 2 publishes the session took whose PUBREL had not come (a
resend of one is not published again). Each waiting session is kept in the definitions log (kind "mqtt_session")
until it ends or is taken up, so that a restart ends it when it was due (its queues' own x-expires, a day, is the
longest it can wait)."""

from __future__ import annotations

import asyncio
import logging
import reprlib
import time
from typing import TYPE_CHECKING, Final

from broker.connection.peer_log import PeerLog
from broker.model.access import ChannelAccess
from broker.model.keys import composite_key
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
KIND: Final = "mqtt_session"  # a waiting session's kind in the definitions log


class SessionExpiry:
    """A server's sessions waiting for their expiry."""

    def __init__(self, node: "Node"):
        self.node = node
        self.timers: dict[Key, asyncio.TimerHandle] = {}
        # the packet ids of the QoS 2 publishes each waiting session took, whose PUBREL had not come
        self.qos2: dict[Key, list[int]] = {}

    def start(self, key: Key, user: str, delay: float, queues: list[str], qos2: list[int]) -> None:
        """End the session after delay seconds: its queues go, if no connection took it up meanwhile."""
        self.cancel(key)
        ends_at = int(time.time() * 1000 + delay * 1000)
        self._write(key, {"vhost": key[0], "client_id": key[1], "user": user, "ends_at": ends_at, "queues": queues,
                          "qos2": qos2})
        self._wait(key, user, delay, queues, qos2)

    def _wait(self, key: Key, user: str, delay: float, queues: list[str], qos2: list[int]) -> None:
        self.timers[key] = asyncio.get_running_loop().call_later(delay, self._expire, key, user, queues)
        self.qos2[key] = qos2

    def cancel(self, key: Key) -> list[int]:
        """The session is taken up (or ends): the packet ids of its QoS 2 publishes that wait for their PUBREL."""
        timer = self.timers.pop(key, None)
        if timer is None:
            return []
        timer.cancel()
        self._write(key, None)
        return self.qos2.pop(key)

    def restore(self, stored: list[dict]) -> None:
        """The sessions the store kept waiting: each ends when it was due (at once, if that is past); one that
        cannot be used, or whose vhost is gone, is logged and dropped."""
        now = time.time() * 1000
        for data in stored:
            try:
                key = (data["vhost"], data["client_id"])
                user, ends_at, queues, qos2 = data["user"], data["ends_at"], data["queues"], data["qos2"]
                if not (all(isinstance(name, str) for name in (*key, user)) and isinstance(ends_at, int)
                        and isinstance(queues, list) and all(isinstance(name, str) for name in queues)
                        and isinstance(qos2, list) and all(isinstance(packet_id, int) for packet_id in qos2)):
                    raise TypeError("a field of the wrong type")
            except (KeyError, TypeError) as error:
                log.error("skipping stored MQTT session %s: %s", reprlib.repr(data), error)
                continue
            if key[0] not in self.node.vhosts:
                self._write(key, None)
                continue
            self._wait(key, user, max(0.0, (ends_at - now) / 1000), queues, qos2)

    def stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        self.qos2.clear()

    def _expire(self, key: Key, user: str, queues: list[str]) -> None:
        del self.timers[key]
        del self.qos2[key]
        self._write(key, None)
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

    def _write(self, key: Key, data: dict | None) -> None:
        self.node.record(KIND, composite_key(*key), data)
