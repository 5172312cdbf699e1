"""Priority queues (x-max-priority) as RabbitMQ's: the highest priority first, first in first out within a
priority, priorities above the maximum capped, no priority counted as 0, requeues back to their place."""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import (
    channel_error, connect, declare_queue, drain_with_flags, get_all, open_channel, wait_until,
)


def publish_with_priorities(conn, queue: str, messages: list[tuple[str, int | None]]) -> None:
    """Publish (body, priority) pairs in order (None: no priority property) and wait until all are enqueued."""
    publisher = conn.channel()
    publisher.confirm_delivery()
    for body, priority in messages:
        publisher.basic_publish("", queue, body, pika.BasicProperties(priority=priority))
    publisher.close()


def priority_queue(conn, name: str, max_priority: int = 10, **arguments) -> str:
    return declare_queue(conn.channel(), name, arguments={"x-max-priority": max_priority, **arguments})


def test_higher_priorities_are_delivered_first(conn, unique):
    queue = priority_queue(conn, unique)
    publish_with_priorities(conn, queue, [("p1", 1), ("p9", 9), ("p5", 5), ("none", None)])
    assert get_all(conn.channel(), queue) == [b"p9", b"p5", b"p1", b"none"]


def test_messages_of_one_priority_keep_their_order(conn, unique):
    queue = priority_queue(conn, unique)
    publish_with_priorities(conn, queue, [("a1", 3), ("b1", 7), ("a2", 3), ("b2", 7), ("a3", 3)])
    assert get_all(conn.channel(), queue) == [b"b1", b"b2", b"a1", b"a2", b"a3"]


def test_a_priority_above_the_maximum_counts_as_the_maximum(conn, unique):
    queue = priority_queue(conn, unique, max_priority=5)
    publish_with_priorities(conn, queue, [("five", 5), ("nine", 9), ("three", 3), ("two-hundred", 200)])
    assert get_all(conn.channel(), queue) == [b"five", b"nine", b"two-hundred", b"three"]


def test_a_queue_without_max_priority_ignores_the_property(conn, unique):
    queue = declare_queue(conn.channel(), unique)
    publish_with_priorities(conn, queue, [("p1", 1), ("p9", 9), ("p5", 5)])
    assert get_all(conn.channel(), queue) == [b"p1", b"p9", b"p5"]


def test_requeued_messages_go_back_to_their_place_within_their_priority(conn, unique):
    queue = priority_queue(conn, unique)
    publish_with_priorities(conn, queue, [("low", 1), ("a", 5), ("b", 5), ("c", 5)])
    ch = conn.channel()
    first, _, body_a = ch.basic_get(queue)
    second, _, body_b = ch.basic_get(queue)
    assert (body_a, body_b) == (b"a", b"b")
    ch.basic_nack(second.delivery_tag, requeue=True)
    ch.basic_nack(first.delivery_tag, requeue=True)
    assert drain_with_flags(ch, queue) == [(b"a", True), (b"b", True), (b"c", False), (b"low", False)]


def test_a_consumer_gets_the_backlog_in_priority_order(conn, unique):
    queue = priority_queue(conn, unique)
    publish_with_priorities(conn, queue, [(f"m{i}", i % 4) for i in range(12)])
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    received: list[bytes] = []
    ch.basic_consume(queue, lambda _ch, _method, _props, body: received.append(body), auto_ack=True)
    wait_until(conn, lambda: len(received) == 12)
    assert received == [f"m{i}".encode() for priority in (3, 2, 1, 0) for i in range(12) if i % 4 == priority]


def test_drop_head_drops_the_head_the_next_message_to_be_delivered(conn, unique):
    """RabbitMQ 3.10 drops the oldest message of the highest priority (checked on the reference)."""
    queue = priority_queue(conn, unique, **{"x-max-length": 2})
    publish_with_priorities(conn, queue, [("high", 9), ("low", 1), ("middle", 5)])
    assert get_all(conn.channel(), queue) == [b"middle", b"low"]


def test_expired_messages_leave_a_priority_queue(conn, unique):
    queue = priority_queue(conn, unique, **{"x-message-ttl": 1})
    publish_with_priorities(conn, queue, [("old-high", 9), ("old-low", 1)])
    ch = conn.channel()
    wait_until(conn, lambda: ch.queue_declare(queue, passive=True).method.message_count == 0)
    assert get_all(ch, queue) == []


def test_priorities_survive_a_restart(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        declare_queue(conn.channel(), "durable-priorities", durable=True, arguments={"x-max-priority": 10})
        publisher = conn.channel()
        publisher.confirm_delivery()
        for body, priority in [("p1", 1), ("p9", 9), ("p5", 5), ("p9-again", 9)]:
            publisher.basic_publish("", "durable-priorities", body, pika.BasicProperties(priority=priority,
                                                                                          delivery_mode=2))
    broker.restart()
    with open_channel(broker) as ch:
        assert get_all(ch, "durable-priorities") == [b"p9", b"p9-again", b"p5", b"p1"]


@pytest.mark.parametrize("max_priority", [256, -1])
def test_max_priority_out_of_range_is_refused(channel, unique, max_priority):
    code, text = channel_error(lambda: channel.queue_declare(unique, arguments={"x-max-priority": max_priority}))
    assert code == 406 and f"invalid arg 'x-max-priority' for queue '{unique}'" in text, text

