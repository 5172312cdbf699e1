"""The load scenarios. Each runs for a bounded time or count and returns its figures as {metric: value}."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, DeliveryCounter, message_frames
from warrenperf.process_memory import cpu_seconds, listener_pid, resident_kib

PAYLOAD = b"x" * 16  # every scenario publishes 16-byte messages
BATCH = 100  # messages written per transport.write by an unconfirmed publisher
OPEN_AT_ONCE = 50  # connections handshaking concurrently in idle-memory


@dataclass(frozen=True)
class Options:
    seconds: float  # how long a time-bounded scenario publishes
    count: int  # messages pre-filled for "consume"
    window: int  # unconfirmed publishes allowed in "confirms"
    persistent: bool  # "confirms" publishes delivery_mode 2 to a durable queue
    connections: int  # idle connections opened by "idle-memory"
    broker_pid: int | None  # process whose RSS and CPU time the scenarios read; found from the port when None


Figures = dict[str, float]


def _unique(prefix: str) -> str:
    return f"bench-{prefix}-{os.getpid()}-{time.monotonic_ns()}"


def _broker_cpu(url: BrokerURL, options: Options) -> Callable[[int], float]:
    """Starts counting the broker's CPU time (its process and children); the function returned gives the µs of it
    per item (message, connection) since then."""
    pid = options.broker_pid or listener_pid(url.port)
    before = cpu_seconds(pid)
    return lambda items: (cpu_seconds(pid) - before) * 1e6 / items if items else 0.0


async def _publish_for(connection: BenchConnection, message: bytes, seconds: float) -> tuple[int, float]:
    """Publish `message` as fast as the broker takes it for `seconds`; returns (messages sent, start time)."""
    batch = message * BATCH
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        await connection.send(batch)
        sent += BATCH
    return sent, start


async def _publish_confirmed(connection: BenchConnection, channel: int, message: bytes, tracker: ConfirmTracker,
                             deadline: float, count: int | None = None) -> None:
    """Keep `tracker.window` publishes unconfirmed until the deadline (or `count` publishes), then await the rest."""
    while time.perf_counter() < deadline and (count is None or tracker.published < count):
        room = tracker.window - tracker.outstanding
        if count is not None:
            room = min(room, count - tracker.published)
        if room > 0:
            tracker.sent_at = time.perf_counter()
            tracker.published += room
            await connection.send(message * room)
        else:
            await tracker.wait_for_room()
    await tracker.wait_for_all()


async def publish(url: BrokerURL, options: Options) -> Figures:
    """One publisher, no confirms, to a fresh queue nobody consumes."""
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    queue = _unique("publish")
    await connection.declare_queue(channel, queue)
    cpu_per = _broker_cpu(url, options)
    sent, start = await _publish_for(connection, message_frames(channel, "", queue, PAYLOAD), options.seconds)
    queued = await connection.declare_queue(channel, queue, passive=True)  # returns once every publish is read
    elapsed = time.perf_counter() - start
    cpu = cpu_per(sent)
    await connection.delete_queue(channel, queue)
    await connection.close()
    return {"msg/s": sent / elapsed, "published": sent, "queued": queued, "cpu us/msg": cpu}


async def consume(url: BrokerURL, options: Options) -> Figures:
    """Drain a queue pre-filled with `count` messages, auto-ack; stops early after `seconds`."""
    publisher = await BenchConnection.open(url)
    channel = await publisher.open_channel()
    queue = _unique("consume")
    await publisher.declare_queue(channel, queue)
    tracker = ConfirmTracker(window=1000, record_latency=False)
    await publisher.select_confirms(channel, tracker)
    await _publish_confirmed(publisher, channel, message_frames(channel, "", queue, PAYLOAD), tracker,
                             deadline=time.perf_counter() + 10 * options.seconds + 60, count=options.count)
    queued = await publisher.declare_queue(channel, queue, passive=True)

    consumer = await BenchConnection.open(url)
    consumer_channel = await consumer.open_channel()
    counter = DeliveryCounter(consumer_channel, target=queued)
    cpu_per = _broker_cpu(url, options)
    start = time.perf_counter()
    await consumer.consume(consumer_channel, queue, counter, no_ack=True)
    try:
        await asyncio.wait_for(asyncio.shield(counter.reached), options.seconds)
    except asyncio.TimeoutError:
        pass
    elapsed = time.perf_counter() - start
    delivered = counter.delivered
    cpu = cpu_per(delivered)
    await consumer.close()
    await publisher.delete_queue(channel, queue)
    await publisher.close()
    return {"msg/s": delivered / elapsed, "prefilled": queued, "delivered": delivered, "cpu us/msg": cpu}


async def confirms(url: BrokerURL, options: Options) -> Figures:
    """Publisher confirms with `window` publishes outstanding; window 1 also reports confirm latency."""
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    queue = _unique("confirms")
    await connection.declare_queue(channel, queue, durable=options.persistent)
    tracker = ConfirmTracker(window=options.window, record_latency=options.window == 1)
    await connection.select_confirms(channel, tracker)
    message = message_frames(channel, "", queue, PAYLOAD, persistent=options.persistent)
    cpu_per = _broker_cpu(url, options)
    start = time.perf_counter()
    await _publish_confirmed(connection, channel, message, tracker, deadline=start + options.seconds)
    elapsed = time.perf_counter() - start
    cpu = cpu_per(tracker.confirmed)
    await connection.delete_queue(channel, queue)
    await connection.close()
    figures = {"msg/s": tracker.confirmed / elapsed, "confirmed": tracker.confirmed, "nacked": tracker.nacked,
               "cpu us/msg": cpu}
    if tracker.latencies:
        cuts = statistics.quantiles(tracker.latencies, n=100)
        figures.update({"p50 ms": cuts[49] * 1000, "p99 ms": cuts[98] * 1000})
    return figures


async def churn(url: BrokerURL, options: Options) -> Figures:
    """Open a connection (full handshake and one channel) and close it, one after another, for `seconds`."""
    opened = 0
    cpu_per = _broker_cpu(url, options)
    start = time.perf_counter()
    deadline = start + options.seconds
    while time.perf_counter() < deadline:
        connection = await BenchConnection.open(url)
        await connection.open_channel()
        await connection.close()
        opened += 1
    return {"conn/s": opened / (time.perf_counter() - start), "opened": opened, "cpu us/conn": cpu_per(opened)}


async def _open_idle(url: BrokerURL) -> BenchConnection:
    connection = await BenchConnection.open(url)
    await connection.open_channel()
    return connection


async def idle_memory(url: BrokerURL, options: Options) -> Figures:
    """Broker RSS growth per idle connection (each with one open channel), over `connections` connections.

    Meaningful on a freshly started broker: after heavy traffic, freed memory is reused and RSS may even shrink.
    """
    pid = options.broker_pid or listener_pid(url.port)
    warm_up = await _open_idle(url)  # the first connection's one-off allocations are not per connection
    await warm_up.close()
    before = resident_kib(pid)
    idle: list[BenchConnection] = []
    for first in range(0, options.connections, OPEN_AT_ONCE):
        batch = range(first, min(first + OPEN_AT_ONCE, options.connections))
        idle.extend(await asyncio.gather(*(_open_idle(url) for _ in batch)))
    after = resident_kib(pid)
    for first in range(0, len(idle), OPEN_AT_ONCE):
        await asyncio.gather(*(connection.close() for connection in idle[first:first + OPEN_AT_ONCE]))
    return {"KiB/conn": (after - before) / options.connections, "rss before MiB": before / 1024,
            "rss after MiB": after / 1024}


SCENARIOS: dict[str, Callable[[BrokerURL, Options], Awaitable[Figures]]] = {
    "publish": publish,
    "consume": consume,
    "confirms": confirms,
    "churn": churn,
    "idle-memory": idle_memory,
}
