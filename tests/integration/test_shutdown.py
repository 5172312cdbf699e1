"""A clean shutdown: on SIGTERM or SIGINT every client connection gets connection.close 320 CONNECTION_FORCED with
RabbitMQ's text, and the process exits 0. Needs a broker process of its own, so it runs only against Warren."""

from __future__ import annotations

import signal

import pika
import pytest
from pamqp import commands

from tests.integration.helpers import connect
from tests.integration.rawclient import RawClient

SHUTDOWN_TEXT = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_closes_every_connection_with_320_and_exits_0(own_broker, signum):
    broker = own_broker()
    idle, busy = RawClient.connect(broker), RawClient.connect(broker)
    try:
        idle.handshake()
        busy.handshake()
        busy.open_channel(1)
        busy.send(1, commands.Queue.Declare(queue="", exclusive=True))
        queue = busy.expect(commands.Queue.DeclareOk, channel=1).queue
        busy.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c1"))
        busy.expect(commands.Basic.ConsumeOk, channel=1)

        broker.process.send_signal(signum)
        for client in (idle, busy):
            close = client.expect_connection_close(timeout=10)
            assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (320, SHUTDOWN_TEXT, 0, 0)
            client.expect_closed(timeout=10)
        assert broker.process.wait(timeout=15) == 0
    finally:
        idle.close()
        busy.close()


def test_pika_sees_connection_forced(own_broker):
    broker = own_broker()
    connection = connect(broker)
    connection.channel()
    broker.process.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        connection.process_data_events(time_limit=10)
    assert (error.value.reply_code, error.value.reply_text) == (320, SHUTDOWN_TEXT)
    assert broker.process.wait(timeout=15) == 0


def test_shutdown_does_not_wait_forever_for_a_silent_client(own_broker):
    broker = own_broker()
    with RawClient.connect(broker) as silent:
        silent.handshake()
        broker.process.send_signal(signal.SIGTERM)
        close = silent.expect(commands.Connection.Close, channel=0, timeout=10)
        assert (close.reply_code, close.reply_text) == (320, SHUTDOWN_TEXT)
        # no close-ok from us: the broker must still exit, and cleanly
        assert broker.process.wait(timeout=15) == 0


def test_shutdown_drops_a_client_that_never_sent_its_header_and_closes_one_mid_handshake(own_broker):
    """A socket that has not spoken AMQP is just closed; one awaiting start-ok gets the 320 close; the broker exits
    cleanly either way, with no traceback in its log."""
    broker = own_broker()
    with RawClient.connect(broker) as mute, RawClient.connect(broker) as halfway:
        halfway.send_raw(b"AMQP\x00\x00\x09\x01")
        halfway.expect(commands.Connection.Start, channel=0)
        broker.process.send_signal(signal.SIGTERM)
        mute.expect_closed(timeout=10)
        close = halfway.expect_connection_close(timeout=10)
        assert (close.reply_code, close.reply_text) == (320, SHUTDOWN_TEXT)
        assert broker.process.wait(timeout=15) == 0
    assert "Traceback" not in broker.log()
