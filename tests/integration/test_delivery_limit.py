"""Delivery limits (x-delivery-limit, policy key delivery-limit), the cure for a consumer that returns a message
for ever: past the limit the message is dead-lettered with reason delivery_limit, or dropped without a dead-letter
exchange. RabbitMQ has them on quorum queues (checked against the reference RabbitMQ); Warren on every queue type.
A return counts when it fails: basic.reject, or the channel going with the delivery (RabbitMQ 4.3)."""

from __future__ import annotations

import pytest

from tests.integration import management
from tests.integration.helpers import (
    beyond_rabbitmq, channel_error, connect, declare_queue, enqueue, get, rabbitmq4, reply_text,
    wait_for_message_count,
)

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def dead_letters(channel, unique):
    """A dead-letter exchange (fanout) and the queue it routes to: returns (exchange, queue)."""
    exchange, queue = f"{unique}-dlx", f"{unique}-dead"
    channel.exchange_declare(exchange, "fanout")
    declare_queue(channel, queue)
    channel.queue_bind(queue, exchange)
    yield exchange, queue
    channel.queue_delete(queue)
    channel.exchange_delete(exchange)


def reject_times(channel, queue: str, times: int) -> list[dict]:
    """Take the head message with basic.get and reject it with requeue, times over; returns the headers seen."""
    seen = []
    for _ in range(times):
        method, properties, _ = channel.basic_get(queue)
        seen.append(properties.headers or {})
        channel.basic_reject(method.delivery_tag, requeue=True)
    return seen


def test_a_quorum_queue_dead_letters_a_message_rejected_past_its_limit(conn, channel, unique, dead_letters):
    exchange, dead = dead_letters
    declare_queue(channel, unique, durable=True,
                  arguments={**QUORUM, "x-delivery-limit": 2, "x-dead-letter-exchange": exchange})
    enqueue(conn, unique, [b"poison"])
    headers = reject_times(channel, unique, 3)
    assert [seen.get("x-delivery-count") for seen in headers[1:]] == [1, 2]  # (the first: 0 in 3.x, none in 4.3)
    wait_for_message_count(channel, dead, 1)  # RabbitMQ dead-letters in the background
    message = get(channel, dead)
    assert message.body == b"poison"
    death = message.properties.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", unique, 1)
    assert get(channel, unique) is None
    channel.queue_delete(unique)


def test_without_a_dead_letter_exchange_the_message_is_dropped(conn, channel, unique):
    declare_queue(channel, unique, durable=True, arguments={**QUORUM, "x-delivery-limit": 0})
    enqueue(conn, unique, [b"poison", b"fine"])
    reject_times(channel, unique, 1)
    assert get(channel, unique).body == b"fine"
    assert get(channel, unique) is None
    channel.queue_delete(unique)


def test_a_closed_channel_counts_as_a_failed_delivery(broker, conn, channel, unique, dead_letters):
    exchange, dead = dead_letters
    declare_queue(channel, unique, durable=True,
                  arguments={**QUORUM, "x-delivery-limit": 1, "x-dead-letter-exchange": exchange})
    enqueue(conn, unique, [b"m"])
    for _ in range(2):
        wait_for_message_count(channel, unique, 1)
        with connect(broker) as other:
            assert other.channel().basic_get(unique)[2] == b"m"  # unacked when its connection closes
    wait_for_message_count(channel, dead, 1)
    assert get(channel, dead).body == b"m"
    channel.queue_delete(unique)


@rabbitmq4
def test_nack_returns_without_counting(conn, channel, unique):
    """RabbitMQ 4.3: basic.nack is not a failed delivery; only x-acquired-count grows."""
    declare_queue(channel, unique, durable=True, arguments={**QUORUM, "x-delivery-limit": 0})
    enqueue(conn, unique, [b"m"])
    for _ in range(3):
        method, _, _ = channel.basic_get(unique)
        channel.basic_nack(method.delivery_tag, requeue=True)
    message = get(channel, unique)
    assert (message.body, message.properties.headers) == (b"m", {"x-acquired-count": 3})
    channel.queue_delete(unique)


@rabbitmq4
def test_a_negative_limit_means_no_limit(conn, channel, unique):
    declare_queue(channel, unique, durable=True, arguments={**QUORUM, "x-delivery-limit": -1})
    enqueue(conn, unique, [b"m"])
    reject_times(channel, unique, 25)
    assert get(channel, unique).properties.headers["x-delivery-count"] == 25
    channel.queue_delete(unique)


@beyond_rabbitmq
def test_a_classic_queue_takes_a_delivery_limit_too(conn, channel, unique, dead_letters):
    exchange, dead = dead_letters
    declare_queue(channel, unique, arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": exchange})
    enqueue(conn, unique, [b"poison"])
    assert [seen.get("x-delivery-count") for seen in reject_times(channel, unique, 2)] == [None, 1]
    assert get(channel, dead).properties.headers["x-death"][0]["reason"] == "delivery_limit"
    channel.queue_delete(unique)


@beyond_rabbitmq
def test_a_classic_queue_without_a_limit_adds_no_headers(conn, channel, unique):
    """As RabbitMQ's classic queues: returns are not counted in headers unless the queue limits them."""
    declare_queue(channel, unique)
    enqueue(conn, unique, [b"m"])
    reject_times(channel, unique, 2)
    message = get(channel, unique)
    assert (message.redelivered, message.properties.headers) == (True, None)
    channel.queue_delete(unique)


@beyond_rabbitmq
def test_the_policy_key_sets_the_limit(broker, conn, channel, unique, dead_letters):
    exchange, dead = dead_letters
    management.set_policy(broker, "/", unique, f"^{unique}$", {"delivery-limit": 1, "dead-letter-exchange": exchange},
                          apply_to="queues")
    try:
        declare_queue(channel, unique)
        enqueue(conn, unique, [b"m"])
        reject_times(channel, unique, 2)
        assert get(channel, dead).body == b"m"
        shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
        assert shown["delivery_limit"] == 1
    finally:
        management.clear_policy(broker, "/", unique)
        channel.queue_delete(unique)


@beyond_rabbitmq
def test_a_limit_that_is_not_an_integer_is_refused(channel, unique):
    """RabbitMQ 4 takes any value and falls back to its default; Warren refuses one it cannot use."""
    assert channel_error(lambda: channel.queue_declare(unique, durable=True,
                                                       arguments={**QUORUM, "x-delivery-limit": "5"})) == (
        406, reply_text(f"PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue '{unique}' in vhost '/': "
                        "\"expected integer, got longstr\""))
