"""Transactions: publishes and acks held until tx.commit, dropped or undone by tx.rollback; driven with no
socket."""

from __future__ import annotations

from pamqp import commands as spec

from tests.unit.broker.session.channel_host import Host, bodies, methods


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
