"""Transactions: publishes and acks held until tx.commit, dropped or undone by tx.rollback; driven with no
socket."""

from __future__ import annotations

from pamqp import commands as spec

from broker.session.settlement import PUBLISH_COST, SETTLE_SLICE
from broker.session.unacked import CHUNK
from tests.unit.broker.session.channel_host import (
    MANY, Host, bodies, consuming, consuming_many, methods, ready, settled,
)


def transactional(host: Host):
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"))
    assert methods(host.send(channel, spec.Tx.Select()), spec.Tx.SelectOk)
    return channel


def test_publishes_reach_the_queue_at_commit():
    host = Host()
    channel = transactional(host)
    host.publish(channel, "q", b"1", b"2")
    assert host.vhost.queues["q"].count_ready() == 0
    assert methods(host.send(channel, spec.Tx.Commit()), spec.Tx.CommitOk)
    assert host.vhost.queues["q"].count_ready() == 2


def test_a_rollback_drops_publishes_and_undoes_acks():
    host = Host()
    channel = transactional(host)
    host.publish(channel, "q", b"1", b"2")
    host.send(channel, spec.Tx.Commit())
    host.send(channel, spec.Basic.Get(queue="q"), spec.Basic.Get(queue="q"))
    host.send(channel, spec.Basic.Ack(delivery_tag=2, multiple=True))
    host.publish(channel, "q", b"3")
    assert methods(host.send(channel, spec.Tx.Rollback()), spec.Tx.RollbackOk)
    assert list(channel.unacked) == [1, 2]  # unacked again
    assert host.vhost.queues["q"].count_ready() == 0  # and "3" was never published
    host.send(channel, spec.Basic.Ack(delivery_tag=2, multiple=True), spec.Tx.Commit())
    assert not channel.unacked and host.vhost.queues["q"].acknowledged == 2


def test_a_rollback_of_many_acks_puts_every_delivery_back_in_tag_order():
    """Acks one by one, out of order, then a rollback: every delivery is unacked again, in tag order (put back
    once: once per ack, 5,000 acks held the event loop 6.5 s)."""
    host = Host()
    channel = transactional(host)
    host.publish(channel, "q", *[b"m%d" % number for number in range(300)])
    host.send(channel, spec.Tx.Commit())
    host.send(channel, *[spec.Basic.Get(queue="q") for _ in range(300)])
    tags = [*range(2, 301, 2), *range(1, 300, 2)]
    host.send(channel, *[spec.Basic.Ack(delivery_tag=tag) for tag in tags])
    assert not channel.unacked
    assert methods(host.send(channel, spec.Tx.Rollback()), spec.Tx.RollbackOk)
    assert list(channel.unacked) == list(range(1, 301))
    assert host.vhost.queues["q"].unacked_count == 300


def test_a_requeue_inside_a_transaction_happens_at_commit():
    host = Host()
    channel = transactional(host)
    host.publish(channel, "q", b"1")
    host.send(channel, spec.Tx.Commit(), spec.Basic.Get(queue="q"))
    host.send(channel, spec.Basic.Reject(delivery_tag=1, requeue=True))
    assert host.vhost.queues["q"].count_ready() == 0
    host.send(channel, spec.Tx.Commit())
    received = host.send(channel, spec.Basic.Get(queue="q", no_ack=True))
    assert bodies(received) == [b"1"] and methods(received, spec.Basic.GetOk)[0].redelivered


def test_commit_without_select_is_refused():
    host = Host()
    channel = host.open()
    host.send(channel, spec.Tx.Commit())
    assert host.failures == [(406, "PRECONDITION_FAILED - channel is not transactional")]


def many_in_a_transaction(host: Host):
    """A transactional channel holding MANY deliveries of queue "q" unacked (m0 ..), its consumer "c" cancelled."""
    channel = consuming_many(host, "q")
    host.send(channel, spec.Tx.Select(), spec.Basic.Cancel(consumer_tag="c"))
    return channel


async def test_a_multiple_ack_of_many_in_a_transaction_is_taken_then_settled_at_the_commit_over_loop_turns():
    host = Host()
    channel = consuming_many(host, "q")
    consumer = channel.consumers["c"]
    host.send(channel, spec.Tx.Select())
    received = host.send(channel, spec.Basic.Ack(delivery_tag=MANY - 2, multiple=True), spec.Basic.Qos())
    assert not methods(received, spec.Basic.QosOk)  # (taken a slice a loop turn: what follows waits)
    assert methods(await settled(host, channel), spec.Basic.QosOk)
    assert list(channel.unacked) == [MANY - 1, MANY] and host.vhost.queues["q"].acknowledged == 0
    assert consumer.unacked == MANY  # its prefetch slots stay taken until the commit, as in RabbitMQ
    received = host.send(channel, spec.Tx.Commit(), spec.Basic.Qos())
    assert not methods(received, spec.Tx.CommitOk)
    received += await settled(host, channel)
    assert [type(method) for method in received if not isinstance(method, tuple)] == [spec.Tx.CommitOk,
                                                                                      spec.Basic.QosOk]
    assert host.vhost.queues["q"].acknowledged == MANY - 2 and consumer.unacked == 2 and not host.failures


