"""x-queue-type: quorum on one node: a durable queue with quorum queues' observable behaviour (RabbitMQ's
declaration checks, every message kept on disk, returns counted in headers, a default delivery limit of 20), without
replication. Each RabbitMQ behaviour was checked against the reference RabbitMQ; those RabbitMQ 4 changed are marked."""

from __future__ import annotations

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    Inbox, beyond_rabbitmq, channel_error, connect, connection_error, consume, declare_queue, enqueue, get, rabbitmq4,
    reply_text, wait_for_message_count,
)

QUORUM = {"x-queue-type": "quorum"}


@pytest.mark.parametrize("flags, refused", [
    ({"durable": False}, "non-durable"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": True, "auto_delete": True}, "auto-delete"),
    ({"durable": False, "exclusive": True, "auto_delete": True}, "auto-delete"),  # checked first
])
def test_a_quorum_queue_is_durable_and_neither_exclusive_nor_auto_delete(channel, unique, flags, refused):
    assert channel_error(lambda: channel.queue_declare(unique, arguments=QUORUM, **flags)) == (
        406, reply_text(f"PRECONDITION_FAILED - invalid property '{refused}' for queue '{unique}' in vhost '/'"))


def test_a_quorum_queue_cannot_be_server_named(channel):
    assert channel_error(lambda: channel.queue_declare("", durable=True, arguments=QUORUM)) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_quorum_queue")


def test_the_management_api_shows_its_type(broker, channel, unique):
    declare_queue(channel, unique, durable=True, arguments=QUORUM)
    shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
    assert (shown["type"], shown["durable"], shown["arguments"]) == ("quorum", True, QUORUM)
    channel.queue_delete(unique)


def test_consumers_and_basic_get_work_as_usual(conn, unique):
    channel = conn.channel()
    declare_queue(channel, unique, durable=True, arguments=QUORUM)
    enqueue(conn, unique, [b"first", b"second"])
    assert get(channel, unique).body == b"first"
    _, inbox = consume(channel, unique, auto_ack=True)
    assert [delivery.body for delivery in inbox.wait_for(conn, 1)] == [b"second"]
    channel.queue_delete(unique)


def test_consuming_under_a_global_prefetch_closes_the_connection(broker, unique):
    with connect(broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True, arguments=QUORUM)
        channel.basic_qos(prefetch_count=5, global_qos=True)
        assert connection_error(lambda: channel.basic_consume(unique, print), conn) == (
            540, f"NOT_IMPLEMENTED - queue '{unique}' in vhost '/' does not support global qos")
    with connect(broker) as conn:
        conn.channel().queue_delete(unique)


@rabbitmq4
def test_returns_show_in_acquired_and_delivery_count_headers(conn, unique):
    """RabbitMQ 4.3: x-acquired-count counts every return, x-delivery-count the failed ones (basic.reject), and a
    first delivery carries neither."""
    channel = conn.channel()
    declare_queue(channel, unique, durable=True, arguments=QUORUM)
    enqueue(conn, unique, [b"m"])
    seen = []
    for settle in ("reject", "nack", "reject", None):
        method, properties, _ = channel.basic_get(unique)
        headers = properties.headers or {}
        seen.append((method.redelivered, headers.get("x-acquired-count"), headers.get("x-delivery-count")))
        if settle == "reject":
            channel.basic_reject(method.delivery_tag, requeue=True)
        elif settle == "nack":
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
    assert seen == [(False, None, None), (True, 1, 1), (True, 2, 1), (True, 3, 2)]
    channel.queue_delete(unique)


@rabbitmq4
def test_the_default_delivery_limit_is_20(conn, unique):
    """RabbitMQ 4.0 gave quorum queues a delivery limit of 20: the 21st failed return dead-letters the message."""
    channel = conn.channel()
    channel.exchange_declare(f"{unique}-dlx", "fanout")
    declare_queue(channel, f"{unique}-dead")
    channel.queue_bind(f"{unique}-dead", f"{unique}-dlx")
    declare_queue(channel, unique, durable=True, arguments={**QUORUM, "x-dead-letter-exchange": f"{unique}-dlx"})
    enqueue(conn, unique, [b"poison"])
    for _ in range(21):
        method, _, _ = channel.basic_get(unique)
        channel.basic_reject(method.delivery_tag, requeue=True)
    wait_for_message_count(channel, f"{unique}-dead", 1)  # RabbitMQ dead-letters in the background
    dead = get(channel, f"{unique}-dead")
    assert dead.body == b"poison"
    assert dead.properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert get(channel, unique) is None
    for name in (unique, f"{unique}-dead"):
        channel.queue_delete(name)
    channel.exchange_delete(f"{unique}-dlx")


@beyond_rabbitmq
def test_transient_messages_survive_a_restart(own_broker, unique):
    """A quorum queue keeps every message on disk whatever its delivery mode (here across a kill -9 once
    confirmed); its properties are delivered as published."""
    broker = own_broker()
    with connect(broker) as conn:
        declare_queue(conn.channel(), unique, durable=True, arguments=QUORUM)
        enqueue(conn, unique, [b"transient"], properties=pika.BasicProperties(delivery_mode=1))
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        message = get(conn.channel(), unique)
    assert (message.body, message.properties.delivery_mode) == (b"transient", 1)


@beyond_rabbitmq
def test_a_transient_message_routed_to_a_quorum_and_a_classic_queue_is_kept_only_by_the_quorum_one(
        own_broker, unique):
    broker = own_broker()
    with connect(broker) as conn:
        channel = conn.channel()
        channel.exchange_declare(unique, "fanout", durable=True)
        for name, arguments in ((f"{unique}-quorum", QUORUM), (f"{unique}-classic", {})):
            declare_queue(channel, name, durable=True, arguments=arguments)
            channel.queue_bind(name, unique)
        confirmed = conn.channel()
        confirmed.confirm_delivery()
        confirmed.basic_publish(unique, "", b"both")
        inbox = Inbox()
        consume(channel, f"{unique}-classic", inbox, auto_ack=True)  # the classic queue's copy is delivered
        inbox.wait_for(conn, 1)
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        channel = conn.channel()
        assert get(channel, f"{unique}-quorum").body == b"both"
        assert get(channel, f"{unique}-classic") is None
