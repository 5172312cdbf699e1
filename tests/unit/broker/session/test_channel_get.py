"""basic.get: the head of a queue, once the expired messages ahead of it left; driven with no socket."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands as spec

from broker.model.features.deadlines import FIRE_SLICE
from broker.model.queue import TRIM_SLICE
from tests.unit.broker.session.channel_host import SETTLED_WITHIN, Host, bodies, methods


async def test_a_get_behind_many_expired_messages_lets_them_go_over_loop_turns_then_answers():
    """Messages expired at the head of a queue leave a slice a loop turn before a get is answered (all at once held
    the loop for millions after a restart); the frames after the get wait for its answer."""
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"))
    many = 3 * TRIM_SLICE + 5
    host.publish(channel, "q", *[b"old"] * many, properties=spec.Basic.Properties(expiration="1"))
    host.publish(channel, "q", b"live")
    queue = host.vhost.queues["q"]
    time.sleep(0.002)  # (their TTL passes; no loop turn runs meanwhile, so their timer has taken none of them)
    received = host.send(channel, spec.Basic.Get(queue="q", no_ack=True), spec.Queue.Declare(queue="q", passive=True))
    assert not received and channel.settling  # not answered in the turn it came
    left = [len(queue.entries)]
    deadline = time.monotonic() + SETTLED_WITHIN
    while channel.settling and time.monotonic() < deadline:
        await asyncio.sleep(0)  # one loop turn
        received += host.turn()
        left.append(len(queue.entries))
    assert [type(item) for item in received] == [spec.Basic.GetOk, tuple, spec.Queue.DeclareOk]
    assert bodies(received) == [b"live"] and methods(received, spec.Basic.GetOk)[0].message_count == 0
    assert len(left) >= 3 and left[-1] == 0
    assert all(earlier - later <= TRIM_SLICE + FIRE_SLICE for earlier, later in zip(left, left[1:])), left


async def test_a_get_left_waiting_by_a_closed_channel_is_not_answered():
    """The channel closed while its get waited: nothing is taken for it (the expired messages leave by their
    timer)."""
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"))
    host.publish(channel, "q", *[b"old"] * (3 * TRIM_SLICE), properties=spec.Basic.Properties(expiration="1"))
    host.publish(channel, "q", b"live")
    time.sleep(0.002)
    host.send(channel, spec.Basic.Get(queue="q"))
    host.close_channel(channel.number, send_close_ok=False)
    queue = host.vhost.queues["q"]
    deadline = time.monotonic() + SETTLED_WITHIN
    while len(queue.entries) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0)
    assert not host.turn() and not channel.settling and not channel.unacked
    assert [entry.message.body for entry in queue.entries] == [b"live"]
