"""The management API's get takes messages from the head of a queue as basic.get does, letting the event loop turn
while it takes many, or skips many expired ones."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands as spec

from broker.management.messages import take
from broker.model.queue import TRIM_SLICE
from tests.unit.broker.session.channel_host import Host


def published(expired: int, live: int):
    """A queue holding `expired` messages whose TTL has passed, then `live` ones (b"0", b"1", ...)."""
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"))
    host.publish(channel, "q", *[b"old"] * expired, properties=spec.Basic.Properties(expiration="1"))
    host.publish(channel, "q", *[b"%d" % number for number in range(live)])
    time.sleep(0.002)  # (their TTL passes; no loop turn runs meanwhile, so their timer has taken none of them)
    return host.vhost.queues["q"]


async def taken_counting_turns(queue, count: int) -> tuple[list[bytes], int]:
    """What a take of count messages got, and how many times another task ran meanwhile."""
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    counting = asyncio.ensure_future(count_turns())
    taken: list = []
    await take(queue, count, True, taken.append)
    counting.cancel()
    return [entry.message.body for entry in taken], turns


def test_a_get_behind_many_expired_messages_takes_the_live_one_after_them_over_loop_turns():
    async def scenario():
        return await taken_counting_turns(published(25 * TRIM_SLICE, 1), 1)

    bodies, turns = asyncio.run(scenario())
    assert bodies == [b"0"] and turns >= 1  # (a slice a turn: the other task ran in between)


def test_a_get_of_many_messages_lets_the_loop_turn_and_takes_them_in_order():
    async def scenario():
        queue = published(0, 60_000)
        got = await taken_counting_turns(queue, 100_000)
        return got, queue.count_ready()

    (bodies, turns), left = asyncio.run(scenario())
    assert bodies == [b"%d" % number for number in range(60_000)] and left == 0
    assert turns >= 1  # (60,000 in one turn held the loop 0.16 s)
