"""Consumer acknowledgements: delivery tags, ack/nack/reject with multiple and requeue, requeue order, recover."""

from __future__ import annotations

import contextlib

import pytest

from tests.integration.helpers import (
    bodies,
    channel_error,
    connect,
    connection_error,
    consume,
    declare_queue,
    drain_with_flags,
    enqueue,
    get_all,
    message_count,
    stay_quiet,
    sync,
    wait_for_message_count,
)


def get_unacked(ch, queue: str, count: int) -> list[tuple[int, bytes]]:
    """basic.get `count` messages without acking them; return (delivery tag, body) pairs."""
    fetched = []
    for _ in range(count):
        method, _properties, body = ch.basic_get(queue, auto_ack=False)
        assert method is not None, "queue ran dry"
        fetched.append((method.delivery_tag, body))
    return fetched


@pytest.fixture
def queue_with(broker, unique):
    """Makes a channel and an exclusive queue holding `count` messages m-0, m-1, ... on a connection of its own."""
    with contextlib.ExitStack() as connections:
        def make(count: int):
            ch = connections.enter_context(connect(broker)).channel()
            queue = declare_queue(ch, unique, exclusive=True)
            enqueue(ch.connection, queue, bodies("m", count))
            return ch, queue

        yield make


def test_delivery_tags_start_at_one_on_every_channel(queue_with):
    ch, queue = queue_with(6)
    other = ch.connection.channel()
    assert [tag for tag, _ in get_unacked(ch, queue, 2)] == [1, 2]
    assert [tag for tag, _ in get_unacked(other, queue, 3)] == [1, 2, 3]
    assert [tag for tag, _ in get_unacked(ch, queue, 1)] == [3]


def test_ack_removes_exactly_the_acked_message(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 3)
    ch.basic_ack(2)
    ch.close()  # the other two were never acked: they come back
    check = ch.connection.channel()
    wait_for_message_count(check, queue, 2)
    assert drain_with_flags(check, queue) == [(b"m-0", True), (b"m-2", True)]


def test_multiple_ack_covers_every_tag_up_to_and_including(queue_with):
    ch, queue = queue_with(4)
    get_unacked(ch, queue, 4)
    ch.basic_ack(3, multiple=True)
    ch.close()
    check = ch.connection.channel()
    wait_for_message_count(check, queue, 1)
    assert drain_with_flags(check, queue) == [(b"m-3", True)]


def test_ack_of_tag_zero_with_multiple_acks_everything_outstanding(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 3)
    ch.basic_ack(0, multiple=True)
    sync(ch)
    ch.close()  # anything still unacked would be requeued now
    check = ch.connection.channel()
    stay_quiet(check.connection)
    assert message_count(check, queue) == 0


def test_ack_of_tag_zero_with_multiple_and_nothing_outstanding_is_accepted(queue_with):
    ch, _queue = queue_with(0)
    ch.basic_ack(0, multiple=True)
    sync(ch)
    assert ch.is_open


def test_reject_without_requeue_drops_the_message(queue_with):
    ch, queue = queue_with(2)
    get_unacked(ch, queue, 1)
    ch.basic_reject(1, requeue=False)
    assert drain_with_flags(ch, queue) == [(b"m-1", False)]


def test_nack_multiple_without_requeue_drops_them_all(queue_with):
    ch, queue = queue_with(4)
    get_unacked(ch, queue, 3)
    ch.basic_nack(2, multiple=True, requeue=False)
    assert drain_with_flags(ch, queue) == [(b"m-3", False)]  # m-2 is still unacked under tag 3
    ch.basic_ack(3)
    sync(ch)


def test_reject_with_requeue_puts_the_message_back_at_the_head(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 1)
    ch.basic_reject(1, requeue=True)
    assert drain_with_flags(ch, queue) == [(b"m-0", True), (b"m-1", False), (b"m-2", False)]


def test_requeued_messages_return_to_their_original_positions(queue_with):
    ch, queue = queue_with(7)
    fetched = get_unacked(ch, queue, 5)  # m-0..m-4 with tags 1..5; m-5 and m-6 were never delivered
    assert fetched == [(1, b"m-0"), (2, b"m-1"), (3, b"m-2"), (4, b"m-3"), (5, b"m-4")]
    ch.basic_nack(4, requeue=True)  # m-3
    ch.basic_reject(2, requeue=True)  # m-1
    ch.basic_nack(5, requeue=True)  # m-4
    assert drain_with_flags(ch, queue) == [
        (b"m-1", True), (b"m-3", True), (b"m-4", True), (b"m-5", False), (b"m-6", False)]
    ch.basic_ack(3)  # m-2 is still outstanding under its old tag
    ch.basic_nack(1, requeue=True)  # m-0
    assert drain_with_flags(ch, queue) == [(b"m-0", True)]


