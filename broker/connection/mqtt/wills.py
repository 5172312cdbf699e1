"""Last wills: published for a client that went without DISCONNECT, as a broker-made publish of the client's user
(broker.model.operations.publish: that user's write permission checked then, as for any publish). MQTT 5.0's will
delay interval holds one back until it passes, or the session ends, whichever comes first; a connection that takes
the session up again before then cancels it. Held wills live in memory: a broker restart drops them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from broker.connection.mqtt import topics
from broker.connection.mqtt.messages import amqp_header
from broker.connection.peer_log import PeerLog
from broker.model.access import ChannelAccess
from broker.model.message import Address, Header, Message
from broker.model.operations import Actor, publish
from broker.model.vhost import OPERATOR_OWNER
from protocol import mqtt
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.node import Node

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

Key = tuple[str, str]  # (vhost, client id): a session


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
        timer = asyncio.get_running_loop().call_later(delay, self._due, key, peer)
        self.held[key] = (timer, user, will)

    def _due(self, key: Key, peer: str) -> None:
        _, user, will = self.held.pop(key)
        self._publish(key, user, will, peer)

    def session_ended(self, key: Key, peer: str) -> None:
        """The session ended (a clean start took its client id): its held will goes now."""
        held = self.held.pop(key, None)
        if held is not None:
            held[0].cancel()
            self._publish(key, held[1], held[2], peer)

    def cancel(self, key: Key) -> None:
        """The session was taken up again: its held will is not published."""
        held = self.held.pop(key, None)
        if held is not None:
            held[0].cancel()

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
