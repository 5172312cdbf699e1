"""RabbitMQ's mapping between MQTT topics and AMQP routing keys, so that both protocols meet on one topic exchange:
MQTT's level separator "/" is the routing key's ".", its single-level wildcard "+" the binding key's "*", and "#" is
"#" in both. A "." inside an MQTT topic is a word separator too (it reaches the MQTT client as "/"), as with
RabbitMQ's plugin."""

from __future__ import annotations

from typing import Final

_TO_KEY: Final = str.maketrans({"/": "."})
_TO_BINDING: Final = str.maketrans({"/": ".", "+": "*"})
_TO_TOPIC: Final = str.maketrans({".": "/"})
_TO_FILTER: Final = str.maketrans({".": "/", "*": "+"})


def routing_key(topic: str) -> str:
    """The routing key an MQTT publish to topic is sent with."""
    return topic.translate(_TO_KEY)


def binding_key(topic_filter: str) -> str:
    """The binding key of a subscription to topic_filter."""
    return topic_filter.translate(_TO_BINDING)


def topic(routing_key: str) -> str:
    """The MQTT topic a message published with routing_key reaches an MQTT subscriber under."""
    return routing_key.translate(_TO_TOPIC)


def topic_filter(binding_key: str) -> str:
    """The MQTT topic filter a binding key stands for (the management API's view of a subscription)."""
    return binding_key.translate(_TO_FILTER)


def matches(topic_filter: str, topic_name: str) -> bool:
    """Whether a topic matches a filter as the topic exchange would match their keys (for retained messages, which
    no exchange routes): "+" matches one level, an empty one too, and a trailing "#" any number, none included."""
    return _match(routing_key(topic_name).split("."), binding_key(topic_filter).split("."))


def _match(words: list[str], patterns: list[str]) -> bool:
    if not patterns:
        return not words
    head = patterns[0]
    if head == "#":
        return any(_match(words[skip:], patterns[1:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _match(words[1:], patterns[1:])
