"""Publisher confirms: acks in publish order, coalesced into `multiple` per read (as rabbit_channel's
coalesce_and_send), a nack for a publish a queue refuses, returns before their confirm; driven with no socket."""

from __future__ import annotations

from pamqp import commands as spec

from tests.unit.broker.session.channel_host import Host, methods


def confirming(host: Host):
    channel = host.open()
    assert methods(host.send(channel, spec.Confirm.Select()), spec.Confirm.SelectOk)
    return channel


def test_a_reads_publishes_are_confirmed_with_one_multiple_ack():
    host = Host()
    channel = confirming(host)
    host.send(channel, spec.Queue.Declare(queue="q"))
    [ack] = methods(host.publish(channel, "q", b"1", b"2", b"3"), spec.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (3, True)
    [ack] = methods(host.publish(channel, "q", b"4"), spec.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (4, False)


def test_an_unroutable_mandatory_publish_is_returned_then_confirmed():
    host = Host()
    channel = confirming(host)
    received = host.publish(channel, "nowhere", b"lost", mandatory=True)
    assert [type(item).__name__ for item in received] == ["Return", "tuple", "Ack"]
    assert received[0].reply_code == 312 and received[0].reply_text == "NO_ROUTE"


def test_a_publish_a_full_queue_rejects_is_nacked_and_the_others_acked_in_order():
    host = Host()
    channel = confirming(host)
    host.send(channel, spec.Queue.Declare(queue="q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"}))
    received = host.publish(channel, "q", b"kept", b"refused", b"refused too")
    assert [(type(item).__name__, item.delivery_tag, item.multiple) for item in received] == [
        ("Ack", 1, False), ("Nack", 2, False), ("Nack", 3, False)]  # RabbitMQ coalesces no nack past an ack


def test_confirm_select_on_a_transactional_channel_is_refused():
    host = Host()
    channel = host.open()
    host.send(channel, spec.Tx.Select(), spec.Confirm.Select())
    assert host.failures == [(406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")]
