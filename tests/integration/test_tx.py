"""Transactions: publishes and acks take effect on tx.commit and are dropped by tx.rollback."""

from __future__ import annotations

import pika.exceptions
import pytest

from tests.integration.helpers import (
    bodies,
    connect,
    declare_queue,
    enqueue,
    get_all,
    message_count,
    open_channel,
    prefetch_one_consumer,
    publish,
    stay_quiet,
    sync,
    wait_for_message_count,
    wait_until,
)


@pytest.fixture
def tx_and_observer(broker, unique):
    """(transactional channel, observer channel, queue): the two channels are on separate connections."""
    with connect(broker) as tx_conn, open_channel(broker) as observer:
        queue = declare_queue(observer, unique)
        try:
            tx = tx_conn.channel()
            tx.tx_select()
            yield tx, observer, queue
        finally:
            observer.queue_delete(queue)


def settled_message_count(observer, queue: str) -> int:
    """The queue's ready count after a moment's wait, to show that nothing more is on its way."""
    stay_quiet(observer.connection)
    return message_count(observer, queue)


def test_publishes_are_invisible_until_commit(tx_and_observer):
    tx, observer, queue = tx_and_observer
    publish(tx, queue, bodies("m", 3))
    sync(tx)
    assert settled_message_count(observer, queue) == 0
    tx.tx_commit()
    assert get_all(observer, queue) == bodies("m", 3)


def test_rollback_drops_uncommitted_publishes(tx_and_observer):
    tx, observer, queue = tx_and_observer
    publish(tx, queue, [b"dropped"])
    tx.tx_rollback()
    tx.tx_commit()  # nothing left to commit
    assert settled_message_count(observer, queue) == 0


def test_the_channel_stays_transactional_after_commit(tx_and_observer):
    tx, observer, queue = tx_and_observer
    publish(tx, queue, [b"first"])
    tx.tx_commit()
    publish(tx, queue, [b"second"])
    sync(tx)
    assert settled_message_count(observer, queue) == 1
    tx.tx_commit()
    assert get_all(observer, queue) == [b"first", b"second"]


def test_acks_take_effect_on_commit(tx_and_observer):
    tx, observer, queue = tx_and_observer
    enqueue(observer.connection, queue, bodies("m", 3))
    tags = [tx.basic_get(queue)[0].delivery_tag for _ in range(2)]
    tx.basic_ack(tags[0])
    tx.tx_commit()
    tx.basic_ack(tags[1])  # never committed
    tx.close()
    wait_for_message_count(observer, queue, 2)
    assert get_all(observer, queue) == [b"m-1", b"m-2"]


def test_rolled_back_acks_leave_the_messages_unacked(tx_and_observer):
    tx, observer, queue = tx_and_observer
    enqueue(observer.connection, queue, bodies("m", 2))
    tx.basic_get(queue)
    tx.basic_get(queue)
    tx.basic_ack(2, multiple=True)
    tx.tx_rollback()
    tx.basic_ack(1)  # tag 1 is still outstanding after the rollback
    tx.tx_commit()
    tx.close()
    wait_for_message_count(observer, queue, 1)
    method, _properties, body = observer.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"m-1", True)


def test_reject_with_requeue_waits_for_commit(tx_and_observer):
    tx, observer, queue = tx_and_observer
    enqueue(observer.connection, queue, [b"only"])
    tag = tx.basic_get(queue)[0].delivery_tag
    tx.basic_reject(tag, requeue=True)
    sync(tx)
    assert settled_message_count(observer, queue) == 0
    tx.tx_commit()
    wait_for_message_count(observer, queue, 1)
    method, _properties, body = observer.basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"only", True)


@pytest.mark.parametrize("finish", ["tx_commit", "tx_rollback"])
def test_commit_or_rollback_without_select_is_refused_406(broker, finish):
    with open_channel(broker) as ch:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            getattr(ch, finish)()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - channel is not transactional")


def test_an_ack_in_a_transaction_frees_prefetch_only_at_commit(broker, unique):
    with connect(broker) as conn:
        conn.channel().queue_declare(unique, exclusive=True)
        ch, got, publisher = prefetch_one_consumer(conn, unique)
        publisher.basic_publish("", unique, b"m1")
        wait_until(conn, lambda: got)
        ch.tx_select()
        ch.basic_ack(got[0][0])
        publisher.basic_publish("", unique, b"m2")
        stay_quiet(conn)
        assert [body for _, body in got] == [b"m1"]  # the ack is not committed: the window is still full
        ch.tx_commit()
        wait_until(conn, lambda: len(got) == 2)
        assert got[1] == (2, b"m2")