async def test_a_rollback_of_many_acks_puts_them_back_in_tag_order_before_the_deliveries_made_meanwhile():
    """Single acks here and there, then a multiple ack of most of the rest, all rolled back over several loop turns
    while the consumer receives three more messages: every delivery is unacked again, in tag order, and the three
    come after."""
    host = Host()
    channel = consuming_many(host, "q")
    queue = host.vhost.queues["q"]
    host.send(channel, spec.Tx.Select())
    host.send(channel, *[spec.Basic.Ack(delivery_tag=tag) for tag in (MANY - 5, 2 * SETTLE_SLICE, 7, 9)])
    host.send(channel, spec.Basic.Ack(delivery_tag=MANY - 10, multiple=True))
    await settled(host, channel)
    assert list(channel.unacked) == [*range(MANY - 9, MANY - 5), *range(MANY - 4, MANY + 1)]
    received = host.send(channel, spec.Tx.Rollback())
    assert not methods(received, spec.Tx.RollbackOk) and channel.settling
    publisher = host.open(2)
    delivered = methods(host.publish(publisher, "q", b"n0", b"n1", b"n2"), spec.Basic.Deliver)
    assert [method.delivery_tag for method in delivered] == [MANY + 1, MANY + 2, MANY + 3]
    assert methods(await settled(host, channel), spec.Tx.RollbackOk)
    assert list(channel.unacked) == list(range(1, MANY + 4))
    assert queue.unacked_count == MANY + 3 and queue.acknowledged == 0 and not host.failures
    host.send(channel, spec.Basic.Ack(delivery_tag=MANY + 3, multiple=True), spec.Tx.Commit())
    await settled(host, channel)
    assert not channel.unacked and queue.acknowledged == MANY + 3 and queue.unacked_count == 0


async def test_a_channel_closed_while_a_transaction_takes_many_acks_puts_every_delivery_back_in_order():
    host = Host()
    channel = many_in_a_transaction(host)
    host.send(channel, spec.Basic.Ack(delivery_tag=MANY - 1, multiple=True),
              spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await settled(host, channel)
    assert not channel.open and host.vhost.queues["q"].acknowledged == 0
    assert ready(host, "q") == [f"m{number}".encode() for number in range(MANY)]


async def test_a_nack_of_many_in_a_transaction_requeues_them_in_order_at_the_commit():
    host = Host()
    channel = many_in_a_transaction(host)
    host.send(channel, spec.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    await settled(host, channel)
    assert not channel.unacked and ready(host, "q") == []
    host.send(channel, spec.Tx.Commit())
    assert methods(await settled(host, channel), spec.Tx.CommitOk)
    assert ready(host, "q") == [f"m{number}".encode() for number in range(MANY)]


async def test_a_commit_of_many_publishes_routes_them_in_order_over_loop_turns_then_answers():
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"), spec.Tx.Select())
    count = 3 * SETTLE_SLICE // PUBLISH_COST + 1
    host.publish(channel, "q", *[b"m%d" % number for number in range(count)])
    received = host.send(channel, spec.Tx.Commit(), spec.Basic.Qos())
    assert not methods(received, spec.Tx.CommitOk) and 0 < host.vhost.queues["q"].count_ready() < count
    received += await settled(host, channel)
    assert [type(method) for method in received] == [spec.Tx.CommitOk, spec.Basic.QosOk]
    assert ready(host, "q") == [b"m%d" % number for number in range(count)]


async def test_a_rollback_rebuilds_only_the_chunks_of_unacked_deliveries_its_acks_fall_among():
    """Acks of tags in the second chunk of a channel's unacked deliveries leave the first as it is; an ack among the
    first chunk's tags rebuilds it, over loop turns."""
    host = Host()
    count = CHUNK + 10
    channel, delivered = consuming(host, "q", count)
    assert len(delivered) == count
    host.send(channel, spec.Tx.Select())
    first = channel.unacked.chunks[0]
    host.send(channel, spec.Basic.Ack(delivery_tag=CHUNK + 3), spec.Basic.Ack(delivery_tag=CHUNK + 5))
    assert methods(host.send(channel, spec.Tx.Rollback()), spec.Tx.RollbackOk)  # (in one loop turn)
    assert channel.unacked.chunks[0] is first and list(channel.unacked) == list(range(1, count + 1))
    host.send(channel, spec.Basic.Ack(delivery_tag=7), spec.Basic.Ack(delivery_tag=CHUNK + 8))
    assert not methods(host.send(channel, spec.Tx.Rollback()), spec.Tx.RollbackOk)
    assert methods(await settled(host, channel), spec.Tx.RollbackOk)
    assert list(channel.unacked) == list(range(1, count + 1)) and len(channel.unacked.chunks) == 2
    assert host.vhost.queues["q"].unacked_count == count and not host.failures
