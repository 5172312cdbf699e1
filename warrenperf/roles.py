"""The two sides of a load run, each a process of its own (as RabbitMQ's PerfTest runs them): a consumer that
declares the queues, consumes and counts, and a producer that publishes unthrottled (or at a given rate) for a given
time. warrenperf.run starts them:

    python -m warrenperf.roles consumer|producer --url URL --seconds N [the Split's options]

Each side talks to the process that started it over stdio: it prints "ready" once connected (the consumer: once
it consumes) and starts on the "go" line it reads on stdin; the producer publishes for the given time and prints its
figures, the consumer counts until the "stop" line, then prints its figures and deletes what it declared. Figures
are one JSON object on the last line of stdout."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from dataclasses import dataclass

import uvloop

from warrenperf.client import (STAMP, BenchConnection, BrokerClosed, BrokerURL, ConfirmTracker, DeliveryCounter,
                               message_frames)

BATCH = 100  # messages written per transport.write by an unthrottled producer
LATENCY_SAMPLES = 20_000  # the most latencies a consumer reports (evenly spaced over what it measured)
ROLES = ("consumer", "producer")


@dataclass(frozen=True)
class Split:
    """What both sides agree on (the defaults: a 16-byte message published unthrottled, without confirms, to one
    queue, consumed with auto-ack)."""
    queue: str  # the queue, or the prefix of the fanout queues
    exchange: str = ""  # "" for the default exchange
    queues: int = 1  # 1, or how many queues a fanout exchange feeds (each consumer process consumes them all)
    size: int = 16  # body bytes
    persistent: bool = False  # delivery_mode 2, durable queues
    ack_every: int = 0  # 0: auto-ack; 1: ack each; N > 1: one multiple ack every N deliveries
    prefetch: int = 100  # basic.qos of a manual-ack consumer
    window: int = 0  # producer: unconfirmed publishes allowed, 0 for no confirms
    rate: int = 0  # producer: messages per second, 0 for as fast as the broker takes them
    latency: bool = False  # bodies carry their publishing time; the consumer reports a sample of latencies


def queue_names(split: Split) -> list[str]:
    return [split.queue] if split.queues == 1 else [f"{split.queue}-{index}" for index in range(split.queues)]


def routing_key(split: Split) -> str:
    return "" if split.exchange else split.queue


async def _read_line() -> str:
    return (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()


async def _ready_and_go() -> None:
    print("ready", flush=True)
    await _read_line()  # go


async def consumer(url: BrokerURL, split: Split) -> dict[str, float]:
    admin = await BenchConnection.open(url)
    channel = await admin.open_channel()
    if split.exchange:
        await admin.declare_exchange(channel, split.exchange, "fanout")
    connections, counters = [], []
    for queue in queue_names(split):
        await admin.declare_queue(channel, queue, durable=split.persistent)
        if split.exchange:
            await admin.bind_queue(channel, queue, split.exchange)
        connection = await BenchConnection.open(url)
        consuming = await connection.open_channel()
        counter = DeliveryCounter(consuming, ack_every=split.ack_every, stamped=split.latency)
        if split.ack_every:
            await connection.qos(consuming, split.prefetch)
        await connection.consume(consuming, queue, counter, no_ack=not split.ack_every)
        connections.append(connection)
        counters.append(counter)
    await _ready_and_go()
    before = sum(counter.delivered for counter in counters)
    start, cpu = time.perf_counter(), time.process_time()
    await _read_line()  # stop
    elapsed = time.perf_counter() - start
    delivered = sum(counter.delivered for counter in counters) - before
    figures = {"msg/s": delivered / elapsed, "delivered": delivered, "cpu seconds": time.process_time() - cpu}
    latencies = [latency for counter in counters for latency in counter.latencies or ()]
    if latencies:
        step = max(1, len(latencies) // LATENCY_SAMPLES)
        figures["latencies ms"] = [latency * 1000 for latency in latencies[::step]]
    for connection in connections:
        await connection.close()
    for queue in queue_names(split):
        await admin.delete_queue(channel, queue)
    if split.exchange:
        await admin.delete_exchange(channel, split.exchange)
    await admin.close()
    return figures


async def producer(url: BrokerURL, split: Split, seconds: float) -> dict[str, float]:
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    tracker = None
    if split.window:
        tracker = ConfirmTracker(window=split.window, record_latency=False)
        await connection.select_confirms(channel, tracker)
    await _ready_and_go()
    start, cpu = time.perf_counter(), time.process_time()
    deadline = start + seconds
    if split.latency:
        sent = await _publish_stamped(connection, channel, split, deadline)
    else:
        sent = await _publish_unthrottled(connection, channel, split, tracker, deadline)
    elapsed = time.perf_counter() - start
    if tracker is not None:
        await tracker.wait_for_all()
    await connection.close()
    return {"published/s": sent / elapsed, "published": sent, "cpu seconds": time.process_time() - cpu}


async def _publish_unthrottled(connection: BenchConnection, channel: int, split: Split,
                               tracker: ConfirmTracker | None, deadline: float) -> int:
    message = message_frames(channel, split.exchange, routing_key(split), b"x" * split.size, split.persistent)
    count = min(BATCH, split.window) if split.window else BATCH  # messages per write, never beyond the window
    batch = message * count
    sent = 0
    while time.perf_counter() < deadline:
        if tracker is not None:
            await tracker.wait_for_room(split.window - count + 1)
            tracker.published += count
        await connection.send(batch)
        sent += count
    return sent


async def _publish_stamped(connection: BenchConnection, channel: int, split: Split, deadline: float) -> int:
    """split.rate messages per second (0: as fast as they are written), each stamped with its publishing time."""
    padding = b"x" * max(0, split.size - STAMP.size)
    interval = 1 / split.rate if split.rate else 0.0
    sent = 0
    next_at = time.perf_counter()
    while next_at < deadline:
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif not interval:
            next_at = time.perf_counter()
        body = STAMP.pack(time.monotonic_ns()) + padding
        await connection.send(message_frames(channel, split.exchange, routing_key(split), body, split.persistent))
        sent += 1
        next_at += interval
    return sent


def time_limit(seconds: float) -> float:
    """The longest a side (or a scenario) may take in all, pre-filling and cleaning up included."""
    return 12 * seconds + 120


def command(role: str, url: str, split: Split, seconds: float) -> list[str]:
    """The command line that runs one side."""
    options = []
    for field in dataclasses.fields(Split):
        value = getattr(split, field.name)
        if value is True:
            options.append(f"--{field.name}")
        elif value is not False:
            options += [f"--{field.name}", str(value)]
    return [sys.executable, "-m", "warrenperf.roles", role, "--url", url, "--seconds", str(seconds), *options]


def parse_args(argv: list[str] | None = None) -> tuple[str, str, Split, float]:
    parser = argparse.ArgumentParser(prog="python -m warrenperf.roles", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, required=True, help="the producer's publishing time")
    for field in dataclasses.fields(Split):
        if field.type == "bool":
            parser.add_argument(f"--{field.name}", action="store_true")
        else:
            parser.add_argument(f"--{field.name}", type=int if field.type == "int" else str, required=True)
    args = parser.parse_args(argv)
    split = Split(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Split)})
    return args.role, args.url, split, args.seconds


def main(argv: list[str] | None = None) -> None:
    role, url, split, seconds = parse_args(argv)
    broker = BrokerURL.parse(url)
    side = consumer(broker, split) if role == "consumer" else producer(broker, split, seconds)
    try:
        # A stalled broker (e.g. blocking publishers) must not hang the run.
        figures = uvloop.run(asyncio.wait_for(side, timeout=time_limit(seconds)))
    except (BrokerClosed, OSError, asyncio.TimeoutError) as error:  # said in one line, which warrenperf.run shows
        sys.exit(f"{role}: {error or type(error).__name__}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
