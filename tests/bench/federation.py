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

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path

import pika

from tests.bench.brokers import RunningBroker, start_rabbitmq, start_warren
from tests.bench.client import BenchConnection, BrokerURL, ConfirmTracker, message_frames
from tests.bench.process_memory import cpu_seconds
from tests.bench.scenarios import _publish_confirmed
from tests.bench.shovel import WINDOW, answers, api, queue_length
from tests.conftest import free_port
from tests.waiting import wait_for

EXCHANGE = "bench-fed"
QUEUE = "bench-fed-q"
PRELOAD = "bench-fed-preload"  # the exchange the link's queue upstream is preloaded through


def cluster_name(management_port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{management_port}/api/overview", headers={
        "authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["cluster_name"]


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


async def preload_through(broker: RunningBroker, count: int, size: int) -> None:
    """count persistent messages of size bytes published to PRELOAD, confirmed."""
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    tracker = ConfirmTracker(WINDOW, record_latency=False)
    await connection.select_confirms(channel, tracker)
    message = message_frames(channel, PRELOAD, "", b"x" * size, persistent=True)
    await _publish_confirmed(connection, channel, message, tracker, time.perf_counter() + 3600, count)
    await connection.close()


def one_run(kind: str, count: int, size: int) -> tuple[float, float]:
    """(messages a second, broker CPU µs per message) of one link moving count messages."""
    with tempfile.TemporaryDirectory(prefix="warren-bench-federation-") as root:
        Path(root).chmod(0o755)  # (RabbitMQ may run as the rabbitmq user, who must reach its data dir)
        brokers, management = [], []
        try:
            for side in ("upstream", "downstream"):
                workdir = Path(root) / side
                workdir.mkdir()
                if kind == "Warren":
                    port = free_port()
                    brokers.append(start_warren(workdir, "--management-port", str(port)))
                    management.append(port)
                else:
                    broker = start_rabbitmq(workdir, "--management", "--federation")
                    brokers.append(broker)
                    management.append(broker.port + 10000)
                    wait_for(lambda: answers(broker.port + 10000), 120, f"{kind}'s API", step=0.2)
            upstream, downstream = brokers
            asyncio.run(declare_exchange(upstream.url, bound_queue=False))
            asyncio.run(declare_exchange(downstream.url, bound_queue=True))
            prepare_link_queue(upstream.url, f"federation: {EXCHANGE} -> {cluster_name(management[1])}")
            asyncio.run(preload_through(upstream, count, size))
            before = cpu_seconds(upstream.pid) + cpu_seconds(downstream.pid)
            started = time.perf_counter()
            api(management[1], "PUT", "/api/parameters/federation-upstream/%2F/bench", {"value": {
                "uri": upstream.url}})
            api(management[1], "PUT", "/api/policies/%2F/bench", {"pattern": f"^{EXCHANGE}$", "apply-to": "exchanges",
                                                                 "definition": {"federation-upstream": "bench"}})
            wait_for(lambda: asyncio.run(queue_length(downstream, QUEUE)), 3600, "every message moved", step=0.05,
                     until=lambda moved: moved >= count)
            took = time.perf_counter() - started
            cpu = cpu_seconds(upstream.pid) + cpu_seconds(downstream.pid) - before
            return count / took, cpu * 1e6 / count
        finally:
            for broker in brokers:
                broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {"Warren": [], "RabbitMQ": []}
    for round_number in range(args.rounds):
        order = ("Warren", "RabbitMQ") if round_number % 2 == 0 else ("RabbitMQ", "Warren")
        for kind in order:
            rate, cpu = one_run(kind, args.messages, args.size)
            figures[kind].append((rate, cpu))
            print(f"{kind:8} {rate:10,.0f} msg/s {cpu:8.1f} µs broker CPU per message", flush=True)
    warren = statistics.mean(rate for rate, _ in figures["Warren"])
    rabbit = statistics.mean(rate for rate, _ in figures["RabbitMQ"])
    warren_cpu = statistics.mean(cpu for _, cpu in figures["Warren"])
    rabbit_cpu = statistics.mean(cpu for _, cpu in figures["RabbitMQ"])
    print(f"\n{args.messages:,} persistent messages of {args.size} B, one exchange federation link (on-confirm, "
          f"prefetch 1000):")
    print(f"Warren {warren:,.0f} msg/s, {warren_cpu:.1f} µs CPU/msg; RabbitMQ {rabbit:,.0f} msg/s, "
          f"{rabbit_cpu:.1f} µs CPU/msg; Warren/RabbitMQ {warren / rabbit:.2f}x")


if __name__ == "__main__":
    main()
