"""One exchange federation link between two brokers: Warren's between two Warrens beside RabbitMQ's between two
RabbitMQs, same run.

    python -m tests.bench.federation [--messages 100000] [--size 1024] [--rounds 2]

Each round, per kind of broker (alternated): two brokers with a fanout exchange each, the downstream's bound to a
durable queue; on the upstream, the queue that the downstream's link reads (``federation: X -> CLUSTER``, declared
as the link declares it) preloaded with persistent messages (publisher confirms), as if published while the link
was down; then the upstream and policy defined on the downstream (ack-mode on-confirm, prefetch 1000, the
defaults), timed from the definition until the downstream's queue holds every message. Prints msg/s and the CPU of
the two brokers per message moved (the link runs inside the downstream). Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import time

import pika

from tests.bench.broker_pairs import api, compare, publish_confirmed, queue_length, two_brokers
from tests.waiting import wait_for
from warrenperf.client import BenchConnection, BrokerURL
from warrenperf.process_memory import cpu_seconds

EXCHANGE = "bench-fed"
QUEUE = "bench-fed-q"
PRELOAD = "bench-fed-preload"  # the exchange the link's queue upstream is preloaded through


async def declare_exchange(url: str, bound_queue: bool) -> None:
    connection = await BenchConnection.open(BrokerURL.parse(url))
    channel = await connection.open_channel()
    await connection.declare_exchange(channel, EXCHANGE, "fanout")
    if bound_queue:
        await connection.declare_queue(channel, QUEUE, durable=True)
        await connection.bind_queue(channel, QUEUE, EXCHANGE, "")
    await connection.close()


def prepare_link_queue(url: str, name: str) -> None:
    """The queue the downstream's link will read, declared as it declares it, bound to PRELOAD (through pika: the
    bench client's pamqp refuses its ">")."""
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-internal-purpose": "federation"})
        channel.exchange_declare(PRELOAD, "fanout")
        channel.queue_bind(name, PRELOAD)


def one_run(kind: str, count: int, size: int) -> tuple[float, float]:
    """(messages a second, broker CPU µs per message) of one link moving count messages."""
    with two_brokers(kind, "--federation", ("upstream", "downstream")) as (brokers, management):
        upstream, downstream = brokers
        asyncio.run(declare_exchange(upstream.url, bound_queue=False))
        asyncio.run(declare_exchange(downstream.url, bound_queue=True))
        cluster_name = api(management[1], "GET", "/api/overview")["cluster_name"]
        prepare_link_queue(upstream.url, f"federation: {EXCHANGE} -> {cluster_name}")
        asyncio.run(publish_confirmed(upstream, PRELOAD, "", count, size))
        before = cpu_seconds(upstream.pid) + cpu_seconds(downstream.pid)
        started = time.perf_counter()
        api(management[1], "PUT", "/api/parameters/federation-upstream/%2F/bench", {"value": {"uri": upstream.url}})
        api(management[1], "PUT", "/api/policies/%2F/bench", {"pattern": f"^{EXCHANGE}$", "apply-to": "exchanges",
                                                             "definition": {"federation-upstream": "bench"}})
        wait_for(lambda: asyncio.run(queue_length(downstream, QUEUE)), 3600, "every message moved", step=0.05,
                 until=lambda moved: moved >= count)
        took = time.perf_counter() - started
        cpu = cpu_seconds(upstream.pid) + cpu_seconds(downstream.pid) - before
        return count / took, cpu * 1e6 / count


def main() -> None:
    compare(__doc__, one_run, "one exchange federation link (on-confirm, prefetch 1000)")


if __name__ == "__main__":
    main()
