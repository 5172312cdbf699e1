"""Small client helpers shared by the integration tests: connect, declare, publish, wait for events, check closes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import amqp
import pika
import pika.exceptions
import pytest

# Generous bound for anything that should happen "now"; tests normally finish far sooner.
EVENT_TIMEOUT = 5.0
# How long a test watches to prove that something does NOT happen.
QUIET_PERIOD = 0.25


@contextlib.contextmanager
def connection(broker) -> Iterator[pika.BlockingConnection]:
    """A blocking pika connection to the broker under test, closed at the end of the block (quietly, if the
    broker already closed it)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@contextlib.contextmanager
def channel(broker) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """One channel on a connection of its own, both closed at the end of the block."""
    with connection(broker) as conn:
        yield conn.channel()


def declare_queue(ch, name: str = "", **kwargs) -> str:
    """Declare a queue and return its (possibly server-generated) name."""
    return ch.queue_declare(name, **kwargs).method.queue


def publish(ch, queue: str, bodies: Iterable[bytes | str], **kwargs) -> None:
    """Publish each body to `queue` through the default exchange."""
    for body in bodies:
        ch.basic_publish("", queue, body, **kwargs)


def enqueue(conn: pika.BlockingConnection, queue: str, bodies: Iterable[bytes | str], **kwargs) -> None:
    """Publish each body to `queue` and return once the broker has confirmed that all are enqueued.

    A plain publish is asynchronous: RabbitMQ may answer a later basic.get or passive declare before the message
    reaches the queue. Confirms (on a channel of their own) make the set-up deterministic.
    """
    publisher = conn.channel()
    publisher.confirm_delivery()
    publish(publisher, queue, bodies, **kwargs)
    publisher.close()


def bodies(prefix: str, count: int) -> list[bytes]:
    """Distinct message bodies `prefix-0`, `prefix-1`, ... in publishing order."""
    return [f"{prefix}-{index}".encode() for index in range(count)]


def message_count(ch, queue: str) -> int:
    """Ready messages in `queue`, as a passive declare reports them (also a round trip: see `sync`)."""
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_for_message_count(ch, queue: str, expected: int, timeout: float = EVENT_TIMEOUT) -> None:
    """Poll `queue` until it holds `expected` ready messages (for effects no event announces, such as a requeue)."""
    wait_until(ch.connection, lambda: message_count(ch, queue) == expected, timeout)


def sync(ch) -> None:
    """A round trip on `ch`: every method sent before it has been handled by the broker when this returns.

    Raises ChannelClosedByBroker if the broker closed the channel in the meantime.
    """
    ch.exchange_declare("amq.direct", passive=True)


def wait_until(conn: pika.BlockingConnection, condition: Callable[[], bool], timeout: float = EVENT_TIMEOUT) -> None:
    """Process connection events until `condition()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"condition not met within {timeout}s")
        conn.process_data_events(time_limit=min(remaining, 0.05))


def stay_quiet(conn: pika.BlockingConnection, period: float = QUIET_PERIOD) -> None:
    """Process events for a short while, to show that nothing more arrives."""
    deadline = time.monotonic() + period
    while (remaining := deadline - time.monotonic()) > 0:
        conn.process_data_events(time_limit=remaining)


def get_all(ch, queue: str) -> list[bytes]:
    """Drain `queue` with no-ack basic.get and return the bodies in order."""
    return [body for body, _redelivered in drain_with_flags(ch, queue)]


def drain_with_flags(ch, queue: str) -> list[tuple[bytes, bool]]:
    """Drain `queue` with no-ack basic.get and return (body, redelivered) pairs in order."""
    drained = []
    while True:
        method, _properties, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return drained
        drained.append((body, method.redelivered))


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


def consume(ch, queue: str, inbox: Inbox | None = None, **kwargs) -> tuple[str, Inbox]:
    """Start a consumer on `queue` that records into `inbox` (a new one by default); return (consumer tag, inbox)."""
    inbox = inbox if inbox is not None else Inbox()
    tag = ch.basic_consume(queue, inbox, **kwargs)
    return tag, inbox


def closed_channel_reason(action: Callable[[], object], ch) -> tuple[int, str]:
    """Run `action` (which should make the broker close `ch`), then return the close's (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
        sync(ch)
    return closed.value.reply_code, closed.value.reply_text


def closed_connection_reason(action: Callable[[], object], conn: pika.BlockingConnection) -> tuple[int, str]:
    """Run `action` (which should make the broker close `conn`), then return the close's (reply code, reply text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        action()
        wait_until(conn, lambda: conn.is_closed)
    return closed.value.reply_code, closed.value.reply_text


@contextlib.contextmanager
def amqp_connection(broker) -> Iterator[amqp.Connection]:
    """A py-amqp (kombu's transport) connection, for the methods pika cannot send: nowait, empty consumer tags."""
    with amqp.Connection(host=f"{broker.host}:{broker.port}", userid="guest", password="guest",
                         virtual_host="/") as conn:
        yield conn


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
