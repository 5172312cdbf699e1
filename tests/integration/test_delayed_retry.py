"""Delayed retry (RabbitMQ 4.3's x-delayed-retry-type/min/max and policy keys, on quorum queues there; on every
queue type in Warren, and per consumer): a returned message waits min x (failed returns, at least 1) ms, at most
max, before it is ready again, so a poison message does not spin at the head of its queue. The reference RabbitMQ
is 3.10, which has no delayed retry: these tests run on Warren only."""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    Inbox, beyond_rabbitmq, channel_error, confirmed_barrier, connect, consume, declare_queue, enqueue, get,
    message_count, reply_text, wait_until,
)

pytestmark = beyond_rabbitmq

DELAY_MS = 500  # long enough that the bounds below hold on a busy machine


def retrying(kind: str = "all", low: int = DELAY_MS, high: int | None = None) -> dict:
    arguments = {"x-delayed-retry-type": kind, "x-delayed-retry-min": low}
    if high is not None:
        arguments["x-delayed-retry-max"] = high
    return arguments


def returned_after(conn, channel, queue: str, settle) -> float:
    """Take the head message, return it with settle(channel, delivery tag) and say how many seconds passed until
    it was ready again."""
    method, _, _ = channel.basic_get(queue)
    returned = time.monotonic()
    settle(channel, method.delivery_tag)
    wait_until(conn, lambda: message_count(channel, queue) == 1)
    return time.monotonic() - returned


def nack(channel, tag):
    channel.basic_nack(tag, requeue=True)


def reject(channel, tag):
    channel.basic_reject(tag, requeue=True)


def test_a_nacked_message_waits_while_the_next_ones_are_delivered(conn, channel, unique):
    declare_queue(channel, unique, arguments=retrying())
    enqueue(conn, unique, [b"poison", b"next"])
    method, _, body = channel.basic_get(unique)
    assert body == b"poison"
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert get(channel, unique).body == b"next"
    assert get(channel, unique) is None  # the poison message is not ready yet
    wait_until(conn, lambda: message_count(channel, unique) == 1)
    message = get(channel, unique)
    assert (message.body, message.redelivered) == (b"poison", True)
    channel.queue_delete(unique)


def test_the_delay_grows_with_failed_returns_up_to_the_maximum(conn, channel, unique):
    declare_queue(channel, unique, arguments=retrying("all", DELAY_MS, 2 * DELAY_MS))
    enqueue(conn, unique, [b"m"])
    waits = [returned_after(conn, channel, unique, reject) for _ in range(3)]
    assert DELAY_MS / 1000 <= waits[0] < 2 * DELAY_MS / 1000
    assert 2 * DELAY_MS / 1000 <= waits[1]
    assert 2 * DELAY_MS / 1000 <= waits[2] < 3 * DELAY_MS / 1000  # capped at the maximum
    channel.queue_delete(unique)


@pytest.mark.parametrize("kind, delayed", [("failed", "reject"), ("returned", "nack")])
def test_the_type_says_which_returns_wait(conn, channel, unique, kind, delayed):
    declare_queue(channel, unique, arguments=retrying(kind, 60_000))
    enqueue(conn, unique, [b"m"])
    immediate = nack if delayed == "reject" else reject
    assert returned_after(conn, channel, unique, immediate) < 1  # not delayed: ready again at once
    method, _, _ = channel.basic_get(unique)
    (reject if delayed == "reject" else nack)(channel, method.delivery_tag)
    assert message_count(channel, unique) == 0  # waiting a minute
    channel.queue_delete(unique)


def test_a_policy_sets_delayed_retry(broker, conn, channel, unique):
    management.set_policy(broker, "/", unique, f"^{unique}$",
                          {"delayed-retry-type": "all", "delayed-retry-min": 60_000}, apply_to="queues")
    try:
        declare_queue(channel, unique)
        enqueue(conn, unique, [b"m"])
        method, _, _ = channel.basic_get(unique)
        channel.basic_nack(method.delivery_tag, requeue=True)
        shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
        assert (shown["messages_delayed"], shown["messages"], shown["messages_ready"]) == (1, 1, 0)
        assert shown["delayed_retry"] == "all (min: 60000ms, max: 60000ms)"
    finally:
        management.clear_policy(broker, "/", unique)
        channel.queue_delete(unique)


def test_a_consumer_can_set_its_own_delayed_retry(conn, unique):
    """The consume arguments x-delayed-retry-type/min/max override the queue's for the returns of that consumer."""
    channel = conn.channel()
    declare_queue(channel, unique)
    enqueue(conn, unique, [b"m"])
    inbox = Inbox()
    consume(channel, unique, inbox, arguments=retrying())
    returned = time.monotonic()
    channel.basic_nack(inbox.wait_for(conn, 1)[0].delivery_tag, requeue=True)
    redelivery = inbox.wait_for(conn, 2)[1]
    assert (redelivery.body, redelivery.redelivered) == (b"m", True)
    assert time.monotonic() - returned >= DELAY_MS / 1000
    channel.queue_delete(unique)


def test_a_bad_consumer_setting_is_refused(channel, unique):
    declare_queue(channel, unique)
    assert channel_error(lambda: channel.basic_consume(unique, print, arguments={"x-delayed-retry-type": "all"})) == (
        406, reply_text(f"PRECONDITION_FAILED - invalid arg 'x-delayed-retry-type' for queue '{unique}' in vhost "
                        "'/': \"x-delayed-retry-min is required when x-delayed-retry-type is all\""))


def test_a_purge_drops_waiting_messages_too(conn, channel, unique):
    declare_queue(channel, unique, arguments=retrying(low=60_000))
    enqueue(conn, unique, [b"waiting", b"ready"])
    method, _, _ = channel.basic_get(unique)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert channel.queue_purge(unique).method.message_count == 2
    channel.queue_delete(unique)


def test_a_waiting_persistent_message_survives_a_restart_ready_at_once(own_broker, unique):
    """A message waiting out its delay stays on disk; after a restart (here a kill -9) it is ready at once,
    flagged redelivered."""
    broker = own_broker()
    with connect(broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True, arguments=retrying(low=60_000))
        enqueue(conn, unique, [b"m"], properties=pika.BasicProperties(delivery_mode=2))
        method, _, _ = channel.basic_get(unique)
        channel.basic_nack(method.delivery_tag, requeue=True)
        assert message_count(channel, unique) == 0
        confirmed_barrier(conn)  # the nack is on disk (a kill -9 may undo the last milliseconds of acks)
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        message = get(conn.channel(), unique)
    assert (message.body, message.redelivered) == (b"m", True)
