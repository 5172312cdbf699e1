"""One shovel between two brokers: Warren's between two Warrens beside RabbitMQ's between two RabbitMQs, same run.

    python -m tests.bench.shovel [--messages 100000] [--size 1024] [--rounds 2]

Each round, per kind of broker (alternated): two brokers, the source's queue preloaded with persistent messages
(publisher confirms), then a shovel defined on the source (on-confirm, prefetch 1000, the default) to a durable
queue of the destination; timed from the definition until the destination holds every message. Prints msg/s and
the CPU of the two brokers per message moved (the shovel runs inside the source). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import time

from tests.bench.broker_pairs import api, compare, publish_confirmed, queue_length, two_brokers
from tests.waiting import wait_for
from warrenperf.client import BenchConnection, BrokerURL
from warrenperf.process_memory import cpu_seconds

QUEUE = "bench-shovel"


async def declare_queue(url: str) -> None:
    connection = await BenchConnection.open(BrokerURL.parse(url))
    await connection.declare_queue(await connection.open_channel(), QUEUE, durable=True)
    await connection.close()


def one_run(kind: str, count: int, size: int) -> tuple[float, float]:
    """(messages a second, broker CPU µs per message) of one shovel moving count messages."""
    with two_brokers(kind, "--shovel", ("source", "destination")) as (brokers, management):
        source, destination = brokers
        for broker in brokers:
            asyncio.run(declare_queue(broker.url))
        asyncio.run(publish_confirmed(source, "", QUEUE, count, size))
        before = cpu_seconds(source.pid) + cpu_seconds(destination.pid)
        started = time.perf_counter()
        api(management[0], "PUT", "/api/parameters/shovel/%2F/bench", {"value": {
            "src-uri": source.url, "src-queue": QUEUE, "dest-uri": destination.url, "dest-queue": QUEUE}})
        wait_for(lambda: asyncio.run(queue_length(destination, QUEUE)), 3600, "every message moved", step=0.05,
                 until=lambda moved: moved >= count)
        took = time.perf_counter() - started
        cpu = cpu_seconds(source.pid) + cpu_seconds(destination.pid) - before
        return count / took, cpu * 1e6 / count


def main() -> None:
    compare(__doc__, one_run, "one shovel (on-confirm, prefetch 1000)")


if __name__ == "__main__":
    main()
