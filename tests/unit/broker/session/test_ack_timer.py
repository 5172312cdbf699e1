"""Delivery acknowledgement timeouts where they differ on one channel: a tick looks at a bounded number of unacked
deliveries, from where the last one stopped, so millions not due yet cost no tick a walk of them all; driven with
no socket (channel_host.Host)."""

from __future__ import annotations

import asyncio

from pamqp import commands as spec

from broker.session.ack_timeout import WALK, AckTimer
from tests.unit.broker.session.channel_host import Host, methods, ready, settled


def consume(host: Host, channel, queue: str, count: int, timeout: int) -> None:
    host.send(channel, spec.Queue.Declare(queue=queue))
    host.publish(channel, queue, *[f"{queue}{number}".encode() for number in range(count)])
    arguments = {"x-consumer-timeout": timeout}
    delivered = methods(host.send(channel, spec.Basic.Consume(queue=queue, consumer_tag=queue, arguments=arguments)),
                        spec.Basic.Deliver)
    assert len(delivered) == count


async def test_a_short_timeout_behind_many_deliveries_with_a_long_one_is_found_a_bounded_walk_at_a_time(
        monkeypatch):
    host = Host()
    channel = host.open()
    many = 3 * WALK + 5
    consume(host, channel, "patient", many, 3_600_000)  # an hour: none of these comes due
    consume(host, channel, "hasty", 1, 100)
    steps = []  # how far each tick's walk went
    tick = AckTimer._tick

    def counted_tick(timer: AckTimer) -> None:
        walked_to = timer.walked_to
        tick(timer)
        steps.append(timer.walked_to - walked_to)
    monkeypatch.setattr(AckTimer, "_tick", counted_tick)
    for _ in range(400):  # (ticks every 10 ms, a tenth of the shortest timeout)
        await asyncio.sleep(0.005)
        if not channel.open:
            break
    assert host.failures == [(406, "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout "
                                   "value used: 100 ms. This timeout value can be configured, see consumers doc "
                                   "guide to learn more")]
    walks = [step for step in steps if step > 0]
    assert len(walks) >= 3 and max(walks) <= WALK, steps
    await settled(host, channel)  # (the requeue of many goes a slice a loop turn)
    assert len(ready(host, "patient")) == many and ready(host, "hasty") == [b"hasty0"]
