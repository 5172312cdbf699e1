"""A queue's counts as the management API and the metrics give them: the ready messages and their bytes exact at any
depth (counted as they come and go); the persistent ones exact up to COUNTED_ENTRIES ready messages in memory, and
beyond them estimated from those walked, so that a request costs the same however deep the queue."""

import asyncio
import time

import pytest
from pamqp import commands as spec
from pamqp.commands import Basic

from broker.management import resources
from broker.model.message import Address, Header, Message
from broker.model.vhost import VirtualHost
from protocol.codec import encode_header_payload
from tests.unit.broker.session.channel_host import Host


class Owner:
    exclusive_queues: set = set()


def counts(bodies: list[bytes], persistent: list[bool]) -> resources.QueueCounts:
    """The counts of a durable priority queue (which keeps every ready message in memory) holding these messages."""
    async def run() -> resources.QueueCounts:
        vhost = VirtualHost("/")
        queue = vhost.declare_queue("deep", Owner(), False, True, False, False, {"x-max-priority": 5})
        address = Address("", "deep")
        for body, lasting in zip(bodies, persistent):
            header = Header(encode_header_payload(len(body), Basic.Properties(delivery_mode=2 if lasting else 1)))
            queue.enqueue(Message(address, header, body))
        return resources.queue_counts(queue)
    return asyncio.run(run())


def test_up_to_the_bound_every_ready_message_is_counted():
    figures = counts([b"x" * size for size in range(1, 7)], [True, False] * 3)
    assert (figures.ready, figures.ready_bytes, figures.persistent, figures.persistent_bytes) == (6, 21, 3, 9)


def test_beyond_the_bound_the_persistent_ones_are_estimated_from_those_walked_and_the_bytes_still_exact(
        monkeypatch):
    monkeypatch.setattr(resources, "COUNTED_ENTRIES", 3)
    figures = counts([b"x" * size for size in range(1, 7)], [True, True, False, False, False, False])
    # the first three walked (two persistent of 3 bytes), taken for all six
    assert (figures.ready, figures.ready_bytes, figures.persistent, figures.persistent_bytes) == (6, 21, 4, 6)


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_the_same_messages_count_the_same_at_any_depth(depth):
    figures = counts([b"x" * 16] * depth, [True] * depth)
    assert (figures.ready, figures.ready_bytes, figures.persistent, figures.persistent_bytes) == (
        depth, 16 * depth, depth, 16 * depth)


def test_the_ready_bytes_follow_every_way_in_and_out_of_the_ready_list():
    async def run() -> list[int]:
        vhost = VirtualHost("/")
        queue = vhost.declare_queue("q", Owner(), False, False, False, False, {"x-max-length": 4})
        address = Address("", "q")
        for size in range(1, 6):  # the fifth drops the first (drop-head)
            queue.enqueue(Message(address, Header(encode_header_payload(size, Basic.Properties())), b"x" * size))
        seen = [resources.queue_counts(queue).ready_bytes]
        taken = [queue.take(no_ack=False), queue.take(no_ack=False)]  # 2 and 3 bytes, delivered
        seen.append(resources.queue_counts(queue).ready_bytes)
        queue.settle(taken, requeue=True)
        seen.append(resources.queue_counts(queue).ready_bytes)
        queue.purge()
        seen.append(resources.queue_counts(queue).ready_bytes)
        return seen
    assert asyncio.run(run()) == [2 + 3 + 4 + 5, 4 + 5, 2 + 3 + 4 + 5, 0]


def test_the_totals_over_every_queue_leave_expired_messages_to_their_timers():
    """The overview's and the vhosts' totals read each queue's count as it holds it (ready_as_held): letting each
    queue's expired messages go first (count_ready, dead-lettering them) took 0.4 s for 1,000 queues of 300 expired
    messages in one request."""
    async def run() -> tuple[int, int, int]:
        host = Host()
        channel = host.open()
        host.send(channel, spec.Queue.Declare(queue="dead"),
                  spec.Queue.Declare(queue="q", arguments={"x-dead-letter-exchange": "",
                                                           "x-dead-letter-routing-key": "dead"}))
        host.publish(channel, "q", *[b"m"] * 300, properties=spec.Basic.Properties(expiration="1"))
        time.sleep(0.002)  # (their TTL passes; no loop turn runs meanwhile, so their timer has taken none of them)
        queue, dead = host.vhost.queues["q"], host.vhost.queues["dead"]
        held, dead_then = queue.ready_as_held(), dead.ready_as_held()
        return held, dead_then, queue.count_ready()

    held, dead_then, counted = asyncio.run(run())
    assert (held, dead_then) == (300, 0)  # (nothing let go, nothing dead-lettered by the reading)
    assert counted < 300  # (where count_ready lets the expired ones go)
