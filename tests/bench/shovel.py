"""One shovel between two brokers: Warren's between two Warrens beside RabbitMQ's between two RabbitMQs, same run.

    python -m tests.bench.shovel [--messages 100000] [--size 1024] [--rounds 2]

Each round, per kind of broker (alternated): two brokers, the source's queue preloaded with persistent messages
(publisher confirms), then a shovel defined on the source (on-confirm, prefetch 1000, the default) to a durable
queue of the destination; timed from the definition until the destination holds every message. Prints msg/s and
the CPU of the two brokers per message moved (the shovel runs inside the source). Traffic goes to 127.0.0.1 only.
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

from tests.bench.brokers import RunningBroker, start_rabbitmq, start_warren
from tests.bench.client import BenchConnection, BrokerURL, ConfirmTracker, message_frames
from tests.bench.process_memory import cpu_seconds
from tests.bench.scenarios import _publish_confirmed
from tests.conftest import free_port
from tests.waiting import wait_for

QUEUE = "bench-shovel"
WINDOW = 1000  # publishes kept unconfirmed while preloading


def api(management_port: int, method: str, path: str, body: dict | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{management_port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"content-type": "application/json",
                                              "authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


async def preload(broker: RunningBroker, count: int, size: int, queue: str = QUEUE) -> None:
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    await connection.declare_queue(channel, queue, durable=True)
    tracker = ConfirmTracker(WINDOW, record_latency=False)
    await connection.select_confirms(channel, tracker)
    message = message_frames(channel, "", queue, b"x" * size, persistent=True)
    await _publish_confirmed(connection, channel, message, tracker, time.perf_counter() + 3600, count)
    await connection.close()


async def queue_length(broker: RunningBroker, queue: str = QUEUE) -> int:
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    count = await connection.declare_queue(channel, queue, durable=True, passive=True)
    await connection.close()
    return count


def one_run(kind: str, count: int, size: int) -> tuple[float, float]:
    """(messages a second, broker CPU µs per message) of one shovel moving count messages."""
    with tempfile.TemporaryDirectory(prefix="warren-bench-shovel-") as root:
        Path(root).chmod(0o755)  # (RabbitMQ may run as the rabbitmq user, who must reach its data dir)
        brokers, management = [], []
        try:
            for side in ("source", "destination"):
                workdir = Path(root) / side
                workdir.mkdir()
                if kind == "Warren":
                    port = free_port()
                    brokers.append(start_warren(workdir, "--management-port", str(port)))
                    management.append(port)
                else:
                    broker = start_rabbitmq(workdir, "--management", "--shovel")
                    brokers.append(broker)
                    management.append(broker.port + 10000)
                    wait_for(lambda: answers(broker.port + 10000), 120, f"{kind}'s API", step=0.2)
            source, destination = brokers
            asyncio.run(preload(source, count, size))
            asyncio.run(preload(destination, 0, size))  # (declares the destination's queue)
            before = cpu_seconds(source.pid) + cpu_seconds(destination.pid)
            started = time.perf_counter()
            api(management[0], "PUT", "/api/parameters/shovel/%2F/bench", {"value": {
                "src-uri": source.url, "src-queue": QUEUE, "dest-uri": destination.url, "dest-queue": QUEUE}})
            wait_for(lambda: asyncio.run(queue_length(destination)), 3600, "every message moved", step=0.05,
                     until=lambda moved: moved >= count)
            took = time.perf_counter() - started
            cpu = cpu_seconds(source.pid) + cpu_seconds(destination.pid) - before
            return count / took, cpu * 1e6 / count
        finally:
            for broker in brokers:
                broker.stop()


def answers(port: int) -> bool:
    try:
        return api(port, "GET", "/api/overview") == 200
    except OSError:
        return False


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
    print(f"\n{args.messages:,} persistent messages of {args.size} B, one shovel (on-confirm, prefetch 1000):")
    print(f"Warren {warren:,.0f} msg/s, {warren_cpu:.1f} µs CPU/msg; RabbitMQ {rabbit:,.0f} msg/s, "
          f"{rabbit_cpu:.1f} µs CPU/msg; Warren/RabbitMQ {warren / rabbit:.2f}x")


if __name__ == "__main__":
    main()
