"""The management API's get takes the head of a queue as basic.get does, over loop turns where expired messages lie
ahead of it."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands as spec

from broker.management.messages import taken
from broker.model.queue import TRIM_SLICE
from tests.unit.broker.session.channel_host import Host


def test_a_get_behind_many_expired_messages_takes_the_live_one_after_them():
    async def scenario() -> tuple[bytes, int]:
        host = Host()
        channel = host.open()
        host.send(channel, spec.Queue.Declare(queue="q"))
        host.publish(channel, "q", *[b"old"] * (3 * TRIM_SLICE), properties=spec.Basic.Properties(expiration="1"))
        host.publish(channel, "q", b"live")
        queue = host.vhost.queues["q"]
        time.sleep(0.002)  # (their TTL passes; no loop turn runs meanwhile, so their timer has taken none of them)
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        counting = asyncio.ensure_future(count_turns())
        entry = await taken(queue, no_ack=True)
        counting.cancel()
        return entry.message.body, turns

    body, turns = asyncio.run(scenario())
    assert body == b"live" and turns >= 1  # (a slice a turn: the other task ran in between)
