"""What a client cannot do to the broker or to other clients, and what no hostile message does to a subscriber:
retained messages sent within a prefetch and while the client reads, permissions checked before anything is kept,
a session's queues gone with it whatever the disk was doing, takeovers of clean sessions, properties MQTT cannot
carry."""

from __future__ import annotations


import time

import pika
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.integration.helpers import beyond_rabbitmq, rabbitmq4
from tests.integration.management import add_user, delete_user, request, set_permissions
from tests.mqtt.clients import Client, RawClient, connect_packet, connected, user_properties
from tests.waiting import wait_for

PREFETCH = 10  # [mqtt] prefetch's default


def subscribe_packet(packet_id: int, topic_filter: str, qos: int) -> bytes:
    raw = topic_filter.encode()
    body = packet_id.to_bytes(2, "big") + len(raw).to_bytes(2, "big") + raw + bytes((qos,))
    return bytes((0x82, len(body))) + body


def read_packet(client: RawClient) -> tuple[int, bytes]:
    first = client.read(1)[0]
    length = shift = 0
    while True:
        byte = client.read(1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return first, client.read(length)


@beyond_rabbitmq
def test_retained_messages_at_qos1_go_within_the_prefetch_until_acknowledged(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        for number in range(PREFETCH + 5):
            publisher.publish(f"{unique}/r/{number}", b"kept", qos=1, retain=True)
    client = RawClient(broker)
    client.send(connect_packet(f"{unique}-s"))
    assert client.read(4) == b"\x20\x02\x00\x00"
    client.send(subscribe_packet(1, f"{unique}/r/#", 1))
    assert read_packet(client)[0] == 0x90  # SUBACK
    publishes = [read_packet(client) for _ in range(PREFETCH)]
    assert all(first == 0x33 for first, _ in publishes)  # QoS 1, retained
    client.sock.settimeout(0.3)
    try:
        extra = client.sock.recv(1)
    except TimeoutError:
        extra = b""
    assert extra == b""  # no more until one is acknowledged
    client.sock.settimeout(10)
    topic_size = int.from_bytes(publishes[0][1][:2], "big")
    packet_id = publishes[0][1][2 + topic_size:4 + topic_size]
    client.send(b"\x40\x02" + packet_id)  # PUBACK
    assert read_packet(client)[0] == 0x33
    client.close()


@beyond_rabbitmq  # (3.10 leaves the connection open, its publish unanswered)
def test_a_retained_message_is_kept_only_where_its_user_may_publish(broker, unique):
    user = f"{unique}-user"
    add_user(broker, user, "secret")
    set_permissions(broker, "/", user, configure="^mqtt-subscription-.*", write="^mqtt-subscription-.*", read=".*")
    try:
        client = RawClient(broker)
        client.send(connect_packet(f"{unique}-x", username=user, password="secret"))
        assert client.read(4) == b"\x20\x02\x00\x00"
        topic = f"{unique}/state".encode()
        body = len(topic).to_bytes(2, "big") + topic + b"\x00\x01" + b"injected"
        # a durable queue's declare (its reply waits for the disk), then a retained publish, in one write
        client.send(subscribe_packet(1, f"{unique}/x", 1) + bytes((0x33, len(body))) + body)
        assert client.closed()
        client.close()
        with connected(broker, f"{unique}-s") as subscriber:
            subscriber.subscribe(f"{unique}/state", qos=1)
            subscriber.nothing_more(0.5)
    finally:
        delete_user(broker, user)


@beyond_rabbitmq
def test_a_clean_session_closed_at_once_leaves_no_queue(broker, unique):
    for attempt in range(5):
        client = RawClient(broker)
        client.send(connect_packet(f"{unique}-{attempt}"))
        assert client.read(4) == b"\x20\x02\x00\x00"
        client.send(subscribe_packet(1, f"{unique}/a", 1) + b"\xe0\x00")  # SUBSCRIBE, then DISCONNECT at once
        assert client.closed()
        client.close()
    for attempt in range(5):
        wait_for(lambda: request(broker, "GET", f"/api/queues/%2F/mqtt-subscription-{unique}-{attempt}qos1")
                 .status == 404, what="the session's queue gone")


@rabbitmq4
def test_a_persistent_session_taking_over_a_clean_one_starts_fresh(broker, unique):
    clean = Client(broker, f"{unique}-c", clean=True).connect()
    clean.subscribe(f"{unique}/a", qos=1)
    with connected(broker, f"{unique}-c", clean=False) as persistent:
        assert clean.disconnected.wait(10)
        assert persistent.connack[0] is False  # the clean session ended with its connection
        persistent.subscribe(f"{unique}/b", qos=1)
        with connected(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/b", b"to the new session", qos=1)
        assert persistent.receive().payload == b"to the new session"
    clean.paho.loop_stop()
    with connected(broker, f"{unique}-c", clean=True):
        pass


def test_a_persistent_session_gets_its_dollar_topic_messages_after_reconnecting(broker, unique):
    first = Client(broker, f"{unique}-s", clean=False).connect()
    first.subscribe(f"${unique}/#", qos=1)
    first.disconnect()
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"${unique}/a", b"while away", qos=1)
    with connected(broker, f"{unique}-s", clean=False) as again:
        assert again.receive().payload == b"while away"
    with connected(broker, f"{unique}-s", clean=True):
        pass


@rabbitmq4  # (MQTT 5.0)
def test_an_amqp_header_too_long_for_mqtt_is_left_out_of_a_5_0_delivery(broker, unique):
    with connected(broker, f"{unique}-s", version=5) as subscriber:
        subscriber.subscribe(f"{unique}/a", qos=1)
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            connection.channel().basic_publish("amq.topic", f"{unique}.a", b"x", pika.BasicProperties(
                delivery_mode=2, headers={"long": "y" * 70_000, "short": "z"}))
        finally:
            connection.close()
        message = subscriber.receive()
        assert message.properties.UserProperty == [("short", "z")]
        subscriber.publish(f"{unique}/a", b"still served", qos=1)
        assert subscriber.receive().payload == b"still served"


@rabbitmq4  # (MQTT 5.0)
def test_a_message_expiry_interval_that_means_never_is_taken(broker, unique):
    with connected(broker, f"{unique}-s", version=5) as client:
        client.subscribe(f"{unique}/a", qos=1)
        client.publish(f"{unique}/a", b"forever", qos=1, properties=user_properties(MessageExpiryInterval=0xFFFFFFFF))
        assert client.receive().payload == b"forever"


@rabbitmq4  # (MQTT 5.0)
def test_a_qos2_publish_refused_frees_its_packet_id(broker, unique):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare(unique, exclusive=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
        channel.queue_bind(unique, "amq.topic", f"{unique}.full")
        raw = RawClient(broker)
        raw.send(connect_packet(f"{unique}-raw", level=5))
        first, body = read_packet(raw)
        assert first == 0x20 and body[1] == 0
        for topic, reason in ((f"{unique}/full", 0x83), (f"{unique}/free", 0x00)):
            encoded = topic.encode()
            publish = len(encoded).to_bytes(2, "big") + encoded + b"\x00\x07\x00" + b"x"
            raw.send(bytes((0x34, len(publish))) + publish)  # QoS 2, packet id 7 both times
            first, body = read_packet(raw)
            assert (first, body[:2], body[2:3] or b"\x00") == (0x50, b"\x00\x07", bytes((reason,)))
            if reason == 0:
                raw.send(b"\x62\x02\x00\x07")  # PUBREL
                assert read_packet(raw) == (0x70, b"\x00\x07")
        raw.close()
    finally:
        connection.close()


@rabbitmq4  # (MQTT 5.0)
def test_an_amqp_header_posing_as_an_expiry_costs_a_5_0_subscriber_nothing(broker, unique):
    with connected(broker, f"{unique}-s", version=5) as subscriber:
        subscriber.subscribe(f"{unique}/a", qos=1)
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            connection.channel().basic_publish("amq.topic", f"{unique}.a", b"x", pika.BasicProperties(
                delivery_mode=2, headers={"x-mqtt-expires-at": 10 ** 15}))
        finally:
            connection.close()
        assert subscriber.receive().properties.MessageExpiryInterval == 0xFFFFFFFF
        subscriber.publish(f"{unique}/a", b"still served", qos=1)
        assert subscriber.receive().payload == b"still served"


@beyond_rabbitmq
def test_retained_messages_match_as_live_ones_do(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"${unique}/x", b"dollar", qos=1, retain=True)  # (a filter's leading wildcard misses it)
        publisher.publish(f"{unique}.dots", b"dotted", qos=1, retain=True)  # (its "." separates levels)
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe("+/x", qos=1)
        subscriber.subscribe(f"{unique}/dots", qos=1)
        message = subscriber.receive()
        assert (message.topic, message.payload) == (f"{unique}.dots", b"dotted")
        subscriber.nothing_more()


@rabbitmq4  # (MQTT 5.0)
def test_a_retained_message_expires_with_its_interval(broker, unique):
    with connected(broker, f"{unique}-p", version=5) as publisher:
        publisher.publish(f"{unique}/brief", b"gone soon", qos=1, retain=True,
                          properties=user_properties(MessageExpiryInterval=1))
        publisher.publish(f"{unique}/kept", b"kept", qos=1, retain=True,
                          properties=user_properties(MessageExpiryInterval=60))
    time.sleep(1.2)  # (the expiry itself is what is tested)
    with connected(broker, f"{unique}-s", version=5) as subscriber:
        subscriber.subscribe(f"{unique}/#", qos=1)
        message = subscriber.receive()
        assert message.payload == b"kept" and message.properties.MessageExpiryInterval in (57, 58, 59)
        subscriber.nothing_more()


@rabbitmq4  # (MQTT 5.0)
def test_no_local_keeps_nothing_from_the_other_members_of_a_shared_subscription(broker, unique):
    with connected(broker, f"{unique}-a", version=5) as member, connected(broker, f"{unique}-b", version=5) as other:
        member.paho.subscribe(f"{unique}/#", options=SubscribeOptions(qos=1, noLocal=True))
        member.subacks.get(timeout=10)
        for client in (member, other):
            client.subscribe(f"$share/g/{unique}/t", qos=1)
        for number in range(6):
            member.publish(f"{unique}/t", b"%d" % number, qos=1)
        received = []
        deadline = time.monotonic() + 10
        while len(received) < 6 and time.monotonic() < deadline:
            for client in (member, other):
                while not client.messages.empty():
                    received.append(client.receive().payload)
            time.sleep(0.02)
        assert sorted(received) == [b"%d" % number for number in range(6)]
