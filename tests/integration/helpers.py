"""The client helpers of the integration tests, one per job: connect, declare, publish, take messages back, wait
for events without sleeping, and catch the broker's channel and connection errors as (reply code, reply text)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import amqp
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.waiting import T, wait_for

# Generous bound for anything that should happen "now"; tests normally finish far sooner.
EVENT_TIMEOUT = 5.0
# How long a test watches to prove that something does NOT happen.
QUIET_PERIOD = 0.25


# The marks of RabbitMQ 4.x behaviour that today's clients expect; the 3.10 reference broker behaves differently,
# so such a test (or pytest.param) is skipped when the suite runs against an external broker.
RABBITMQ4 = (pytest.mark.rabbitmq4, pytest.mark.skipif(bool(os.environ.get("WARREN_TEST_URL")),
                                                       reason="RabbitMQ 4.x behaviour; the reference broker is 3.10"))


def rabbitmq4(test: Callable) -> Callable:
    """Marks a test of RabbitMQ 4.x behaviour (RABBITMQ4)."""
    for mark in RABBITMQ4:
        test = mark(test)
    return test


# Marks a test (or a module, as pytestmark) of what Warren does beyond RabbitMQ: skipped when the suite runs
# against an external broker.
beyond_rabbitmq = pytest.mark.skipif(bool(os.environ.get("WARREN_TEST_URL")), reason="Warren goes beyond RabbitMQ here")


# --- connections and channels -------------------------------------------------------------------------------
def connect(broker: Any) -> pika.BlockingConnection:
    """A blocking pika connection to the broker under test. Used as a context manager (`with connect(broker) as
    conn:`) it is closed at the end of the block, quietly if the broker already closed it."""
    return pika.BlockingConnection(pika.URLParameters(broker.url))


@contextlib.contextmanager
def open_channel(broker: Any) -> Iterator[BlockingChannel]:
    """A channel on a connection of its own, closed (with the connection) at the end of the block."""
    with connect(broker) as conn:
        yield conn.channel()


def fresh(ch: BlockingChannel) -> BlockingChannel:
    """Another channel on the same connection, for use after a channel error."""
    return ch.connection.channel()


@contextlib.contextmanager
def amqp_connection(broker: Any) -> Iterator[amqp.Connection]:
    """A py-amqp (kombu's transport) connection, for the methods pika cannot send: nowait, empty consumer tags."""
    with amqp.Connection(host=f"{broker.host}:{broker.port}", userid="guest", password="guest",
                         virtual_host="/") as conn:
        yield conn


# --- declaring and publishing --------------------------------------------------------------------------------
def declare_queue(ch: BlockingChannel, name: str = "", **kwargs: Any) -> str:
    """Declare a queue (with queue.declare's defaults unless told otherwise) and return its name, server-generated
    when `name` is empty."""
    return ch.queue_declare(name, **kwargs).method.queue


def bodies(prefix: str, count: int) -> list[bytes]:
    """Distinct message bodies `prefix-0`, `prefix-1`, ... in publishing order."""
    return [f"{prefix}-{index}".encode() for index in range(count)]


def publish(ch: BlockingChannel, queue: str, messages: Iterable[bytes | str], **kwargs: Any) -> None:
    """Publish each body to `queue` through the default exchange."""
    for body in messages:
        ch.basic_publish("", queue, body, **kwargs)


def enqueue(conn: pika.BlockingConnection, queue: str, messages: Iterable[bytes | str], **kwargs: Any) -> None:
    """Publish each body to `queue` and return once the broker has confirmed that all are enqueued.

    A plain publish is asynchronous: RabbitMQ may answer a later basic.get or passive declare before the message
    reaches the queue. Confirms (on a channel of their own) make the set-up deterministic.
    """
    publisher = conn.channel()
    publisher.confirm_delivery()
    publish(publisher, queue, messages, **kwargs)
    publisher.close()


def prefetch_one_consumer(conn: pika.BlockingConnection, queue: str):
    """A consumer of `queue` with prefetch 1 and manual acks, and a publisher channel in confirm mode on the same
    connection; returns (consumer channel, list of (delivery tag, body) received, publisher channel)."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    received: list[tuple[int, bytes]] = []
    ch.basic_consume(queue, lambda _ch, method, _props, body: received.append((method.delivery_tag, body)))
    publisher = conn.channel()
    publisher.confirm_delivery()
    return ch, received, publisher


# --- taking messages back ------------------------------------------------------------------------------------
@dataclass
class Message:
    """One message as basic.get sees it."""

    body: bytes
    routing_key: str
    exchange: str
    redelivered: bool
    properties: pika.BasicProperties


def get(ch: BlockingChannel, queue: str) -> Message | None:
    """basic.get with auto-ack: the next message, or None when the queue is empty."""
    method, properties, body = ch.basic_get(queue, auto_ack=True)
    if method is None:
        return None
    return Message(body, method.routing_key, method.exchange, method.redelivered, properties)


def drain(ch: BlockingChannel, queue: str) -> list[Message]:
    """Every message currently in `queue`, in order, taken with basic.get (auto-ack)."""
    messages = []
    while (message := get(ch, queue)) is not None:
        messages.append(message)
    return messages


def get_all(ch: BlockingChannel, queue: str) -> list[bytes]:
    """Drain `queue` with basic.get and return the bodies in order."""
    return [message.body for message in drain(ch, queue)]


def drain_with_flags(ch: BlockingChannel, queue: str) -> list[tuple[bytes, bool]]:
    """Drain `queue` with basic.get and return (body, redelivered) pairs in order."""
    return [(message.body, message.redelivered) for message in drain(ch, queue)]


def message_count(ch: BlockingChannel, queue: str) -> int:
    """Ready messages in `queue`, as a passive declare reports them (also a round trip: see `sync`)."""
    return ch.queue_declare(queue, passive=True).method.message_count


@dataclass
class Delivery:
    """One message as a consumer saw it."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    body: bytes


@dataclass
class Inbox:
    """Collects deliveries of one or more consumers, in arrival order."""

    deliveries: list[Delivery] = field(default_factory=list)

    def __call__(self, _ch, method, _properties, body) -> None:
        self.deliveries.append(Delivery(method.consumer_tag, method.delivery_tag, method.redelivered, body))

    @property
    def bodies(self) -> list[bytes]:
        return [delivery.body for delivery in self.deliveries]

    def of(self, consumer_tag: str) -> list[Delivery]:
        return [delivery for delivery in self.deliveries if delivery.consumer_tag == consumer_tag]

    def wait_for(self, conn: pika.BlockingConnection, count: int, timeout: float = EVENT_TIMEOUT) -> list[Delivery]:
        """Wait until at least `count` deliveries arrived and return them all."""
        wait_until(conn, lambda: len(self.deliveries) >= count, timeout)
        return self.deliveries


def consume(ch: BlockingChannel, queue: str, inbox: Inbox | None = None, **kwargs: Any) -> tuple[str, Inbox]:
    """Start a consumer on `queue` that records into `inbox` (a new one by default); return (consumer tag, inbox)."""
    inbox = inbox if inbox is not None else Inbox()
    tag = ch.basic_consume(queue, inbox, **kwargs)
    return tag, inbox


# --- waiting -------------------------------------------------------------------------------------------------
def sync(ch: BlockingChannel) -> None:
    """A round trip on `ch`: every method sent before it has been handled by the broker when this returns.

    Raises ChannelClosedByBroker if the broker closed the channel in the meantime.
    """
    ch.exchange_declare("amq.direct", passive=True)


def wait_until(conn: pika.BlockingConnection, condition: Callable[[], T], timeout: float = EVENT_TIMEOUT,
               what: str = "the condition") -> T:
    """Process connection events until `condition()` holds, and return its value; fail after `timeout` seconds."""
    # a poll that finds the condition unmet processes events for up to 50 ms instead of sleeping (and yields None)
    return wait_for(lambda: condition() or conn.process_data_events(time_limit=0.05), timeout, what, step=0)


def wait_for_message_count(ch: BlockingChannel, queue: str, expected: int, timeout: float = EVENT_TIMEOUT) -> None:
    """Poll `queue` until it holds `expected` ready messages (for effects no event announces, such as a requeue)."""
    wait_until(ch.connection, lambda: message_count(ch, queue) == expected, timeout)


def stay_quiet(conn: pika.BlockingConnection, period: float = QUIET_PERIOD) -> None:
    """Process events for a short while, to show that nothing more arrives."""
    deadline = time.monotonic() + period
    while (remaining := deadline - time.monotonic()) > 0:
        conn.process_data_events(time_limit=remaining)


# --- the broker's errors -------------------------------------------------------------------------------------
def reply_text(text: str) -> str:
    """A reply text as RabbitMQ sends it: a shortstr, so longer texts are cut to 252 bytes followed by '...'."""
    encoded = text.encode()
    return text if len(encoded) <= 255 else encoded[:252].decode(errors="ignore") + "..."


def channel_error(action: Callable[[], object], ch: BlockingChannel | None = None) -> tuple[int, str]:
    """Run `action`, which must make the broker close a channel, and return the close's (reply code, reply text).

    A synchronous method raises the close itself; for an asynchronous one (a publish, an ack) pass its channel `ch`,
    and a round trip on it then brings the close back.
    """
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
        if ch is not None:
            sync(ch)
    return closed.value.reply_code, closed.value.reply_text


def closed_later(conn: pika.BlockingConnection, ch: BlockingChannel, timeout: float = EVENT_TIMEOUT) -> tuple[int, str]:
    """Wait for the broker to close `ch` of its own accord (no method of ours provokes it) and return the close's
    (reply code, reply text), as pika recorded it."""
    wait_until(conn, lambda: ch.is_closed, timeout)
    reason = ch._closing_reason  # pika keeps the broker's close there; no public accessor
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), reason
    return reason.reply_code, reason.reply_text


def connection_error(action: Callable[[], object], conn: pika.BlockingConnection) -> tuple[int, str]:
    """Run `action`, which must make the broker close `conn`, and return the close's (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        action()
        wait_until(conn, lambda: conn.is_closed)
    return closed.value.reply_code, closed.value.reply_text


def confirmed_barrier(conn: pika.BlockingConnection) -> None:
    """A confirmed persistent publish on the same connection: every ack and delivery the broker handled before it
    has reached the disk when this returns (the store writes in order, and a confirm waits for everything before)."""
    barrier = conn.channel()
    barrier.queue_declare("barrier", durable=True)
    barrier.confirm_delivery()
    barrier.basic_publish("", "barrier", b"barrier", pika.BasicProperties(delivery_mode=2))
    barrier.close()


def segment_written_last(data_dir: Path) -> Path:
    """The message store segment written last, in whichever worker's store it is (with several workers a queue is
    owned by the worker of the client that declared it, under spread_vhosts any of them; worker 0's store is
    data_dir's own, worker k's data_dir/workers/k)."""
    segments = [*(data_dir / "messages").glob("*.seg"), *(data_dir / "workers").glob("*/messages/*.seg")]
    return max(segments, key=lambda path: (path.stat().st_mtime_ns, path.name))
