"""basic.consume and basic.cancel: consumer tags, exclusivity, no-ack, nowait, arguments, cancel notifications."""

from __future__ import annotations

import re
import socket

import amqp
import amqp.exceptions
import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.helpers import (
    QUIET_PERIOD,
    Inbox,
    amqp_connection,
    bodies,
    connect,
    consume,
    declare_queue,
    enqueue,
    message_count,
    open_channel,
    publish,
    stay_quiet,
    sync,
    wait_until,
)
from tests.integration.rawclient import RawClient

SERVER_TAG = re.compile(r"amq\.ctag-[A-Za-z0-9_-]{22}")


def drain_amqp(conn, condition, timeout: float = 5.0) -> None:
    """Dispatch py-amqp events until `condition()` holds."""
    while not condition():
        try:
            conn.drain_events(timeout=timeout)
        except socket.timeout:
            raise AssertionError(f"condition not met within {timeout}s") from None


def test_empty_consumer_tag_gets_a_server_generated_one(broker, unique):
    with amqp_connection(broker) as conn:
        ch = conn.channel()
        queue = ch.queue_declare(unique, exclusive=True, auto_delete=False).queue
        received = []
        first = ch.basic_consume(queue, consumer_tag="", callback=received.append, no_ack=True)
        second = ch.basic_consume(queue, consumer_tag="", callback=received.append, no_ack=True)
        assert SERVER_TAG.fullmatch(first), first
        assert SERVER_TAG.fullmatch(second), second
        assert first != second
        ch.basic_publish(amqp.Message(b"hello"), exchange="", routing_key=queue)
        drain_amqp(conn, lambda: received)
        assert received[0].body == b"hello"
        assert received[0].delivery_info["consumer_tag"] in (first, second)


