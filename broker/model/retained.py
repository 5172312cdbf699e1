"""MQTT's retained messages: the last message published with the retain flag to each topic of a vhost, kept
durably (the definitions log's kind "retained", as RabbitMQ keeps them in a store per vhost) and handed to each new
subscription whose filter matches the topic. An empty retained message clears the topic's."""

from __future__ import annotations

import logging
import reprlib
import time
from typing import TYPE_CHECKING, NamedTuple

from broker.model.keys import composite_key

if TYPE_CHECKING:
    from storage.store import MessageStore

log = logging.getLogger(__name__)


class Retained(NamedTuple):
    topic: str  # the MQTT topic it was published to
    payload: bytes
    qos: int  # the QoS it was published with (0 or 1)
    properties: dict  # its MQTT 5.0 properties (user properties, content type ...), {} from 3.1.1
    expires_at: int = 0  # when its message expiry interval ends (ms since the epoch; 0: never)


class RetainedMessages:
    """Every vhost's retained messages, by vhost and topic."""

    def __init__(self, store: "MessageStore | None"):
        self.store = store  # where they are kept (None: in memory alone)
        self.by_vhost: dict[str, dict[str, Retained]] = {}

    def put(self, vhost: str, topic: str, payload: bytes, qos: int, properties: dict) -> None:
        """Retain payload for topic (an empty one clears the topic's)."""
        topics = self.by_vhost.setdefault(vhost, {})
        if not payload:
            if topics.pop(topic, None) is not None:
                self._write(vhost, topic, None)
            return
        interval = properties.get("message_expiry_interval")
        expires_at = int(time.time() * 1000) + interval * 1000 if isinstance(interval, int) else 0
        message = topics[topic] = Retained(topic, payload, qos, properties, expires_at)
        self._write(vhost, topic, {"vhost": vhost, "topic": topic, "payload": payload, "qos": qos,
                                   "properties": storable_properties(message.properties), "expires_at": expires_at})

    def drop_vhost(self, vhost: str) -> None:
        """The vhost is deleted: so are its retained messages."""
        for topic in self.by_vhost.pop(vhost, {}):
            self._write(vhost, topic, None)

    def restore(self, stored: list[dict], vhosts: set[str]) -> None:
        """Take back what the store kept; one that cannot be used, or whose vhost is gone, is logged and dropped."""
        for data in stored:
            try:
                vhost, topic, payload, qos = data["vhost"], data["topic"], data["payload"], data["qos"]
                properties = data.get("properties") or {}
                expires_at = data.get("expires_at", 0)
                if not (isinstance(vhost, str) and isinstance(topic, str) and isinstance(payload, bytes)
                        and qos in (0, 1) and isinstance(properties, dict) and isinstance(expires_at, int)):
                    raise TypeError("a field of the wrong type")
            except (KeyError, TypeError) as error:
                log.error("skipping stored retained message %s: %s", reprlib.repr(data), error)
                continue
            if vhost not in vhosts:
                self._write(vhost, topic, None)
                continue
            self.by_vhost.setdefault(vhost, {})[topic] = Retained(topic, payload, qos,
                                                                  restored_properties(properties), expires_at)

    def _write(self, vhost: str, topic: str, data: dict | None) -> None:
        if self.store is not None:
            self.store.append_definition("retained", composite_key(vhost, topic), data)


def storable_properties(properties: dict) -> dict:
    """MQTT 5.0 properties as a definition keeps them (user properties as [name, value] lists)."""
    return {name: [list(pair) for pair in value] if name == "user_property" else value
            for name, value in properties.items()}


def restored_properties(properties: dict) -> dict:
    """The properties a definition kept, as they came (user properties as (name, value) pairs)."""
    return {name: [tuple(pair) for pair in value] if name == "user_property" else value
            for name, value in properties.items()}
