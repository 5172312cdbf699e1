"""Delivery acknowledgement timeouts: a channel holding a delivery unacked longer than its timeout is closed with
RabbitMQ's 406 and its deliveries are requeued. The broker's timeout (consumer_timeout) defaults to 30 minutes; a
queue sets its own with x-consumer-timeout or the policy key consumer-timeout (RabbitMQ 3.12+), a consumer its own
with the basic.consume argument x-consumer-timeout (RabbitMQ 4). The reference RabbitMQ is 3.10, which has only the
broker-wide setting: the per-queue and per-consumer tests are marked rabbitmq4."""

from __future__ import annotations

import time

import pytest

from tests.integration import management
from tests.integration.helpers import (
    Inbox, channel_error, closed_later, connect, consume, declare_queue, enqueue, get, rabbitmq4, reply_text,
    stay_quiet,
)

TIMEOUT_MS = 300


def timed_out(channel_number: int, timeout: int) -> tuple[int, str]:
    return 406, (f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel_number} timed out. Timeout "
                 f"value used: {timeout} ms. This timeout value can be configured, see consumers doc guide to learn "
                 "more")


@pytest.fixture
def short_timeout_broker(own_broker, tmp_path):
    """A broker whose consumer_timeout is TIMEOUT_MS."""
    config = tmp_path / "warren.toml"
    config.write_text(f"[amqp]\nconsumer_timeout = {TIMEOUT_MS}\n")
    return own_broker("--config", str(config))


def test_an_unacked_delivery_closes_its_channel_and_is_requeued(short_timeout_broker, unique):
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique)
        enqueue(conn, unique, [b"m"])
        channel = conn.channel()
        consuming = time.monotonic()  # (before the broker delivers: the client sees the delivery a moment later)
        consume(channel, unique)[1].wait_for(conn, 1)
        assert closed_later(conn, channel) == timed_out(channel.channel_number, TIMEOUT_MS)
        assert time.monotonic() - consuming >= TIMEOUT_MS / 1000
        message = get(conn.channel(), unique)
        assert (message.body, message.redelivered) == (b"m", True)


def test_a_basic_get_delivery_times_out_too(short_timeout_broker, unique):
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique)
        enqueue(conn, unique, [b"m"])
        channel = conn.channel()
        assert channel.basic_get(unique)[2] == b"m"
        assert closed_later(conn, channel) == timed_out(channel.channel_number, TIMEOUT_MS)


def test_deliveries_acked_in_time_keep_the_channel_open(short_timeout_broker, unique):
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique)
        channel = conn.channel()
        inbox = Inbox()
        consume(channel, unique, inbox)
        for round_number in range(4):
            enqueue(conn, unique, [b"m"])
            delivery = inbox.wait_for(conn, round_number + 1)[-1]
            stay_quiet(conn, TIMEOUT_MS / 1000 / 2)
            channel.basic_ack(delivery.delivery_tag)
        stay_quiet(conn, TIMEOUT_MS / 1000 * 1.5)
        assert channel.is_open


def test_no_ack_consumers_have_no_timeout(short_timeout_broker, unique):
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique)
        enqueue(conn, unique, [b"m"])
        channel = conn.channel()
        consume(channel, unique, auto_ack=True)[1].wait_for(conn, 1)
        stay_quiet(conn, TIMEOUT_MS / 1000 * 2)
        assert channel.is_open


@rabbitmq4
def test_a_queue_argument_sets_the_timeout(conn, unique):
    channel = conn.channel()
    declare_queue(channel, unique, arguments={"x-consumer-timeout": TIMEOUT_MS})
    enqueue(conn, unique, [b"m"])
    consumer = conn.channel()
    consume(consumer, unique)[1].wait_for(conn, 1)
    assert closed_later(conn, consumer) == timed_out(consumer.channel_number, TIMEOUT_MS)
    channel.queue_delete(unique)


@rabbitmq4
def test_the_policy_key_sets_the_timeout(broker, conn, unique):
    management.set_policy(broker, "/", unique, f"^{unique}$", {"consumer-timeout": TIMEOUT_MS}, apply_to="queues")
    try:
        channel = conn.channel()
        declare_queue(channel, unique)
        enqueue(conn, unique, [b"m"])
        consumer = conn.channel()
        consume(consumer, unique)[1].wait_for(conn, 1)
        assert closed_later(conn, consumer) == timed_out(consumer.channel_number, TIMEOUT_MS)
    finally:
        management.clear_policy(broker, "/", unique)
        conn.channel().queue_delete(unique)


@rabbitmq4
def test_a_consumer_argument_overrides_the_queues(conn, unique):
    channel = conn.channel()
    declare_queue(channel, unique, arguments={"x-consumer-timeout": 60_000})
    enqueue(conn, unique, [b"m"])
    consumer = conn.channel()
    consume(consumer, unique, arguments={"x-consumer-timeout": TIMEOUT_MS})[1].wait_for(conn, 1)
    assert closed_later(conn, consumer) == timed_out(consumer.channel_number, TIMEOUT_MS)
    channel.queue_delete(unique)


@rabbitmq4
def test_a_consumer_argument_can_lengthen_it(short_timeout_broker, unique):
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique)
        enqueue(conn, unique, [b"m"])
        consumer = conn.channel()
        consume(consumer, unique, arguments={"x-consumer-timeout": 60_000})[1].wait_for(conn, 1)
        stay_quiet(conn, TIMEOUT_MS / 1000 * 2)
        assert consumer.is_open


@rabbitmq4
def test_a_timeout_is_not_a_failed_delivery(short_timeout_broker, unique):
    """RabbitMQ 4.3: the returned message's acquired count grows, not its delivery count."""
    with connect(short_timeout_broker) as conn:
        declare_queue(conn.channel(), unique, durable=True, arguments={"x-queue-type": "quorum"})
        enqueue(conn, unique, [b"m"])
        consumer = conn.channel()
        consume(consumer, unique)[1].wait_for(conn, 1)
        closed_later(conn, consumer)
        message = get(conn.channel(), unique)
        assert message.properties.headers == {"x-acquired-count": 1}


@rabbitmq4
@pytest.mark.parametrize("where", ["queue", "consumer"])
def test_a_timeout_that_is_not_a_non_negative_integer_is_refused(conn, unique, where):
    channel = conn.channel()
    bad = {"x-consumer-timeout": -5}
    if where == "queue":
        action = lambda: channel.queue_declare(unique, arguments=bad)  # noqa: E731
    else:
        declare_queue(channel, unique)
        action = lambda: channel.basic_consume(unique, print, arguments=bad)  # noqa: E731
    assert channel_error(action) == (406, reply_text(
        f"PRECONDITION_FAILED - invalid arg 'x-consumer-timeout' for queue '{unique}' in vhost '/': "
        "{value_negative,-5}"))
    conn.channel().queue_delete(unique)


def test_a_zero_broker_timeout_means_none(own_broker, tmp_path, unique):
    """0 turns the timeout off (RabbitMQ: consumer_timeout = undefined), rather than timing out at once."""
    config = tmp_path / "warren.toml"
    config.write_text("[amqp]\nconsumer_timeout = 0\n")
    with connect(own_broker("--config", str(config))) as conn:
        declare_queue(conn.channel(), unique)
        enqueue(conn, unique, [b"m"])
        channel = conn.channel()
        consume(channel, unique)[1].wait_for(conn, 1)
        stay_quiet(conn, 0.2)
        assert channel.is_open
