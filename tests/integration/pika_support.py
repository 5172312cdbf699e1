"""Small pika helpers for the model tests (exchanges, queues, routing, publishing): connect, catch the broker's
channel and connection errors as (code, text), and collect messages without sleeping."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel


def rabbitmq4(test: Callable) -> Callable:
    """Marks a test of RabbitMQ 4.x behaviour that today's clients expect; the 3.10 reference broker behaves
    differently, so the test is skipped when the suite runs against an external broker."""
    skip = pytest.mark.skipif(bool(os.environ.get("WARREN_TEST_URL")),
                              reason="RabbitMQ 4.x behaviour; the reference broker is 3.10")
    return pytest.mark.rabbitmq4(skip(test))


@dataclass
class Message:
    """One message as a consumer or basic.get sees it."""

    body: bytes
    routing_key: str
    exchange: str
    redelivered: bool
    properties: pika.BasicProperties


def connect(broker: Any, **params: Any) -> pika.BlockingConnection:
    parameters = pika.URLParameters(broker.url)
    for name, value in params.items():
        setattr(parameters, name, value)
    return pika.BlockingConnection(parameters)


@contextlib.contextmanager
def open_channel(broker: Any) -> Iterator[BlockingChannel]:
    """A channel on a connection of its own, closed (with the connection) at the end."""
    connection = connect(broker)
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def fresh(channel: BlockingChannel) -> BlockingChannel:
    """Another channel on the same connection, for use after a channel error."""
    return channel.connection.channel()


def reply_text(text: str) -> str:
    """A reply text as RabbitMQ sends it: a shortstr, so longer texts are cut to 252 bytes followed by '...'."""
    encoded = text.encode()
    return text if len(encoded) <= 255 else encoded[:252].decode(errors="ignore") + "..."


def channel_error(action: Callable[[], Any]) -> tuple[int, str]:
    """Run `action`, which must make the broker close the channel; return (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        action()
    return error.value.reply_code, error.value.reply_text


def connection_error(action: Callable[[], Any]) -> tuple[int, str]:
    """Run `action`, which must make the broker close the connection; return (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        action()
    return error.value.reply_code, error.value.reply_text


def get(channel: BlockingChannel, queue: str) -> Message | None:
    """basic.get with auto-ack: the next message, or None when the queue is empty."""
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    if method is None:
        return None
    return Message(body, method.routing_key, method.exchange, method.redelivered, properties)


def drain(channel: BlockingChannel, queue: str, limit: int = 1000) -> list[Message]:
    """Every message currently in `queue`, in order, taken with basic.get."""
    messages = []
    while len(messages) < limit and (message := get(channel, queue)) is not None:
        messages.append(message)
    return messages


def bodies(channel: BlockingChannel, queue: str) -> list[bytes]:
    return [message.body for message in drain(channel, queue)]


def wait_until(connection: pika.BlockingConnection, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Process events until `condition()` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        assert remaining > 0, "condition not reached before the deadline"
        connection.process_data_events(time_limit=min(remaining, 0.05))


def declare_queue(channel: BlockingChannel, name: str, **kwargs: Any) -> str:
    """An exclusive queue unless told otherwise; returns its name (server-named when `name` is empty)."""
    kwargs.setdefault("exclusive", True)
    return channel.queue_declare(name, **kwargs).method.queue
