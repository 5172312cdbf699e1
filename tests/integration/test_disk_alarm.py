"""When durable writes fail (here: the data dir's file system is full), persistent messages are nacked and the
broker raises its disk alarm: publishing connections get connection.blocked "low on disk" (RabbitMQ's reason),
and connection.unblocked once writes work again. Runs only against Warren (RabbitMQ's disk alarm works from a free
space limit, not from failed writes)."""

from __future__ import annotations

import pika
import pika.exceptions

from tests.integration.helpers import connect, wait_until
from tests.tmpfs import tmpfs

DISK = "size=2m"  # a tiny file system for the data dir
LEFT_FREE = 256 << 10  # bytes a filler file leaves free for the store, which persistent messages then fill
BODY = b"x" * (16 << 10)
MOST_PUBLISHES = 4 * LEFT_FREE // len(BODY)  # bounds the filling loop (it needs about LEFT_FREE // len(BODY))
EVENT_TIMEOUT = 15.0  # generous: the machine is shared


def fill(path, leave_free: int) -> None:
    """Write `path` until the file system is full, then give back `leave_free` bytes."""
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(b"\0" * (64 << 10))
                filler.flush()
        except OSError:
            pass
        filler.truncate(max(0, filler.tell() - leave_free))


def publish_persistent(channel) -> bool:
    """Publish one persistent message on a confirming channel: True if acked, False if nacked."""
    try:
        channel.basic_publish("", "filled", BODY, pika.BasicProperties(delivery_mode=2))
    except pika.exceptions.NackError:
        return False
    return True


def test_failing_writes_block_publishers_low_on_disk_until_writes_work_again(own_broker, tmp_path):
    with tmpfs(tmp_path / "disk", DISK) as disk:
        data_dir = tmp_path / "data"  # the broker's log goes beside it, off the tiny disk
        data_dir.symlink_to(disk / "data", target_is_directory=True)
        (disk / "data").mkdir()
        broker = own_broker(data_dir=data_dir)
        try:
            publisher = connect(broker)
            blocked, unblocked = [], []
            publisher.add_on_connection_blocked_callback(lambda _, frame: blocked.append(frame.method.reason))
            publisher.add_on_connection_unblocked_callback(lambda _, frame: unblocked.append(frame))
            channel = publisher.channel()
            channel.confirm_delivery()
            channel.queue_declare("filled", durable=True)
            fill(disk / "filler", LEFT_FREE)

            accepted = 0
            while accepted < MOST_PUBLISHES and publish_persistent(channel):
                accepted += 1
            assert 0 < accepted < MOST_PUBLISHES  # the store took what fitted, then nacked
            assert not publish_persistent(channel)  # still refused, and this publisher is blocked
            wait_until(publisher, lambda: blocked, EVENT_TIMEOUT)
            assert (blocked, unblocked) == (["low on disk"], [])

            (disk / "filler").unlink()  # space again; the purge's record is the next write, and it succeeds
            with connect(broker) as other:
                assert other.channel().queue_purge("filled").method.message_count >= accepted
            wait_until(publisher, lambda: unblocked, EVENT_TIMEOUT)
            assert publish_persistent(channel)
            publisher.close()
            log = broker.log()
            assert "CRITICAL" in log and "disk alarm:" in log and "disk alarm cleared" in log
        finally:
            broker.stop()  # before the unmount, which a running broker would keep busy
