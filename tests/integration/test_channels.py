"""Channel life cycle: open, close, close-ok, channel.flow, channel_max, and what RabbitMQ does with frames on channels
that are closed, closing or were never opened."""

from __future__ import annotations

import pytest
from pamqp import commands

from tests.integration.helpers import channel_error, connect, declare_queue, get, wait_until
from tests.integration.rawclient import RawClient


def channel_close(code: int = 200, text: str = "bye") -> commands.Channel.Close:
    return commands.Channel.Close(reply_code=code, reply_text=text, class_id=0, method_id=0)


@pytest.fixture
def client(broker):
    with RawClient.connect(broker) as raw:
        raw.handshake()
        yield raw


def test_open_and_close_answer_open_ok_and_close_ok(client):
    client.send(1, commands.Channel.Open())
    assert client.expect(commands.Channel.OpenOk, channel=1).channel_id == ""
    client.send(1, channel_close())
    client.expect(commands.Channel.CloseOk, channel=1)
    client.close_connection()


def test_channels_are_independent(client, unique):
    client.open_channel(1)
    client.open_channel(7)
    client.send(1, commands.Basic.Ack(delivery_tag=1))  # a soft error on channel 1 only
    client.expect_channel_error(1, 406, "PRECONDITION_FAILED - unknown delivery tag 1", 60, 80)
    client.send(7, commands.Queue.Declare(queue=unique, exclusive=True))
    assert client.expect(commands.Queue.DeclareOk, channel=7).queue == unique
    client.close_connection()


def test_a_channel_number_can_be_reopened_after_close_and_starts_afresh(broker, unique):
    connection = connect(broker)
    try:
        channel = connection.channel(channel_number=3)
        queue = declare_queue(channel, unique, exclusive=True)
        channel.basic_publish("", queue, b"first")
        channel.basic_publish("", queue, b"second")
        delivered = []
        channel.basic_consume(queue, lambda _channel, method, _properties, body: delivered.append(body))
        wait_until(connection, lambda: len(delivered) == 2)  # both unacked
        channel.close()  # requeues them
        reopened = connection.channel(channel_number=3)
        method, _, body = reopened.basic_get(queue)
        assert (method.delivery_tag, method.redelivered, body) == (1, True, b"first")  # tags restart at 1
    finally:
        connection.close()


def test_client_initiated_close_is_answered_even_while_messages_flow(client, unique):
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
    client.expect(commands.Queue.DeclareOk, channel=1)
    for _ in range(20):
        client.publish(1, "", unique, b"payload")
    client.send(1, commands.Basic.Consume(queue=unique, consumer_tag="c1"))
    client.send(1, channel_close())
    while True:  # deliveries may precede the close-ok; nothing may follow it
        _, value = client.read_frame()
        if isinstance(value, commands.Channel.CloseOk):
            break
    client.close_connection()


def test_double_open_is_504_channel_error(client):
    client.open_channel(1)
    client.send(1, commands.Channel.Open())
    client.expect_connection_error(504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_method_on_an_unopened_channel_is_504(client):
    client.send(5, commands.Basic.Qos(prefetch_count=1))
    client.expect_connection_error(504, "CHANNEL_ERROR - expected 'channel.open'", 60, 10)


def test_close_of_an_unopened_channel_is_504(client):
    client.send(3, channel_close())
    client.expect_connection_error(504, "CHANNEL_ERROR - expected 'channel.open'", 20, 40)


def test_method_on_a_channel_the_client_closed_is_504(client):
    client.open_channel(1)
    client.send(1, channel_close())
    client.expect(commands.Channel.CloseOk, channel=1)
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.expect_connection_error(504, "CHANNEL_ERROR - expected 'channel.open'", 60, 10)


def test_frames_on_a_channel_the_broker_is_closing_are_ignored_until_close_ok(client):
    client.open_channel(1)
    client.send(1, commands.Basic.Ack(delivery_tag=9))
    close = client.expect(commands.Channel.Close, channel=1)
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 9")
    client.send(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.Ack(delivery_tag=3))
    client.assert_silent(0.2)  # no qos-ok, no second error
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(1)  # and the number is free again
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, channel=1)
    client.close_connection()


def test_close_ok_without_a_close_is_503(client):
    client.open_channel(1)
    client.send(1, commands.Channel.CloseOk())
    client.expect_connection_error(503, "COMMAND_INVALID - unimplemented method", 20, 41)


def test_channel_max_limits_the_number_of_open_channels(broker):
    with RawClient.connect(broker) as client:
        client.handshake(channel_max=3)
        for number in (1, 2, 3):
            client.open_channel(number)
        client.send(4, commands.Channel.Open())
        client.expect_connection_error(
            530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)")


def test_a_closed_channel_frees_its_place_under_channel_max(broker):
    with RawClient.connect(broker) as client:
        client.handshake(channel_max=2)
        client.open_channel(1)
        client.open_channel(2)
        client.send(2, channel_close())
        client.expect(commands.Channel.CloseOk, channel=2)
        client.open_channel(9)
        client.close_connection()


def test_flow_active_is_acknowledged(client):
    client.open_channel(1)
    client.send(1, commands.Channel.Flow(active=True))
    assert client.expect(commands.Channel.FlowOk, channel=1).active is True
    client.close_connection()


def test_flow_inactive_is_not_implemented(client):
    # RabbitMQ does not let a client stop its deliveries with channel.flow: it closes the connection with 540.
    client.open_channel(1)
    client.send(1, commands.Channel.Flow(active=False))
    client.expect_connection_error(540, "NOT_IMPLEMENTED - active=false", 20, 20)


def test_pika_soft_error_closes_only_that_channel(broker, unique):
    connection = connect(broker)
    try:
        doomed, survivor = connection.channel(), connection.channel()
        assert channel_error(lambda: doomed.queue_declare(unique, passive=True)) == (
            404, f"NOT_FOUND - no queue '{unique}' in vhost '/'")
        assert doomed.is_closed and survivor.is_open
        queue = declare_queue(survivor, unique, exclusive=True)
        survivor.basic_publish("", queue, b"still here")
        assert get(survivor, queue).body == b"still here"
    finally:
        connection.close()
