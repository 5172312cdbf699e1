"""Disk use of persistent messages: a steady publish/consume run keeps the data dir's size flat (bounded by what is
queued plus a few segments, not by what was published), and a full disk makes the broker nack the publishes it
cannot persist while it keeps running and keeps everything it confirmed before. Each test runs a broker process of
its own, so these run only against Warren. Run with -s to see the figures."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from storage.store import SEGMENT_BYTES
from tests.integration.helpers import connect, get_all, message_count
from tests.tmpfs import tmpfs
from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, DeliveryCounter, message_frames

MIB = 1 << 20
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def disk_use(directory: Path) -> int:
    """Bytes the files under `directory` occupy on disk (what du counts); a file the broker removes between the
    listing and its stat (a segment it has emptied) occupies nothing."""
    def occupied(path: str) -> int:
        try:
            return os.stat(path).st_blocks * 512
        except FileNotFoundError:
            return 0
    return sum(occupied(os.path.join(root, name)) for root, _, names in os.walk(directory) for name in names)


def settled_disk_use(directory: Path, bound: int, timeout: float = 5.0) -> int:
    """Disk use of `directory` once it is at most `bound`, or when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while (use := disk_use(directory)) > bound and time.monotonic() < deadline:
        time.sleep(0.05)
    return use


class PacedCounter(DeliveryCounter):
    """A consumer's delivery count that a publisher can wait on, to keep the queue short."""

    def __init__(self, channel: int, ack_every: int) -> None:
        super().__init__(channel, ack_every)
        self._wake_at = 0  # delivery count that resolves _waiter
        self._waiter: asyncio.Future[None] | None = None

    def on_deliver(self, delivery_tag: int, outgoing: list[bytes]) -> None:
        super().on_deliver(delivery_tag, outgoing)
        if self._waiter is not None and self.delivered >= self._wake_at and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for_deliveries(self, count: int) -> None:
        if self.delivered < count:
            self._wake_at = count
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def fail(self, error: Exception) -> None:
        super().fail(error)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)


