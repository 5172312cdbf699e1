"""Packets no client should send: each closes its own connection, naming what is wrong in one log line, and costs
the other clients nothing."""

from __future__ import annotations

import pytest

from tests.integration.helpers import beyond_rabbitmq
from tests.mqtt.clients import RawClient, connect_packet, connected

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"


def connected_raw(broker, client_id: str) -> RawClient:
    client = RawClient(broker)
    client.send(connect_packet(client_id))
    assert client.read(4) == CONNACK_ACCEPTED
    return client


def publish_packet(topic: bytes, payload: bytes, flags: int = 0) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + payload
    return bytes((0x30 | flags, len(body))) + body


@pytest.mark.parametrize("packet", [
    pytest.param(b"\x82\x08\x00\x01\x00\x03a/b\x01", id="subscribe-before-connect"),
    pytest.param(b"\xc0\x00", id="pingreq-before-connect"),
    pytest.param(b"\x10\xff\xff\xff\xff\x7f", id="remaining-length-of-five-bytes", marks=beyond_rabbitmq),
    pytest.param(b"\x10\x80\x80\x04" + b"\x00" * 16, id="connect-larger-than-64-KiB", marks=beyond_rabbitmq),
])
def test_a_bad_first_packet_closes_the_connection_without_connack(broker, unique, packet):
    with connected(broker, f"{unique}-bystander") as bystander:
        bystander.subscribe(f"{unique}/a", qos=1)
        client = RawClient(broker)
        client.send(packet)
        assert client.closed()
        client.close()
        bystander.publish(f"{unique}/a", b"still here", qos=1)
        assert bystander.receive().payload == b"still here"


@beyond_rabbitmq  # (3.10 does not check topic names and reserved flags)
@pytest.mark.parametrize("packet", [
    pytest.param(publish_packet(b"a\x00b", b"x"), id="topic-with-nul"),
    pytest.param(publish_packet(b"a/+", b"x"), id="publish-to-a-wildcard"),
    pytest.param(publish_packet(b"a", b"x", flags=0x06), id="qos-3"),
    pytest.param(publish_packet(b"\xff\xfe", b"x"), id="topic-not-utf8"),
    pytest.param(b"\x80\x06\x00\x01\x00\x01a\x01", id="subscribe-with-flags-0"),
    pytest.param(b"\x82\x02\x00\x01", id="subscribe-without-a-filter"),
    pytest.param(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01b", id="second-connect"),
    pytest.param(b"\x90\x03\x00\x01\x00", id="suback-from-a-client"),
])
def test_a_malformed_packet_closes_the_connection_and_nobody_else_s(broker, unique, packet):
    with connected(broker, f"{unique}-bystander") as bystander:
        bystander.subscribe(f"{unique}/a", qos=1)
        client = connected_raw(broker, f"{unique}-bad")
        client.send(packet)
        assert client.closed()
        client.close()
        bystander.publish(f"{unique}/a", b"still here", qos=1)
        assert bystander.receive().payload == b"still here"


@beyond_rabbitmq  # (3.10 waits for the rest of a packet whose length takes five bytes)
def test_a_malformed_packet_publishes_no_will(broker, unique):
    with connected(broker, f"{unique}-s") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        watcher.subscribe(f"{unique}/marker", qos=1)
        client = RawClient(broker)
        client.send(connect_packet(f"{unique}-bad", will=(f"{unique}/status", b"gone")))
        assert client.read(4) == CONNACK_ACCEPTED
        client.send(b"\x30\xff\xff\xff\xff\x7f")
        assert client.closed()
        client.close()
        with connected(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/marker", b"m", qos=1)
        assert watcher.receive().payload == b"m"
        watcher.nothing_more()


def test_a_body_above_max_message_size_closes_the_connection(own_broker, unique, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[amqp]\nmax_message_size = 1000\n")
    broker = own_broker("--config", str(config))
    client = connected_raw(broker, unique)
    body = b"\x00\x01a\x00\x01" + b"x" * 2000
    client.send(bytes((0x32,)) + bytes((len(body) & 0x7F | 0x80, len(body) >> 7)) + body)
    assert client.closed()
    assert "message size 2000 is larger than configured max size 1000" in broker.log()
