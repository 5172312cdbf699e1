"""A broker whose data dir fills up: what did not fit is nacked, what was confirmed stays, the broker goes on serving,
and once space is freed confirms are acks again. The data dir is a 2 MiB tmpfs of the test's own (root only)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, NackError

from tests.tmpfs import tmpfs

BODY = 20_000  # bytes per persistent message: about a hundred fill the disk
GUARD = 30  # seconds a blocked connection may wait before pika gives up (only a broker that never unblocks)


@pytest.fixture
def tiny_disk(tmp_path) -> Path:
    with tmpfs(tmp_path / "disk", "size=2m") as mount_point:
        yield mount_point  # the data dir itself: the broker's log goes to its parent, off the tiny disk


def connect(broker) -> pika.BlockingConnection:
    parameters = pika.URLParameters(broker.url)
    parameters.blocked_connection_timeout = GUARD
    return pika.BlockingConnection(parameters)


def persistent(number: int) -> tuple[bytes, pika.BasicProperties]:
    return b"%06d" % number + b"x" * BODY, pika.BasicProperties(delivery_mode=2)


def fill(broker, queue: str) -> list[bytes]:
    """Publish persistent messages with confirms until one is nacked; return the confirmed bodies."""
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    confirmed = []
    for number in range(500):
        body, properties = persistent(number)
        try:
            channel.basic_publish("", queue, body, properties)
        except NackError:
            break
        confirmed.append(body)
    else:
        pytest.fail("500 messages of 20 KB fit on a 2 MiB disk")
    connection.close()  # it is blocked now ("low on disk"), as a publisher on RabbitMQ would be
    return confirmed


def drain(broker, queue: str) -> list[bytes]:
    """Consume (basic.get + ack) everything in the queue."""
    connection = connect(broker)
    channel = connection.channel()
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue)
        if method is None:
            break
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
    connection.close()
    return bodies


def test_a_full_disk_nacks_keeps_what_was_confirmed_and_acks_again_once_space_is_freed(own_broker, tiny_disk):
    broker = own_broker(data_dir=tiny_disk)
    confirmed = fill(broker, "filled")
    assert confirmed, "not even one message fitted"

    broker.restart()  # everything confirmed is on disk
    assert set(confirmed) <= set(drain(broker, "filled"))

    confirmed = fill(broker, "filled")  # full again, without a restart this time
    assert set(confirmed) <= set(drain(broker, "filled"))  # consuming and acking work on a full disk
    # the consumed messages' segment goes, the disk alarm clears, and persistent publishes are confirmed again
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("after", durable=True)
    later = [persistent(number) for number in range(1000, 1040)]  # about 800 KB: more than was free when full
    for body, properties in later:
        channel.basic_publish("", "after", body, properties)
    channel.queue_declare("transient", exclusive=True)
    channel.basic_publish("", "transient", b"t")
    assert channel.basic_get("transient", auto_ack=True)[2] == b"t"
    connection.close()

    broker.restart()
    assert drain(broker, "after") == [body for body, _ in later]


def test_a_durable_declare_on_a_full_disk_is_either_kept_or_refused(own_broker, tiny_disk):
    broker = own_broker(data_dir=tiny_disk)
    fill(broker, "filled")
    filler = tiny_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # take what the failed publish left free
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)
    connection = connect(broker)
    channel = connection.channel()
    arguments = {"x-note": "n" * 8000}  # a definition record larger than a page: it needs room of its own
    try:
        channel.queue_declare("declared-when-full", durable=True, arguments=arguments)
        declared = True
    except ConnectionClosedByBroker as error:  # 541 is a connection error in AMQP 0-9-1
        declared = False
        assert error.reply_code == 541
    if connection.is_open:
        connection.close()

    filler.unlink()
    broker.restart()
    connection = connect(broker)
    channel = connection.channel()
    try:
        channel.queue_declare("declared-when-full", passive=True)
        exists = True
    except ChannelClosedByBroker as error:
        assert error.reply_code == 404
        exists = False
    if connection.is_open:
        connection.close()
    assert exists == declared, "declare-ok for a queue that did not survive" if declared else "a refused declare"
