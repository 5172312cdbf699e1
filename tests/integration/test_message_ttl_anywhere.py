"""Message TTL anywhere in the queue (beyond RabbitMQ, whose classic queues expire a message only once it reaches
the head): a message with a short TTL behind one with a long TTL expires on time and is dead-lettered then."""

from __future__ import annotations

import time

import pika

from tests.integration.helpers import (
    Inbox, beyond_rabbitmq, consume, declare_queue, enqueue, get, get_all, message_count, wait_for_message_count,
)

pytestmark = beyond_rabbitmq

LONG = pika.BasicProperties(expiration="60000")
SHORT_MS = 200
SHORT = pika.BasicProperties(expiration=str(SHORT_MS))


def with_dead_letters(channel, unique: str, **arguments) -> str:
    """Declare queue unique dead-lettering into a queue of its own; returns that queue's name."""
    dead = f"{unique}-dead"
    declare_queue(channel, dead)
    declare_queue(channel, unique, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
                                              **arguments})
    return dead


def test_a_short_ttl_behind_a_long_one_expires_on_time(conn, channel, unique):
    dead = with_dead_letters(channel, unique)
    enqueue(conn, unique, [b"long"], properties=LONG)
    published = time.monotonic()
    enqueue(conn, unique, [b"short"], properties=SHORT)
    wait_for_message_count(channel, dead, 1)
    assert time.monotonic() - published >= SHORT_MS / 1000
    dead_lettered = get(channel, dead)
    assert dead_lettered.body == b"short"
    assert dead_lettered.properties.headers["x-death"][0]["reason"] == "expired"
    assert message_count(channel, unique) == 1
    assert get_all(channel, unique) == [b"long"]
    for name in (unique, dead):
        channel.queue_delete(name)


def test_expired_messages_in_the_middle_leave_room_under_a_length_limit(conn, channel, unique):
    """The expired message no longer counts: a new one fits without pushing the long-lived head out."""
    dead = with_dead_letters(channel, unique, **{"x-max-length": 2})
    enqueue(conn, unique, [b"long"], properties=LONG)
    enqueue(conn, unique, [b"short"], properties=SHORT)
    wait_for_message_count(channel, dead, 1)
    enqueue(conn, unique, [b"new"])
    assert get_all(channel, unique) == [b"long", b"new"]
    assert get_all(channel, dead) == [b"short"]
    for name in (unique, dead):
        channel.queue_delete(name)


def test_a_priority_queue_expires_lower_priorities_under_higher_ones(conn, channel, unique):
    dead = with_dead_letters(channel, unique, **{"x-max-priority": 5})
    enqueue(conn, unique, [b"high"], properties=pika.BasicProperties(priority=5, expiration="60000"))
    enqueue(conn, unique, [b"low"], properties=pika.BasicProperties(priority=1, expiration=str(SHORT_MS)))
    wait_for_message_count(channel, dead, 1)
    assert get_all(channel, unique) == [b"high"]
    for name in (unique, dead):
        channel.queue_delete(name)


def test_a_message_that_expired_while_delivered_is_dead_lettered_when_requeued(conn, unique):
    channel = conn.channel()
    dead = with_dead_letters(channel, unique)
    channel.basic_qos(prefetch_count=1)
    enqueue(conn, unique, [b"m", b"marker"], properties=SHORT)  # the marker expires no sooner than m
    inbox = Inbox()
    tag, _ = consume(channel, unique, inbox)
    delivery = inbox.wait_for(conn, 1)[0]
    channel.basic_cancel(tag)
    wait_for_message_count(channel, dead, 1)  # the marker expired in the queue: so has m's TTL, while delivered
    channel.basic_nack(delivery.delivery_tag, requeue=True)
    wait_for_message_count(channel, dead, 2)
    assert message_count(channel, unique) == 0
    assert [message.body for message in [get(channel, dead), get(channel, dead)]] == [b"marker", b"m"]
    for name in (unique, dead):
        channel.queue_delete(name)


def test_consumers_still_get_what_has_not_expired(conn, unique):
    channel = conn.channel()
    dead = with_dead_letters(channel, unique)
    enqueue(conn, unique, [b"long"], properties=LONG)
    enqueue(conn, unique, [b"short"], properties=SHORT)
    enqueue(conn, unique, [b"plain"])
    wait_for_message_count(channel, dead, 1)
    _, inbox = consume(channel, unique, auto_ack=True)
    assert [delivery.body for delivery in inbox.wait_for(conn, 2)] == [b"long", b"plain"]
    for name in (unique, dead):
        channel.queue_delete(name)