def test_client_chosen_tag_is_echoed_in_consume_ok_and_deliveries(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        tag, inbox = consume(ch, queue, auto_ack=True, consumer_tag=f"{unique}-mine")
        assert tag == f"{unique}-mine"
        publish(ch, queue, bodies("m", 2))
        deliveries = inbox.wait_for(conn, 2)
        assert [(d.consumer_tag, d.delivery_tag, d.redelivered, d.body) for d in deliveries] == [
            (tag, 1, False, b"m-0"), (tag, 2, False, b"m-1")]


def test_reusing_a_consumer_tag_on_the_channel_closes_the_connection_530(broker, unique):
    with amqp_connection(broker) as conn:
        ch = conn.channel()
        queue = ch.queue_declare(unique, exclusive=True, auto_delete=False).queue
        ch.basic_consume(queue, consumer_tag="dup")
        with pytest.raises(amqp.exceptions.NotAllowed) as closed:
            ch.basic_consume(queue, consumer_tag="dup")
        assert not conn.connected  # a hard error: the whole connection is closed
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'")


def test_same_tag_on_another_channel_is_allowed(broker, unique):
    with connect(broker) as conn:
        first, second = conn.channel(), conn.channel()
        queue = declare_queue(first, unique, exclusive=True)
        assert first.basic_consume(queue, Inbox(), consumer_tag="shared") == "shared"
        assert second.basic_consume(queue, Inbox(), consumer_tag="shared") == "shared"


def test_second_consumer_on_an_exclusively_consumed_queue_is_refused_403(broker, unique):
    with connect(broker) as conn:
        owner = conn.channel()
        queue = declare_queue(owner, unique, exclusive=True)
        owner.basic_consume(queue, Inbox(), exclusive=True)
        other = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            other.basic_consume(queue, Inbox())
        assert (closed.value.reply_code, closed.value.reply_text) == (
            403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")
        assert owner.is_open  # only the offending channel is closed


def test_exclusive_consume_on_a_queue_that_has_consumers_is_refused_403(broker, unique):
    with connect(broker) as conn:
        owner = conn.channel()
        queue = declare_queue(owner, unique, exclusive=True)
        owner.basic_consume(queue, Inbox())
        other = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            other.basic_consume(queue, Inbox(), exclusive=True)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            403, f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use")


def test_exclusive_consumer_gone_lets_others_consume(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        tag = ch.basic_consume(queue, Inbox(), exclusive=True)
        ch.basic_cancel(tag)
        tag, inbox = consume(ch, queue, auto_ack=True)
        publish(ch, queue, [b"after"])
        assert inbox.wait_for(conn, 1)[0].body == b"after"


def test_no_ack_consumer_messages_leave_the_queue_on_delivery(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        tag, inbox = consume(ch, queue, auto_ack=True)
        publish(ch, queue, bodies("m", 3))
        inbox.wait_for(conn, 3)
        ch.basic_cancel(tag)
        # Nothing unacked comes back: cancelling a no-ack consumer (and closing its channel) requeues nothing.
        ch.close()
        check = conn.channel()
        stay_quiet(conn)  # time for a (wrong) requeue to show
        assert message_count(check, queue) == 0
        assert inbox.bodies == bodies("m", 3)


def test_nowait_consume_and_cancel(broker, unique):
    with amqp_connection(broker) as conn:
        ch = conn.channel()
        queue = ch.queue_declare(unique, exclusive=True, auto_delete=False).queue
        received = []
        ch.basic_consume(queue, consumer_tag="quiet", nowait=True, no_ack=True, callback=received.append)
        ch.basic_publish(amqp.Message(b"one"), exchange="", routing_key=queue)
        drain_amqp(conn, lambda: received)
        assert [(m.body, m.delivery_info["consumer_tag"]) for m in received] == [(b"one", "quiet")]
        ch.basic_cancel("quiet", nowait=True)
        ch.basic_publish(amqp.Message(b"two"), exchange="", routing_key=queue)
        with pytest.raises(socket.timeout):
            conn.drain_events(timeout=QUIET_PERIOD)
        assert [m.body for m in received] == [b"one"]
        assert ch.basic_get(queue, no_ack=True).body == b"two"


def test_consumer_priority_argument_prefers_the_higher_priority_consumer(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        inbox = Inbox()
        low, _ = consume(ch, queue, inbox, auto_ack=True, arguments={"x-priority": 1})
        high, _ = consume(ch, queue, inbox, auto_ack=True, arguments={"x-priority": 10})
        publish(ch, queue, bodies("m", 5))
        inbox.wait_for(conn, 5)
        assert [d.consumer_tag for d in inbox.deliveries] == [high] * 5


def test_consumer_priority_must_be_an_integer(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        consumer_channel = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            consumer_channel.basic_consume(queue, Inbox(), arguments={"x-priority": "high"})
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue "
                 f"'{queue}' in vhost '/': \"expected integer, got longstr\"")


def test_cancel_stops_deliveries_and_keeps_unacked_ones_ackable(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        tag, inbox = consume(ch, queue)
        publish(ch, queue, [b"before"])
        inbox.wait_for(conn, 1)
        ch.basic_cancel(tag)
        enqueue(conn, queue, [b"after"])
        stay_quiet(conn)
        assert inbox.bodies == [b"before"]
        ch.basic_ack(inbox.deliveries[0].delivery_tag)
        sync(ch)  # the ack of a cancelled consumer's delivery is valid: the channel stays open
        assert message_count(ch, queue) == 1


def test_cancel_of_an_unknown_tag_is_answered_with_cancel_ok(broker, unique):
    with amqp_connection(broker) as conn:
        ch = conn.channel()
        ch.basic_cancel(f"{unique}-never-consumed")  # waits for cancel-ok
        assert ch.is_open
        assert ch.queue_declare(unique, exclusive=True, auto_delete=False).queue == unique


def test_deleting_the_queue_sends_basic_cancel_to_its_consumers(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique)
        cancelled = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method))
        tag, _inbox = consume(ch, queue)
        with open_channel(broker) as other:
            other.queue_delete(queue)
        wait_until(conn, lambda: cancelled)
        assert isinstance(cancelled[0], pika.spec.Basic.Cancel)
        assert cancelled[0].consumer_tag == tag
        assert ch.is_open
        assert tag not in ch.consumer_tags


def test_consumers_on_one_queue_are_served_round_robin(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        inbox = Inbox()
        tags = [consume(ch, queue, inbox, auto_ack=True)[0] for _ in range(3)]
        publish(ch, queue, bodies("m", 9))
        inbox.wait_for(conn, 9)
        assert inbox.bodies == bodies("m", 9)
        assert [d.consumer_tag for d in inbox.deliveries] == tags * 3


def test_consumers_on_different_channels_are_served_round_robin(broker, unique):
    with connect(broker) as conn:
        publisher = conn.channel()
        queue = declare_queue(publisher, unique, exclusive=True)
        inbox = Inbox()
        first, _ = consume(conn.channel(), queue, inbox, auto_ack=True)
        second, _ = consume(conn.channel(), queue, inbox, auto_ack=True)
        publish(publisher, queue, bodies("m", 6))
        inbox.wait_for(conn, 6)
        # Each channel writes its own deliveries, so only the split between consumers is fixed, not the interleaving.
        assert [d.body for d in inbox.of(first)] == [b"m-0", b"m-2", b"m-4"]
        assert [d.body for d in inbox.of(second)] == [b"m-1", b"m-3", b"m-5"]


def test_consume_on_missing_queue_closes_the_channel_404(broker, unique):
    with open_channel(broker) as ch:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.basic_consume(f"{unique}-missing", Inbox())
        assert (closed.value.reply_code, closed.value.reply_text) == (
            404, f"NOT_FOUND - no queue '{unique}-missing' in vhost '/'")


@pytest.mark.parametrize("notify", [True, False], ids=["consumer_cancel_notify", "no-capability"])
def test_basic_cancel_is_sent_only_to_clients_that_announce_consumer_cancel_notify(broker, unique, notify):
    capabilities = {"consumer_cancel_notify": True} if notify else {}
    with RawClient.connect(broker) as client, open_channel(broker) as other:
        client.handshake(client_properties={"capabilities": capabilities})
        client.open_channel(1)
        queue = declare_queue(other, unique)
        client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="doomed"))
        client.expect(commands.Basic.ConsumeOk, channel=1)
        other.queue_delete(queue)
        if notify:
            cancel = client.expect(commands.Basic.Cancel, channel=1)
            assert (cancel.consumer_tag, cancel.nowait) == ("doomed", True)
        else:
            client.assert_silent(QUIET_PERIOD)
        client.open_channel(2)  # the connection is still healthy
