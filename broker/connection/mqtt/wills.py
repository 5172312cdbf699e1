"""Last wills: published for a client that went without DISCONNECT, as a broker-made publish of the client's user
(broker.model.operations.publish: that user's write permission checked then, as for any publish). MQTT 5.0's will
delay interval holds one back until it passes, or the session ends, whichever comes first; a connection that takes
the session up again before then cancels it. A held will is kept in the definitions log (kind "mqtt_will") until it
goes, so that a restart publishes it when it was due."""

from __future__ import annotations

import asyncio
import logging
import reprlib
import time
from typing import TYPE_CHECKING, Final

from broker.connection.mqtt import topics
from broker.connection.mqtt.messages import amqp_header
from broker.connection.peer_log import PeerLog
from broker.model.access import ChannelAccess
from broker.model.keys import composite_key
from broker.model.message import Address, Header, Message
from broker.model.operations import Actor, publish
from broker.model.retained import restored_properties, storable_properties
from broker.model.vhost import OPERATOR_OWNER
from protocol import mqtt
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.node import Node

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

Key = tuple[str, str]  # (vhost, client id): a session
KIND: Final = "mqtt_will"  # a held will's kind in the definitions log


class Wills:
    """A server's wills held back by their delay interval."""

    def __init__(self, node: "Node", exchange: str):
        self.node = node
        self.exchange = exchange  # [mqtt] exchange
        self.held: dict[Key, tuple[asyncio.TimerHandle, str, mqtt.Will]] = {}  # session -> (timer, user, will)

    def publish(self, key: Key, user: str, will: mqtt.Will, delay: float, peer: str) -> None:
        """Publish the session's will now, or after delay seconds."""
        self.cancel(key)
        if delay <= 0:
            self._publish(key, user, will, peer)
            return
        self._write(key, {"vhost": key[0], "client_id": key[1], "user": user, "peer": peer,
                          "due_at": int(time.time() * 1000 + delay * 1000), "topic": will.topic,
                          "payload": will.payload, "qos": will.qos, "retain": will.retain,
                          "properties": storable_properties(will.properties)})
        self._hold(key, user, will, delay, peer)

    def _hold(self, key: Key, user: str, will: mqtt.Will, delay: float, peer: str) -> None:
        timer = asyncio.get_running_loop().call_later(delay, self._due, key, peer)
        self.held[key] = (timer, user, will)

    def _due(self, key: Key, peer: str) -> None:
        _, user, will = self.held.pop(key)
        self._write(key, None)
        self._publish(key, user, will, peer)

    def session_ended(self, key: Key, peer: str) -> None:
        """The session ended (a clean start took its client id): its held will goes now."""
        held = self.held.pop(key, None)
        if held is not None:
            held[0].cancel()
            self._write(key, None)
            self._publish(key, held[1], held[2], peer)

    def cancel(self, key: Key) -> None:
        """The session was taken up again: its held will is not published."""
        held = self.held.pop(key, None)
        if held is not None:
            held[0].cancel()
            self._write(key, None)

    def restore(self, stored: list[dict]) -> None:
        """The wills the store kept held: each goes when it was due (at once, if that is past); one that cannot be
        used, or whose vhost is gone, is logged and dropped."""
        now = time.time() * 1000
        for data in stored:
            try:
                key, user, peer = (data["vhost"], data["client_id"]), data["user"], data["peer"]
                will = mqtt.Will(data["topic"], data["payload"], data["qos"], data["retain"],
                                 restored_properties(data["properties"]))
                if not (all(isinstance(text, str) for text in (*key, user, peer, will.topic))
                        and isinstance(will.payload, bytes) and will.qos in (0, 1, 2)
                        and isinstance(will.retain, bool) and isinstance(data["due_at"], int)):
                    raise TypeError("a field of the wrong type")
            except (KeyError, TypeError, AttributeError) as error:
                log.error("skipping stored MQTT will %s: %s", reprlib.repr(data), error)
                continue
            if key[0] not in self.node.vhosts:
                self._write(key, None)
                continue
            self._hold(key, user, will, max(0.0, (data["due_at"] - now) / 1000), peer)

    def stop(self) -> None:
        for timer, _, _ in self.held.values():
            timer.cancel()
        self.held.clear()

    def _publish(self, key: Key, user: str, will: mqtt.Will, peer: str) -> None:
        vhost_name, client_id = key
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is None:
            return
        qos = min(will.qos, 1)
        properties = {name: value for name, value in will.properties.items() if name != "will_delay_interval"}
        body = will.payload
        key_text = topics.routing_key(will.topic)
        header = Header(amqp_header(qos, False, len(body), properties, will.retain))
        message = Message(Address(self.exchange, key_text), header, body)
        try:
            publish(Actor(vhost, ChannelAccess(self.node, user, vhost_name, client_id), OPERATOR_OWNER), self.exchange,
                    [key_text], message)
            if will.retain:  # (once the publish was allowed)
                self.node.retained.put(vhost_name, will.topic, body, qos, properties)
        except AMQPError as error:
            peer_log.warning(peer, "Could not send last will of MQTT client %.200r in vhost %.200r: %s", client_id,
                             vhost_name, error.reply_text)

    def _write(self, key: Key, data: dict | None) -> None:
        self.node.record(KIND, composite_key(*key), data)