def test_nack_multiple_with_requeue_redelivers_in_original_order_to_a_consumer(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        enqueue(conn, queue, bodies("m", 5))
        ch.basic_qos(prefetch_count=3)
        _tag, inbox = consume(ch, queue)
        first = inbox.wait_for(conn, 3)[:3]
        assert [(d.delivery_tag, d.body, d.redelivered) for d in first] == [
            (1, b"m-0", False), (2, b"m-1", False), (3, b"m-2", False)]
        ch.basic_nack(3, multiple=True, requeue=True)
        again = inbox.wait_for(conn, 6)[3:6]
        assert [(d.delivery_tag, d.body, d.redelivered) for d in again] == [
            (4, b"m-0", True), (5, b"m-1", True), (6, b"m-2", True)]
        ch.basic_ack(6, multiple=True)
        rest = inbox.wait_for(conn, 8)[6:]
        assert [(d.delivery_tag, d.body, d.redelivered) for d in rest] == [(7, b"m-3", False), (8, b"m-4", False)]


@pytest.mark.parametrize("settle", [
    pytest.param(lambda ch, tag: ch.basic_ack(tag), id="ack"),
    pytest.param(lambda ch, tag: ch.basic_nack(tag, requeue=True), id="nack"),
    pytest.param(lambda ch, tag: ch.basic_reject(tag, requeue=False), id="reject"),
])
def test_settling_an_unknown_tag_closes_the_channel_406(queue_with, settle):
    ch, queue = queue_with(2)
    get_unacked(ch, queue, 2)
    assert channel_error(lambda: settle(ch, 5), ch) == (406, "PRECONDITION_FAILED - unknown delivery tag 5")


def test_double_ack_closes_the_channel_406(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 3)
    ch.basic_ack(2)
    assert channel_error(lambda: ch.basic_ack(2), ch) == (406, "PRECONDITION_FAILED - unknown delivery tag 2")


def test_multiple_ack_of_an_already_acked_tag_closes_the_channel_406(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 3)
    ch.basic_ack(2, multiple=True)
    assert channel_error(lambda: ch.basic_ack(1, multiple=True), ch) == (
        406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_ack_of_tag_zero_without_multiple_is_an_unknown_tag(queue_with):
    ch, queue = queue_with(1)
    get_unacked(ch, queue, 1)
    assert channel_error(lambda: ch.basic_ack(0), ch) == (406, "PRECONDITION_FAILED - unknown delivery tag 0")


def test_no_ack_deliveries_have_nothing_to_ack(queue_with):
    ch, queue = queue_with(1)
    method, _properties, _body = ch.basic_get(queue, auto_ack=True)
    assert channel_error(lambda: ch.basic_ack(method.delivery_tag), ch) == (
        406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_acking_another_channels_tag_is_an_unknown_tag(queue_with):
    ch, queue = queue_with(2)
    get_unacked(ch, queue, 1)
    other = ch.connection.channel()
    assert channel_error(lambda: other.basic_ack(1), other) == (
        406, "PRECONDITION_FAILED - unknown delivery tag 1")
    ch.basic_ack(1)  # still valid on the channel that received it
    sync(ch)
    assert get_all(ch, queue) == [b"m-1"]


def test_recover_with_requeue_redelivers_unacked_messages_with_new_tags(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        enqueue(conn, queue, bodies("m", 2))
        _tag, inbox = consume(ch, queue)
        inbox.wait_for(conn, 2)
        ch.basic_recover(requeue=True)
        deliveries = inbox.wait_for(conn, 4)
        assert [(d.delivery_tag, d.body, d.redelivered) for d in deliveries] == [
            (1, b"m-0", False), (2, b"m-1", False), (3, b"m-0", True), (4, b"m-1", True)]
        assert channel_error(lambda: ch.basic_ack(1), ch) == (
            406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_recover_requeues_unacked_gets_to_their_original_positions(queue_with):
    ch, queue = queue_with(3)
    get_unacked(ch, queue, 2)
    ch.basic_recover(requeue=True)
    assert drain_with_flags(ch, queue) == [(b"m-0", True), (b"m-1", True), (b"m-2", False)]


def test_recover_without_requeue_is_not_implemented_and_closes_the_connection_540(queue_with):
    ch, queue = queue_with(1)
    get_unacked(ch, queue, 1)
    assert connection_error(lambda: ch.basic_recover(requeue=False), ch.connection) == (
        540, "NOT_IMPLEMENTED - requeue=false")
