"""Bodies being assembled count against memory: a client announcing large bodies on many channels and sending them
only in part is blocked (connection.blocked) before the broker's memory grows with what it sends, other clients
are still served, and max_message_size from the config bounds every single body."""

from __future__ import annotations

import socket

import pika
import pika.exceptions
import pytest
from pamqp import body, commands, header

from tests.integration.rawclient import RawClient

MIB = 1 << 20
FRAME_MAX = 131072


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def write_config(tmp_path, text: str):
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return str(path)


def test_partial_bodies_on_many_channels_are_blocked_before_memory_grows(own_broker, tmp_path, unique):
    # bodies in assembly may take half the memory limit (32 MiB); the attack tries to park 300 MiB
    config = write_config(tmp_path, "[server]\nmemory_limit = 67108864\n[amqp]\nmax_message_size = 16777216\n")
    broker = own_broker("--config", config)
    before = resident_mib(broker.process.pid)
    channels, announced, sent_per_channel = 150, 16 * MIB, 2 * MIB
    part = body.ContentBody(b"x" * (FRAME_MAX - 8))
    with RawClient.connect(broker) as attacker:
        attacker.handshake(client_properties={"product": "attacker", "capabilities": {"connection.blocked": True}})
        for number in range(1, channels + 1):
            attacker.open_channel(number)
        attacker.sock.settimeout(2.0)
        try:
            for number in range(1, channels + 1):
                attacker.send(number, commands.Basic.Publish(exchange="", routing_key=unique),
                              header.ContentHeader(0, announced, commands.Basic.Properties()),
                              *[part] * (sent_per_channel // (FRAME_MAX - 8)))
        except (socket.timeout, TimeoutError):
            pass  # the broker stopped reading us
        attacker.sock.settimeout(None)
        blocked = attacker.expect(commands.Connection.Blocked, channel=0)
        assert blocked.reason == "low on memory"
        grown = resident_mib(broker.process.pid) - before
        print(f"broker memory grew by {grown:.0f} MiB")
        assert grown < 100, f"broker memory grew by {grown:.0f} MiB"
        with pika.BlockingConnection(pika.URLParameters(broker.url)) as other:
            channel = other.channel()
            channel.queue_declare(unique)
            assert channel.basic_get(unique, auto_ack=True) == (None, None, None)


def test_max_message_size_from_the_config_file_is_enforced(own_broker, tmp_path, unique):
    broker = own_broker("--config", write_config(tmp_path, "[amqp]\nmax_message_size = 1000\n"))
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(unique)
        channel.confirm_delivery()
        channel.basic_publish("", unique, b"z" * 1000)  # exactly at the limit: accepted
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("", unique, b"z" * 1001)
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000")
        assert connection.channel().queue_declare(unique, passive=True).method.message_count == 1
