"""kill -9 of the broker, then a restart on the same data dir: every confirmed (or committed) persistent message of a
durable queue is back, in order and once; deliveries unacked at the crash come back redelivered; acked messages
come back only when their ack had not reached the disk; a torn or corrupt tail in the last file is cut off at
start-up. Each test runs a broker process of its own, so these run only against Warren.

The figures (unconfirmed publishes that made it anyway, share of acked messages that came back) are printed:
run with -s to see them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from warrenperf.client import BenchConnection, BrokerClosed, BrokerURL, ConfirmTracker, message_frames
from tests.integration.helpers import (
    confirmed_barrier, connect, enqueue, message_count, segment_written_last, sync, wait_until,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
BODY_PADDING = b"." * 100  # bodies of about 110 bytes: a numbered prefix, then padding


def numbered(index: int) -> bytes:
    return b"%06d" % index + BODY_PADDING


def number_of(body: bytes) -> int:
    return int(body[:6])


def abandon(conn: pika.BlockingConnection) -> None:
    """Let go of a connection whose broker was killed under it."""
    with contextlib.suppress(pika.exceptions.AMQPError):
        conn.close()


def read_queue(broker, queue: str) -> list[tuple[bytes, bool]]:
    """Every message of `queue` as (body, redelivered), in queue order, taken by a no-ack consumer."""
    with connect(broker) as conn:
        ch = conn.channel()
        expected = message_count(ch, queue)
        received: list[tuple[bytes, bool]] = []
        ch.basic_consume(queue, lambda _ch, method, _props, body: received.append((body, method.redelivered)),
                         auto_ack=True)
        wait_until(conn, lambda: len(received) >= expected, timeout=30)
        ch.close()
        return received


def assert_in_order_once(numbers: list[int]) -> None:
    assert numbers == sorted(set(numbers)), "messages came back out of order or twice"


# --- publishing in confirm mode through a kill -9 ---------------------------------------------------------------

class PrefixConfirms(ConfirmTracker):
    """Confirms of a channel that publishes to one queue, which the broker confirms in publishing order."""

    def __init__(self, window: int) -> None:
        super().__init__(window, record_latency=False)
        self.acked_upto = 0  # every publish with a tag up to this one was acked (tags start at 1)

    def on_confirm(self, delivery_tag: int, multiple: bool, acked: bool) -> None:
        super().on_confirm(delivery_tag, multiple, acked)
        if acked and not self.nacked:
            self.acked_upto = delivery_tag


async def publish_numbered(broker, queue: str, count: int, window: int = 500,
                           kill_after: int | None = None) -> PrefixConfirms:
    """Publish `count` numbered persistent messages with up to `window` unconfirmed, and wait for the confirms.
    With `kill_after`: SIGKILL the broker as soon as that many are confirmed, and keep publishing until the
    connection drops."""
    connection_ = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection_.open_channel()
    tracker = PrefixConfirms(window)
    await connection_.select_confirms(channel, tracker)
    killed = False
    try:
        for index in range(count):
            await tracker.wait_for_room()
            tracker.published += 1
            await connection_.send(message_frames(channel, "", queue, numbered(index), persistent=True))
            if kill_after is not None and not killed and tracker.acked_upto >= kill_after:
                broker.process.send_signal(signal.SIGKILL)
                killed = True
        await tracker.wait_for_all()
    except BrokerClosed:
        if kill_after is None:
            raise
    finally:
        connection_.transport.abort()
    if kill_after is not None:
        assert killed, "the broker confirmed too few publishes to be killed mid-publish"
    else:
        assert tracker.acked_upto == count
    return tracker


def test_kill_mid_publish_loses_no_confirmed_message(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        conn.channel().queue_declare("orders", durable=True)
    tracker = asyncio.run(publish_numbered(broker, "orders", count=6000, window=500, kill_after=3000))
    broker.stop()
    broker.start()

    recovered = read_queue(broker, "orders")
    numbers = [number_of(body) for body, _ in recovered]
    assert_in_order_once(numbers)
    assert numbers[:tracker.acked_upto] == list(range(tracker.acked_upto)), "a confirmed message was lost"
    assert all(number < tracker.published for number in numbers)
    assert not any(redelivered for _, redelivered in recovered)  # nothing was ever delivered
    unconfirmed = tracker.published - tracker.acked_upto
    print(f"\nkill -9 mid-publish: {tracker.published} sent, {tracker.acked_upto} confirmed, {unconfirmed} "
          f"unconfirmed at the crash, of which {len(numbers) - tracker.acked_upto} were recovered anyway")


def test_publishes_confirmed_to_several_durable_queues_survive_a_kill(own_broker):
    broker = own_broker()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.exchange_declare("fan", "fanout", durable=True)
    for queue in ("copy-1", "copy-2"):
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "fan")
    ch.queue_declare("transient-copy")
    ch.queue_bind("transient-copy", "fan")
    ch.confirm_delivery()
    for index in range(200):
        ch.basic_publish("fan", "", numbered(index), PERSISTENT)  # returns once confirmed
    broker.kill()
    abandon(conn)
    broker.start()

    for queue in ("copy-1", "copy-2"):
        assert [body for body, _ in read_queue(broker, queue)] == [numbered(index) for index in range(200)]


def test_tx_commit_ok_means_the_messages_survive_a_kill(own_broker):
    broker = own_broker()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("ledger", durable=True)
    ch.tx_select()
    for batch in range(20):
        for index in range(batch * 10, batch * 10 + 10):
            ch.basic_publish("", "ledger", numbered(index), PERSISTENT)
        ch.tx_commit()
    for index in range(200, 205):
        ch.basic_publish("", "ledger", numbered(index), PERSISTENT)  # never committed
    sync(ch)
    broker.kill()  # straight after the last tx.commit-ok
    abandon(conn)
    broker.start()

    assert [body for body, _ in read_queue(broker, "ledger")] == [numbered(index) for index in range(200)]


# --- deliveries and acks through a kill -9 ---------------------------------------------------------------------

def test_deliveries_unacked_at_a_kill_come_back_redelivered(own_broker):
    broker = own_broker()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare("work", durable=True)
    enqueue(conn, "work", [numbered(index) for index in range(100)], properties=PERSISTENT)
    ch.basic_qos(prefetch_count=10)
    received = []
    ch.basic_consume("work", lambda _ch, method, _props, body: received.append((method.delivery_tag, body)))
    wait_until(conn, lambda: len(received) == 10)
    ch.basic_ack(received[4][0], multiple=True)  # 0..4 acked, 5..9 unacked
    wait_until(conn, lambda: len(received) == 15)  # the window refills: 10..14 delivered too
    confirmed_barrier(conn)
    broker.kill()
    abandon(conn)
    broker.start()

    expected = [(numbered(index), True) for index in range(5, 15)] + \
               [(numbered(index), False) for index in range(15, 100)]
    assert read_queue(broker, "work") == expected


def test_acked_messages_come_back_only_if_the_ack_had_not_reached_the_disk(own_broker):
    broker = own_broker()
    count = 50000  # enough that acks are still flowing when the broker is killed, however fast it drains
    with connect(broker) as conn:
        conn.channel().queue_declare("jobs", durable=True)
    asyncio.run(publish_numbered(broker, "jobs", count))

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    acked: list[int] = []  # numbers of the messages acked, in ack order

    def ack_on_arrival(_ch, method, _props, body) -> None:
        if conn.is_open:
            ch.basic_ack(method.delivery_tag)
            acked.append(number_of(body))

    ch.basic_consume("jobs", ack_on_arrival)
    wait_until(conn, lambda: len(acked) >= 1000, timeout=30)
    confirmed_barrier(conn)  # acks sent so far are on disk: these must never come back
    on_disk, barrier_at = len(acked), time.perf_counter()
    wait_until(conn, lambda: len(acked) >= on_disk + 1000, timeout=30)
    broker.process.send_signal(signal.SIGKILL)  # mid-stream: acks are flowing
    before_kill = len(acked)  # later acks (of deliveries already in the client's buffers) reach no broker
    ack_rate = (before_kill - on_disk) / (time.perf_counter() - barrier_at)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        wait_until(conn, lambda: False, timeout=10)  # keeps acking until the connection drops
    broker.stop()
    broker.start()

    recovered = [number_of(body) for body, _ in read_queue(broker, "jobs")]
    assert_in_order_once(recovered)
    acked_before_barrier, acked_after = acked[:on_disk], acked[on_disk:]
    never_acked = sorted(set(range(count)) - set(acked))
    came_back = [number for number in acked_after if number in set(recovered)]
    assert not set(acked_before_barrier) & set(recovered), "an ack that had reached the disk was undone"
    assert [number for number in recovered if number not in set(came_back)] == never_acked
    # acks reach the disk in the order they were made, so the ones undone are the last ones
    assert came_back == acked_after[len(acked_after) - len(came_back):]
    reached_broker = acked[:before_kill]
    undone = [number for number in reached_broker if number in set(came_back)]
    print(f"\nkill -9 while acking: {before_kill} acks sent before the kill ({before_kill - on_disk} after the last "
          f"durable barrier, at {ack_rate:.0f} acks/s), {len(undone)} of them undone = "
          f"{len(undone) / before_kill:.2%} of all, the last {len(undone) / ack_rate * 1000:.0f} ms of acks; "
          f"{len(acked) - before_kill} more acks sent after the kill, of which {len(came_back) - len(undone)} "
          f"came back")


# --- a torn or corrupt tail ------------------------------------------------------------------------------------

def append_bytes(data: bytes):
    def damage(path: Path) -> None:
        with path.open("ab") as file:
            file.write(data)
    return damage


def cut_short(path: Path) -> None:
    """A write cut off by the crash: the last record loses its last 7 bytes."""
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size - 7)


def flip_last_byte(path: Path) -> None:
    """A record whose bytes did not all reach the disk intact: its CRC no longer matches."""
    with path.open("r+b") as file:
        file.seek(-1, 2)
        last = file.read(1)
        file.seek(-1, 2)
        file.write(bytes([last[0] ^ 0xFF]))


TAIL_DAMAGE = {
    # name: (damage, messages lost with the tail)
    "half-written-frame": (append_bytes(b"\x40\x00\x00\x00\x12\x34"), 0),
    "frame-longer-than-the-file": (append_bytes(b"\x00\x10\x00\x00\xde\xad\xbe\xef" + b"x" * 50), 0),
    "zero-filled-block": (append_bytes(bytes(4096)), 0),
    "last-record-cut-short": (cut_short, 1),
    "last-record-corrupt": (flip_last_byte, 1),
}


@pytest.mark.parametrize("damage, lost", TAIL_DAMAGE.values(), ids=TAIL_DAMAGE.keys())
def test_a_torn_tail_is_truncated_and_what_came_before_is_served(own_broker, damage, lost):
    broker = own_broker()
    with connect(broker) as conn:
        conn.channel().queue_declare("q", durable=True)
        enqueue(conn, "q", [numbered(index) for index in range(50)], properties=PERSISTENT)
    broker.kill()
    segment = segment_written_last(broker.data_dir)
    intact_size = segment.stat().st_size
    damage(segment)
    broker.start()  # recovery is over once the broker listens

    assert "truncating" in broker.log()
    if lost == 0:
        assert segment.stat().st_size == intact_size
    else:
        assert segment.stat().st_size < intact_size
    assert [body for body, _ in read_queue(broker, "q")] == [numbered(index) for index in range(50 - lost)]
    # the log goes on cleanly after the cut: new messages follow the old ones across another restart
    with connect(broker) as conn:
        enqueue(conn, "q", [numbered(index) for index in range(100, 105)], properties=PERSISTENT)
    broker.restart()
    assert [body for body, _ in read_queue(broker, "q")] == [numbered(index) for index in range(100, 105)]


def test_a_torn_tail_in_the_definitions_log_is_truncated(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("kept-x", "topic", durable=True)
        ch.queue_declare("kept-q", durable=True)
        ch.queue_bind("kept-q", "kept-x", "a.#")
        enqueue(conn, "kept-q", [b"kept"], properties=PERSISTENT)
    broker.kill()
    append_bytes(b"\x20\x00\x00\x00\x00")(broker.data_dir / "definitions.log")
    broker.start()

    assert "truncating" in broker.log()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("kept-x", "topic", durable=True, passive=True)
        publisher = conn.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("kept-x", "a.b", b"routed", PERSISTENT)
        assert [ch.basic_get("kept-q", auto_ack=True)[2] for _ in range(2)] == [b"kept", b"routed"]
