"""Declare-ok (and bind-ok, delete-ok...) of a durable object is sent once its definition is on disk, as confirms
follow their messages; meanwhile the channel handles nothing later, so no reply overtakes it. On a write error the
client gets 541 INTERNAL_ERROR, never a declare-ok for something that is not there after a restart."""

from __future__ import annotations

import contextlib
import os
import signal

import pika
import pika.exceptions
import pytest
from pamqp import body, commands, header

from tests.integration.helpers import connection_error
from tests.integration.rawclient import RawClient, describe
from tests.tmpfs import fill, tmpfs

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_declared_durable_definitions_survive_a_kill_right_after_their_ok(own_broker, tmp_path):
    data_dir = tmp_path / "data"
    broker = own_broker(data_dir=data_dir)
    for round_ in range(5):
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.exchange_declare(f"x{round_}", "direct", durable=True)
        channel.queue_declare(f"q{round_}", durable=True)
        channel.queue_bind(f"q{round_}", f"x{round_}", "key")
        broker.process.send_signal(signal.SIGKILL)  # the moment bind-ok arrived
        broker.stop()
        broker = own_broker(data_dir=data_dir)
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker.url))) as check:
            checking = check.channel()
            for seen in range(round_ + 1):
                checking.exchange_declare(f"x{seen}", passive=True)
                checking.queue_declare(f"q{seen}", passive=True)
            confirming = check.channel()
            confirming.confirm_delivery()
            confirming.basic_publish(f"x{round_}", "key", b"routed", mandatory=True)  # unroutable would raise


def test_pipelined_methods_after_a_durable_nowait_declare_wait_their_turn(broker, unique):
    """A nowait durable declare and bind, then a publish through that binding, a transient declare and a get, all
    in one write: the replies come in order and the publish found the binding."""
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1,
                    commands.Queue.Declare(queue=unique, durable=True, nowait=True),
                    commands.Queue.Bind(queue=unique, exchange="amq.direct", routing_key=unique, nowait=True),
                    commands.Basic.Publish(exchange="amq.direct", routing_key=unique),
                    header.ContentHeader(0, 2, commands.Basic.Properties(delivery_mode=2)),
                    body.ContentBody(b"hi"),
                    commands.Queue.Declare(queue=f"{unique}-transient", exclusive=True),
                    commands.Queue.Declare(queue=f"{unique}-2", durable=True),
                    commands.Basic.Get(queue=unique, no_ack=True),
                    commands.Queue.Delete(queue=unique),
                    commands.Queue.Delete(queue=f"{unique}-2"))
        replies = [client.read_frame()[1] for _ in range(6)]
        assert [describe(reply).split("(")[0] for reply in replies] == [
            "Queue.DeclareOk", "Queue.DeclareOk", "Basic.GetOk", "ContentHeader", "ContentBody", "Queue.DeleteOk"]
        assert [replies[0].queue, replies[1].queue] == [f"{unique}-transient", f"{unique}-2"]
        assert replies[4].value == b"hi"
        client.expect(commands.Queue.DeleteOk, channel=1)


def test_deliveries_wait_behind_a_held_reply(broker, unique):
    """A consuming channel that declares durable queues between publishes to its own queue: no delivery overtakes
    the reply of a method sent before its publish."""
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
        client.expect(commands.Queue.DeclareOk)
        client.send(1, commands.Basic.Consume(queue=unique, consumer_tag="c", no_ack=True))
        client.expect(commands.Basic.ConsumeOk)
        declares = [commands.Queue.Declare(queue=f"{unique}-d{n}", durable=True) for n in range(3)]
        publish = [commands.Basic.Publish(exchange="", routing_key=unique),
                   header.ContentHeader(0, 1, commands.Basic.Properties()), body.ContentBody(b"m")]
        client.send(1, *publish, declares[0], *publish, declares[1], *publish, declares[2], *publish,
                    *(commands.Queue.Delete(queue=f"{unique}-d{n}") for n in range(3)))
        seen = []
        while seen.count("delete-ok") < 3 or seen.count("deliver") < 4:
            _, value = client.read_frame()
            if isinstance(value, commands.Basic.Deliver):
                seen.append("deliver")
            elif isinstance(value, (commands.Queue.DeclareOk, commands.Queue.DeleteOk)):
                seen.append("declare-ok" if isinstance(value, commands.Queue.DeclareOk) else "delete-ok")
        # deliveries are asynchronous (RabbitMQ's often come later), but the k-th publish follows k declares
        for position, event in enumerate(seen):
            if event == "deliver":
                delivered_before = seen[:position].count("deliver")
                assert seen[:position].count("declare-ok") >= delivered_before, seen
        assert seen.count("declare-ok") == 3


def test_a_durable_declare_on_a_full_disk_is_refused_and_leaves_nothing_behind(own_broker, tmp_path):
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        broker = own_broker(data_dir=disk / "data")
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.queue_declare("before", durable=True)
        fill(disk)
        channel.queue_declare("transient", exclusive=True)  # nothing to write: served as usual
        # larger than a page, so it cannot fit in what is left of the last page of a file either
        padding = {"x-padding": "p" * 10000}
        code, text = connection_error(
            lambda: channel.queue_declare("full", durable=True, arguments=padding), connection)
        assert (code, text) == (541, "INTERNAL_ERROR - queue.declare could not be written to disk")
        os.unlink(disk / "filler")
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker.url))) as again:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                again.channel().queue_declare("full", passive=True)  # taken back at once
            again.channel().queue_declare("after", durable=True)  # the disk has room again
        broker.stop()
        broker = own_broker(data_dir=disk / "data")
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(broker.url))) as restarted:
            checking = restarted.channel()
            checking.queue_declare("before", passive=True)
            checking.queue_declare("after", passive=True)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                checking.queue_declare("full", passive=True)
        broker.stop()
