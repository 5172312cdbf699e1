"""Unacked deliveries go back to their queue, marked redelivered and in original order, however their channel ends."""

from __future__ import annotations

import socket
import struct

import pytest
from pamqp import commands

from tests.integration.helpers import (
    bodies,
    channel_error,
    connect,
    connection_error,
    consume,
    declare_queue,
    drain_with_flags,
    enqueue,
    open_channel,
    publish,
    wait_for_message_count,
)
from tests.integration.rawclient import RawClient
from tests.waiting import wait_for

# Every test: 6 messages; a consumer with prefetch 3 receives m-0..m-2, acks m-1, receives m-3 in its place, and
# then its channel goes away with m-0, m-2 and m-3 unacked.
EXPECTED_AFTER_REQUEUE = [(b"m-0", True), (b"m-2", True), (b"m-3", True), (b"m-4", False), (b"m-5", False)]


@pytest.fixture
def shared_queue(broker, unique):
    """A queue any connection may consume from, with m-0..m-5 in it; yields (observer channel, queue name)."""
    with open_channel(broker) as observer:
        queue = declare_queue(observer, unique)
        try:
            enqueue(observer.connection, queue, bodies("m", 6))
            yield observer, queue
        finally:
            observer.queue_delete(queue)


def hold_three_ack_one(conn, ch, queue: str) -> None:
    """Consume with prefetch 3, receive m-0..m-2, ack m-1 only and receive m-3 in its place."""
    ch.basic_qos(prefetch_count=3)
    _tag, inbox = consume(ch, queue)
    held = inbox.wait_for(conn, 3)
    assert [(d.delivery_tag, d.body) for d in held] == [(1, b"m-0"), (2, b"m-1"), (3, b"m-2")]
    ch.basic_ack(2)
    assert [(d.delivery_tag, d.body) for d in inbox.wait_for(conn, 4)[3:]] == [(4, b"m-3")]


def assert_requeued_in_order(observer, queue: str) -> None:
    wait_for_message_count(observer, queue, len(EXPECTED_AFTER_REQUEUE))
    assert drain_with_flags(observer, queue) == EXPECTED_AFTER_REQUEUE


def test_closing_the_channel_requeues_unacked_deliveries(broker, shared_queue):
    observer, queue = shared_queue
    with connect(broker) as conn:
        ch = conn.channel()
        hold_three_ack_one(conn, ch, queue)
        ch.close()
        assert_requeued_in_order(observer, queue)


def test_closing_the_connection_requeues_unacked_deliveries(broker, shared_queue):
    observer, queue = shared_queue
    with connect(broker) as conn:
        ch = conn.channel()
        hold_three_ack_one(conn, ch, queue)
    assert_requeued_in_order(observer, queue)


def test_a_channel_closed_by_an_error_requeues_unacked_deliveries(broker, shared_queue):
    observer, queue = shared_queue
    with connect(broker) as conn:
        ch = conn.channel()
        hold_three_ack_one(conn, ch, queue)
        assert channel_error(lambda: ch.basic_ack(2), ch) == (
            406, "PRECONDITION_FAILED - unknown delivery tag 2")
        assert_requeued_in_order(observer, queue)


def test_a_connection_closed_by_an_error_of_a_basic_get_requeues_unacked_deliveries(broker, shared_queue, unique):
    observer, queue = shared_queue
    stream = declare_queue(observer, f"{unique}-stream", durable=True, arguments={"x-queue-type": "stream"})
    try:
        with connect(broker) as conn:
            ch = conn.channel()
            hold_three_ack_one(conn, ch, queue)
            assert connection_error(lambda: ch.basic_get(stream), conn) == (
                540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{stream}' in vhost '/'")
        assert_requeued_in_order(observer, queue)
    finally:
        observer.queue_delete(stream)


def test_unacked_basic_get_messages_are_requeued_too(broker, shared_queue):
    observer, queue = shared_queue
    with connect(broker) as conn:
        ch = conn.channel()
        tags = [ch.basic_get(queue)[0].delivery_tag for _ in range(4)]
        assert tags == [1, 2, 3, 4]
        ch.basic_ack(2)
    assert_requeued_in_order(observer, queue)


def read_delivery_tag(client: RawClient) -> int:
    """Read one basic.deliver with its content header and body; return its delivery tag."""
    deliver = client.expect(commands.Basic.Deliver, channel=1)
    client.read_frame()  # content header
    client.read_frame()  # body (every test message fits in one frame)
    return deliver.delivery_tag


def raw_consumer_holding_three(broker, queue: str) -> RawClient:
    """A raw connection that consumed with prefetch 3, acked m-1 and holds m-0, m-2 and m-3."""
    client = RawClient.connect(broker)
    client.handshake()
    client.open_channel(1)
    client.send(1, commands.Basic.Qos(prefetch_count=3))
    client.expect(commands.Basic.QosOk, channel=1)
    client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="raw"))
    client.expect(commands.Basic.ConsumeOk, channel=1)
    assert [read_delivery_tag(client) for _ in range(3)] == [1, 2, 3]
    client.send(1, commands.Basic.Ack(delivery_tag=2))
    assert read_delivery_tag(client) == 4
    return client


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "reset"])
def test_a_dropped_tcp_connection_requeues_unacked_deliveries(broker, shared_queue, reset):
    observer, queue = shared_queue
    client = raw_consumer_holding_three(broker, queue)
    if reset:  # linger 0: close() sends RST instead of FIN
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    assert_requeued_in_order(observer, queue)



# Many deliveries: their requeue takes several turns of the broker's loop (broker.session.settlement)
MANY = 10_000


@pytest.fixture
def many_unacked(broker, unique):
    """A queue of MANY messages, all delivered to a raw connection's consumer and unacked; yields (observer channel,
    queue name, the consumer's connection)."""
    with open_channel(broker) as observer:
        queue = declare_queue(observer, unique)
        try:
            publish(observer, queue, bodies("m", MANY))
            with RawClient.connect(broker) as client:
                client.handshake()
                client.open_channel(1)
                client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="raw"))
                client.expect(commands.Basic.ConsumeOk, channel=1)
                assert [read_delivery_tag(client) for _ in range(MANY)][-1] == MANY
                yield observer, queue, client
        finally:
            observer.queue_delete(queue)


def counts(observer, queue: str) -> tuple[int, int]:
    """The queue's ready messages and consumers, as a passive declare reports them."""
    method = observer.queue_declare(queue, passive=True).method
    return method.message_count, method.consumer_count


def test_once_a_channel_is_closed_its_many_deliveries_are_back(many_unacked):
    # RabbitMQ's close-ok follows its queues' requeue of the channel's deliveries
    observer, queue, client = many_unacked
    client.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    client.expect(commands.Channel.CloseOk, channel=1)
    assert counts(observer, queue) == (MANY, 0)


def test_once_a_connection_is_closed_its_many_deliveries_are_back(many_unacked):
    observer, queue, client = many_unacked
    client.close_connection()
    assert counts(observer, queue) == (MANY, 0)


def test_a_consumer_of_a_dropped_connection_leaves_with_its_deliveries_back(many_unacked):
    # No close-ok to wait for: the consumer leaves its queue in the step that has its last delivery back, so
    # whoever sees it gone sees them all back
    observer, queue, client = many_unacked
    client.sock.shutdown(socket.SHUT_RDWR)
    seen = wait_for(lambda: counts(observer, queue), until=lambda seen: seen[1] == 0, step=0,
                    what="the consumer gone")
    assert seen == (MANY, 0)
