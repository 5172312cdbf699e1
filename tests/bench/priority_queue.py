"""What a priority queue costs per message against a plain one, end to end: a million messages published with
confirms (priorities 0 to 9 in turn, the property on every message in both runs), then drained by a no-ack
consumer; the broker's CPU per message for each phase.

    python -m tests.bench.priority_queue [--messages 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from pamqp import body, commands, frame, header

from tests.bench.brokers import start_warren
from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, DeliveryCounter
from warrenperf.process_memory import cpu_seconds

WINDOW = 1000  # unconfirmed publishes at once
PRIORITIES = 10  # messages carry priorities 0..9 in turn
PAYLOAD = b"x" * 16


def frames(channel: int, queue: str, priority: int) -> bytes:
    properties = commands.Basic.Properties(priority=priority)
    return b"".join((frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), channel),
                     frame.marshal(header.ContentHeader(body_size=len(PAYLOAD), properties=properties), channel),
                     frame.marshal(body.ContentBody(PAYLOAD), channel)))


async def measure(url: BrokerURL, pid: int, queue: str, arguments: dict, count: int) -> tuple[float, float]:
    """(publish, drain) broker CPU µs per message."""
    publisher = await BenchConnection.open(url)
    channel = await publisher.open_channel()
    await publisher.rpc(channel, commands.Queue.Declare(queue=queue, arguments=arguments), commands.Queue.DeclareOk)
    tracker = ConfirmTracker(window=WINDOW, record_latency=False)
    await publisher.select_confirms(channel, tracker)
    half = WINDOW // 2
    batch = b"".join(frames(channel, queue, n % PRIORITIES) for n in range(half))
    before = cpu_seconds(pid)
    for _ in range(count // half):
        await tracker.wait_for_room(half)
        tracker.published += half
        await publisher.send(batch)
    await tracker.wait_for_all()
    publish_cpu = cpu_seconds(pid) - before

    consumer = await BenchConnection.open(url)
    consumer_channel = await consumer.open_channel()
    counter = DeliveryCounter(consumer_channel, target=count)
    before = cpu_seconds(pid)
    await consumer.consume(consumer_channel, queue, counter, no_ack=True)
    await counter.reached
    drain_cpu = cpu_seconds(pid) - before
    await consumer.close()
    await publisher.rpc(channel, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    await publisher.close()
    return publish_cpu / count * 1e6, drain_cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.priority_queue", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    count = args.messages // WINDOW * WINDOW
    with tempfile.TemporaryDirectory(prefix="warren-priority-") as work:
        warren = start_warren(Path(work))
        try:
            url = BrokerURL.parse(warren.url)
            print(f"Warren, {count:,} messages of {len(PAYLOAD)} B, broker CPU µs per message (publish / drain)")
            for round_number in range(2):  # plain, priority, priority, plain: drift cancels
                order = ((False, True) if round_number == 0 else (True, False))
                for priority in order:
                    arguments = {"x-max-priority": PRIORITIES} if priority else {}
                    started = time.perf_counter()
                    publish, drain = asyncio.run(measure(url, warren.pid, f"bench-{priority}-{round_number}",
                                                         arguments, count))
                    print(f"  {'priority (x-max-priority 10)' if priority else 'plain':30} {publish:6.2f} / "
                          f"{drain:6.2f}   ({time.perf_counter() - started:.1f} s)", flush=True)
        finally:
            warren.stop()


if __name__ == "__main__":
    main()
