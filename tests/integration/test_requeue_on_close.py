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
    consume,
    declare_queue,
    drain_with_flags,
    enqueue,
    open_channel,
    wait_for_message_count,
)
from tests.integration.rawclient import RawClient

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
