"""A queue's dispatch: one message at a time to the first consumer with credit, which then goes behind the others
of its priority (round-robin, higher priorities first), as RabbitMQ serves them; consumers without credit are
passed over once a round, not once a delivery."""

from __future__ import annotations

import asyncio
import time

import pytest
from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.queue import DISPATCH_BATCH
from broker.model.vhost import VirtualHost
from protocol.codec import encode_header_payload


class Owner:
    exclusive_queues: set = set()


class Target:
    """A channel as the queue sees it: the deliveries, by consumer name."""

    def __init__(self) -> None:
        self.delivered: list[str] = []

    def deliver(self, subscriber, queue, entry) -> None:
        subscriber.unacked += 1
        self.delivered.append(subscriber.name)

    def consumer_cancelled_by_server(self, subscriber) -> None:
        pass


class Subscriber:
    """A consumer with a prefetch (0: none), counting how often the queue asked for its credit."""

    looks = 0  # credit() calls over every subscriber

    def __init__(self, name: str, channel: Target, prefetch: int, priority: int = 0) -> None:
        self.name = name
        self.channel = channel
        self.prefetch = prefetch
        self.priority = priority
        self.exclusive = False
        self.unacked = 0
        self.arguments: dict = {}

    def credit(self) -> int:
        Subscriber.looks += 1
        return self.prefetch - self.unacked if self.prefetch else 1 << 30


def published(count: int, subscribers: list[Subscriber], waiting: bool) -> list[str]:
    """count messages published to a queue the subscribers consume from (in that order), each handed on as it
    comes, or (waiting) all of them before the subscribers come; then one dispatch round. Who got each."""
    async def run() -> list[str]:
        vhost = VirtualHost("/")
        queue = vhost.declare_queue("q", Owner(), False, False, False, False, {})
        header = messages.Header(encode_header_payload(1, Basic.Properties()))
        if not waiting:
            for subscriber in subscribers:
                queue.add_consumer(subscriber)
        Subscriber.looks = 0
        for number in range(count):
            queue.enqueue(messages.Message(messages.Address("", "q"), header, b"%d" % number))
        for subscriber in subscribers if waiting else ():
            queue.add_consumer(subscriber)
        vhost.dispatcher.run()
        return subscribers[0].channel.delivered
    return asyncio.run(run())


@pytest.mark.parametrize("waiting", [False, True])
def test_consumers_take_turns_higher_priorities_first_and_each_within_its_prefetch(waiting):
    channel = Target()
    subscribers = [Subscriber("a", channel, 2), Subscriber("b", channel, 0), Subscriber("high", channel, 1, 5),
                   Subscriber("c", channel, 1)]
    assert published(8, subscribers, waiting) == ["high", "a", "b", "c", "a", "b", "b", "b"]


@pytest.mark.parametrize("waiting", [False, True])
def test_consumers_without_credit_are_passed_over_once(waiting):
    """2,000 consumers with a full prefetch ahead of one without a limit: publishing DISPATCH_BATCH messages asks
    each for its credit about once, whether each message is handed on as it comes or a round hands them all
    (asking 2,000 of them before each delivery took 168 ms a round at 10,000)."""
    channel = Target()
    full = [Subscriber(f"full{number}", channel, 1) for number in range(2000)]
    for subscriber in full:
        subscriber.unacked = 1
    free = Subscriber("free", channel, 0)
    assert published(DISPATCH_BATCH, [*full, free], waiting) == ["free"] * DISPATCH_BATCH
    assert Subscriber.looks <= 2 * (len(full) + DISPATCH_BATCH)


def test_a_turn_dispatches_queues_until_its_time_is_spent_and_the_next_turns_the_rest_in_order():
    """200 queues, each with a consumer and a round's worth of messages ready: one turn of the loop does not make
    all 102,400 deliveries; the queues left are served in the turns that follow, those marked first first."""
    async def run() -> tuple[int, list[str]]:
        vhost = VirtualHost("/")
        header = messages.Header(encode_header_payload(1, Basic.Properties()))
        channel = Target()
        for number in range(200):
            queue = vhost.declare_queue(f"q{number}", Owner(), False, False, False, False, {})
            for _ in range(DISPATCH_BATCH):
                queue.enqueue(messages.Message(messages.Address("", queue.name), header, b"x"))
            queue.add_consumer(Subscriber(queue.name, channel, 0))
        vhost.dispatcher.run()
        first_turn = len(channel.delivered)
        deadline = time.monotonic() + 30
        while len(channel.delivered) < 200 * DISPATCH_BATCH and time.monotonic() < deadline:
            await asyncio.sleep(0)
        return first_turn, channel.delivered

    first_turn, delivered = asyncio.run(run())
    assert 0 < first_turn < 200 * DISPATCH_BATCH
    assert delivered == [f"q{number}" for number in range(200) for _ in range(DISPATCH_BATCH)]