async def steady_run(broker, queue: str, count: int, body_size: int, max_queued: int, sample_every: int,
                     park_every: int = 0) -> list[int]:
    """Publish `count` persistent messages in confirm mode while a consumer acks them, never more than
    `max_queued` ahead of it; return the data dir's disk use sampled along the way. `count` must be a multiple of
    `max_queued // 8`, the consumer's multiple-ack step, so that every message ends acked. With `park_every`,
    one message in that many also goes to the queue "parked", which nobody consumes."""
    url = BrokerURL.parse(broker.url)
    publisher, consumer = await BenchConnection.open(url), await BenchConnection.open(url)
    consume_channel = await consumer.open_channel()
    await consumer.qos(consume_channel, max_queued // 2)
    counter = PacedCounter(consume_channel, ack_every=max_queued // 8)
    await consumer.consume(consume_channel, queue, counter, no_ack=False)
    publish_channel = await publisher.open_channel()
    tracker = ConfirmTracker(window=max_queued // 2, record_latency=False)
    await publisher.select_confirms(publish_channel, tracker)
    frames = message_frames(publish_channel, "", queue, b"x" * body_size, persistent=True)
    parked = message_frames(publish_channel, "", "parked", b"p" * body_size, persistent=True)
    samples = []
    for index in range(count):
        await counter.wait_for_deliveries(index - max_queued)
        await tracker.wait_for_room()
        tracker.published += 1
        await publisher.send(frames)
        if park_every and index % park_every == 0:
            tracker.published += 1
            await publisher.send(parked)
        if index % sample_every == 0:
            samples.append(disk_use(broker.data_dir))
    await tracker.wait_for_all()
    await counter.wait_for_deliveries(count)
    assert tracker.nacked == 0
    await publisher.close()
    await consumer.close()
    return samples


@pytest.mark.slow
@pytest.mark.parametrize("park_every", [0, 256], ids=["all-consumed", "some-parked-in-every-segment"])
def test_steady_publish_and_consume_keeps_disk_use_flat(own_broker, park_every):
    """With park_every, every segment keeps a few live messages of a queue nobody reads: only compaction keeps the
    disk flat then."""
    broker = own_broker()
    body_size, max_queued = 16 << 10, 512
    count = 8 * SEGMENT_BYTES // body_size  # eight segments' worth of messages
    with connect(broker) as conn:
        conn.channel().queue_declare("steady", durable=True)
        conn.channel().queue_declare("parked", durable=True)
    samples = asyncio.run(steady_run(broker, "steady", count, body_size, max_queued, sample_every=count // 48,
                                     park_every=park_every))
    with connect(broker) as conn:
        remaining = message_count(conn.channel(), "steady")
        parked = message_count(conn.channel(), "parked")
    # once all is consumed: the head segment and what is parked (spent segments go, compactions finish in the
    # background, which nothing announces)
    at_rest_bound = parked * body_size + SEGMENT_BYTES + MIB
    at_rest = settled_disk_use(broker.data_dir, at_rest_bound)

    published = count * body_size
    queued_at_most = max_queued * body_size + parked * body_size
    half = len(samples) // 2
    first_half, second_half = sum(samples[:half]) / half, sum(samples[half:]) / (len(samples) - half)
    print(f"\nsteady run: {published / MIB:.0f} MiB published in {count} messages, at most "
          f"{queued_at_most / MIB:.1f} MiB queued ({parked} parked); data dir on disk: max "
          f"{max(samples) / MIB:.1f} MiB, mean {first_half / MIB:.1f} MiB over the first half and "
          f"{second_half / MIB:.1f} MiB over the second; {at_rest / MIB:.1f} MiB once all {count - remaining} were "
          f"consumed; segments are {SEGMENT_BYTES / MIB:.0f} MiB")
    assert remaining == 0
    assert parked == (-(-count // park_every) if park_every else 0)
    # on disk: what is queued, the head segment, the one before it and a compaction's copy; not what was published
    assert max(samples) <= queued_at_most + 3 * SEGMENT_BYTES < published / 2
    # flat: were it growing with what is published, the second half would average 4 segments more than the first
    assert second_half <= first_half + 2 * SEGMENT_BYTES, \
        f"disk use grew over the run (MiB): {[round(sample / MIB, 1) for sample in samples]}"
    assert at_rest <= at_rest_bound


# --- a full disk -----------------------------------------------------------------------------------------------

TMPFS_BYTES = 24 * MIB


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs of the test's own (needs root, or the right to mount); unmounted at the end."""
    with tmpfs(tmp_path / "small-disk", f"size={TMPFS_BYTES}") as mount_point:
        yield mount_point


def publish_until_nacked(ch, queue: str, first: int, body_size: int, limit: int) -> tuple[list[int], list[int]]:
    """Publish numbered persistent messages one at a time in confirm mode until one is nacked (then the disk alarm
    blocks the connection until there is room again) or `limit` were sent; return the numbers acked and nacked."""
    acked, nacked = [], []
    for number in range(first, first + limit):
        try:
            ch.basic_publish("", queue, numbered(number, body_size), PERSISTENT)
            acked.append(number)
        except pika.exceptions.NackError:
            nacked.append(number)
            break
    return acked, nacked


def numbered(number: int, size: int) -> bytes:
    return (b"%06d" % number).ljust(size, b".")


def test_a_full_disk_nacks_publishes_and_loses_nothing_confirmed(own_broker, small_disk, tmp_path):
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (4 * MIB))  # freed later, to show the broker writes again once there is room
    (small_disk / "data").mkdir()
    (tmp_path / "data").symlink_to(small_disk / "data")  # the broker's log goes beside it, off the small disk
    broker = own_broker(data_dir=tmp_path / "data")
    body_size = 64 << 10
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    ch.confirm_delivery()
    acked, nacked = publish_until_nacked(ch, "q", 0, body_size, limit=2 * TMPFS_BYTES // body_size)
    assert broker.process.poll() is None
    assert "No space left on device" in broker.log()

    # the disk alarm blocks the publishing connection (as RabbitMQ's does); the broker goes on serving what needs
    # no disk to the others
    with connect(broker) as other:
        other_ch = other.channel()
        other_ch.queue_declare("transient-q")
        method, _, body = other_ch.basic_get("q")  # not acked: back in the queue when this connection closes
        assert int(body[:6]) == acked[0]
    # and writes again once there is room
    ballast.unlink()
    acked_later, nacked_later = publish_until_nacked(ch, "q", 10_000, body_size, limit=10)
    conn.close()

    broker.restart()
    with connect(broker) as conn:
        recovered = [int(body[:6]) for body in get_all(conn.channel(), "q")]
    confirmed = acked + acked_later
    lost = sorted(set(confirmed) - set(recovered))
    print(f"\nfull disk ({TMPFS_BYTES // MIB} MiB tmpfs, {body_size >> 10} KiB messages): {len(acked)} acked, then "
          f"{len(nacked)} nacked; {len(acked_later)} acked once 4 MiB were freed; after a restart "
          f"{len(recovered)} messages, {len(set(recovered) & set(nacked))} of them nacked ones, {len(lost)} "
          f"confirmed ones missing")
    assert not lost, f"{len(lost)} of {len(confirmed)} confirmed messages were lost, from number {lost[0]} on"
    assert nacked, "the disk filled up, yet every publish was confirmed"
    assert (len(acked_later), nacked_later) == (10, [])
    assert recovered == sorted(set(recovered))
    assert set(recovered) <= set(confirmed) | set(nacked)
