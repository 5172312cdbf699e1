"""What the benchmarks of a link between two brokers share (tests.bench.shovel, tests.bench.federation): two
brokers of a kind started with their management API, messages published with confirms, a queue's length, and the
rounds that alternate Warren and RabbitMQ and print their figures."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any, Callable, Iterator

from tests.bench.brokers import RunningBroker, start_rabbitmq, start_warren
from tests.bench.scenarios import _publish_confirmed
from tests.conftest import free_port
from tests.waiting import wait_for
from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, message_frames

WINDOW = 1000  # publishes kept unconfirmed while preloading


def api(management_port: int, method: str, path: str, body: dict | None = None) -> Any:
    """The JSON a management API answers (None for an empty body); an error status raises."""
    request = urllib.request.Request(f"http://127.0.0.1:{management_port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"content-type": "application/json",
                                              "authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read()
    return json.loads(answer) if answer else None


def answers(port: int) -> bool:
    try:
        api(port, "GET", "/api/overview")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def two_brokers(kind: str, plugin: str, sides: tuple[str, str]) -> Iterator[tuple[list[RunningBroker], list[int]]]:
    """Two brokers of kind ("Warren" or "RabbitMQ", with rabbitmq-ref's plugin option), named by sides; their
    management ports beside them. Stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix="warren-bench-pair-") as root:
        Path(root).chmod(0o755)  # (RabbitMQ may run as the rabbitmq user, who must reach its data dir)
        brokers, management = [], []
        try:
            for side in sides:
                workdir = Path(root) / side
                workdir.mkdir()
                if kind == "Warren":
                    port = free_port()
                    brokers.append(start_warren(workdir, "--management-port", str(port)))
                    management.append(port)
                else:
                    broker = start_rabbitmq(workdir, "--management", plugin)
                    brokers.append(broker)
                    management.append(broker.port + 10000)
                    wait_for(lambda: answers(broker.port + 10000), 120, f"{kind}'s API", step=0.2)
            yield brokers, management
        finally:
            for broker in brokers:
                broker.stop()


async def publish_confirmed(broker: RunningBroker, exchange: str, routing_key: str, count: int, size: int) -> None:
    """count persistent messages of size bytes published, every one confirmed."""
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    tracker = ConfirmTracker(WINDOW, record_latency=False)
    await connection.select_confirms(channel, tracker)
    message = message_frames(channel, exchange, routing_key, b"x" * size, persistent=True)
    await _publish_confirmed(connection, channel, message, tracker, time.perf_counter() + 3600, count)
    await connection.close()


async def queue_length(broker: RunningBroker, queue: str) -> int:
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    count = await connection.declare_queue(channel, queue, durable=True, passive=True)
    await connection.close()
    return count


def compare(description: str, one_run: Callable[[str, int, int], tuple[float, float]], what: str) -> None:
    """Parse --messages, --size and --rounds; run one_run(kind, messages, size) for Warren and RabbitMQ in each
    round, alternated; print each run's (msg/s, broker CPU µs per message) and their means, what moved them named."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    print(f"\n{args.messages:,} persistent messages of {args.size} B, {what}:")
    print(f"Warren {warren:,.0f} msg/s, {warren_cpu:.1f} µs CPU/msg; RabbitMQ {rabbit:,.0f} msg/s, "
          f"{rabbit_cpu:.1f} µs CPU/msg; Warren/RabbitMQ {warren / rabbit:.2f}x")
