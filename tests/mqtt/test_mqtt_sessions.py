"""What outlives a publish: retained messages, wills, persistent sessions (across a broker restart too), a client id
taken over by a second connection, and keepalive."""

from __future__ import annotations

import time

import pika

from tests.integration.helpers import beyond_rabbitmq
from tests.mqtt.clients import Client, RawClient, connect_packet, connected



def test_a_new_subscriber_gets_the_retained_message_with_its_retain_flag(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/state", b"old", qos=1, retain=True)
        publisher.publish(f"{unique}/state", b"on", qos=1, retain=True)
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/state", qos=1)
        message = subscriber.receive()
        assert (message.payload, message.retain, message.qos) == (b"on", True, 1)
        with connected(broker, f"{unique}-p2") as publisher:  # an established subscription: retain flag 0
            publisher.publish(f"{unique}/state", b"off", qos=1, retain=True)
        message = subscriber.receive()
        assert (message.payload, message.retain) == (b"off", False)
        subscriber.nothing_more()


@beyond_rabbitmq
def test_a_wildcard_subscription_gets_the_retained_messages_it_matches(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/rooms/1/t", b"20", qos=1, retain=True)
        publisher.publish(f"{unique}/rooms/2/t", b"21", qos=0, retain=True)
        publisher.publish(f"{unique}/other", b"x", qos=0, retain=True)
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/rooms/+/t", qos=1)
        received = sorted((m.topic, m.payload, m.qos, m.retain) for m in (subscriber.receive(), subscriber.receive()))
        assert received == [(f"{unique}/rooms/1/t", b"20", 1, True), (f"{unique}/rooms/2/t", b"21", 0, True)]
        subscriber.nothing_more()


def test_an_empty_retained_message_clears_the_topic(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/state", b"on", qos=1, retain=True)
        publisher.publish(f"{unique}/state", b"", qos=1, retain=True)
        publisher.publish(f"{unique}/marker", b"m", qos=1, retain=True)
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/state", qos=1)
        subscriber.subscribe(f"{unique}/marker", qos=1)
        assert subscriber.receive().payload == b"m"
        subscriber.nothing_more()


def test_retained_messages_outlive_a_restart(own_broker, unique):
    broker = own_broker()
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/state", b"kept", qos=1, retain=True)
    broker.restart()
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/state", qos=1)
        assert subscriber.receive().payload == b"kept"


def test_the_will_is_published_when_the_client_drops_without_disconnect(broker, unique):
    with connected(broker, f"{unique}-s") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        dying = Client(broker, f"{unique}-d", will=(f"{unique}/status", b"gone", 1, False)).connect()
        dying.drop()
        message = watcher.receive()
        assert (message.topic, message.payload, message.qos) == (f"{unique}/status", b"gone", 1)


def test_no_will_after_disconnect(broker, unique):
    with connected(broker, f"{unique}-s") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        watcher.subscribe(f"{unique}/marker", qos=1)
        leaving = Client(broker, f"{unique}-d", will=(f"{unique}/status", b"gone", 1, False)).connect()
        leaving.disconnect()
        with connected(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/marker", b"m", qos=1)
        assert watcher.receive().payload == b"m"
        watcher.nothing_more()


def test_a_second_connection_with_the_client_id_takes_over_without_the_will(broker, unique):
    with connected(broker, f"{unique}-s") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        watcher.subscribe(f"{unique}/marker", qos=1)
        first = Client(broker, f"{unique}-same", will=(f"{unique}/status", b"gone", 1, False)).connect()
        with connected(broker, f"{unique}-same") as second:
            assert first.disconnected.wait(10), "the first connection stays"
            second.publish(f"{unique}/marker", b"m", qos=1)
            assert watcher.receive().payload == b"m"
            watcher.nothing_more()
        first.paho.loop_stop()


def test_a_persistent_session_keeps_qos1_messages_while_the_client_is_away(broker, unique):
    first = Client(broker, f"{unique}-s", clean=False).connect()
    assert first.connack[0] is False
    first.subscribe(f"{unique}/a", qos=1)
    first.disconnect()
    with connected(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/a", b"while away", qos=1)
    with connected(broker, f"{unique}-s", clean=False) as again:
        assert again.connack[0] is True  # session present
        message = again.receive()
        assert (message.payload, message.qos) == (b"while away", 1)
    with connected(broker, f"{unique}-s", clean=True) as clean:
        assert clean.connack[0] is False
    with connected(broker, f"{unique}-s", clean=False) as after_clean:
        assert after_clean.connack[0] is False  # the clean session deleted it


def test_a_persistent_session_is_a_durable_queue_named_as_rabbitmq_names_it(broker, unique):
    client = Client(broker, f"{unique}-s", clean=False).connect()
    client.subscribe(f"{unique}/a", qos=1)
    client.disconnect()
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        declared = connection.channel().queue_declare(f"mqtt-subscription-{unique}-sqos1", passive=True)
        assert declared.method.message_count == 0
    finally:
        connection.close()
    with connected(broker, f"{unique}-s", clean=True):
        pass


def test_a_persistent_session_and_its_messages_outlive_a_restart(own_broker, unique):
    broker = own_broker()
    client = Client(broker, f"{unique}-s", clean=False).connect()
    client.subscribe(f"{unique}/a", qos=1)
    client.disconnect()
    with connected(broker, f"{unique}-p") as publisher:
        for number in range(3):
            publisher.publish(f"{unique}/a", b"m%d" % number, qos=1)
    broker.kill()
    broker.start()
    with connected(broker, f"{unique}-s", clean=False) as again:
        assert again.connack[0] is True
        assert [again.receive().payload for _ in range(3)] == [b"m0", b"m1", b"m2"]
        with connected(broker, f"{unique}-p") as publisher:  # and the subscription still routes
            publisher.publish(f"{unique}/a", b"after", qos=1)
        assert again.receive().payload == b"after"


@beyond_rabbitmq  # (3.10: after 2 to 3 keepalives)
def test_a_silent_client_is_closed_after_one_and_a_half_keepalives_and_its_will_goes(broker, unique):
    with connected(broker, f"{unique}-s") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        silent = RawClient(broker)
        silent.send(connect_packet(f"{unique}-silent", keepalive=1, will=(f"{unique}/status", b"timed out")))
        assert silent.read(4) == b"\x20\x02\x00\x00"
        started = time.monotonic()
        silent.sock.settimeout(5)
        assert silent.closed()
        waited = time.monotonic() - started
        assert 1.4 <= waited < 2.5, waited
        assert watcher.receive().payload == b"timed out"
        silent.close()


def test_an_amqp_publish_waits_in_a_persistent_mqtt_session_across_a_restart(own_broker, unique):
    broker = own_broker()
    client = Client(broker, f"{unique}-s", clean=False).connect()
    client.subscribe(f"{unique}/orders/#", qos=1)
    client.disconnect()
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.topic", f"{unique}.orders.1", b"from AMQP", pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    broker.kill()
    broker.start()
    with connected(broker, f"{unique}-s", clean=False) as again:
        message = again.receive()
        assert (message.topic, message.payload, message.qos) == (f"{unique}/orders/1", b"from AMQP", 1)


def test_a_will_reaches_an_amqp_queue_bound_to_its_topic(broker, unique):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare(unique, exclusive=True)
        channel.queue_bind(unique, "amq.topic", f"{unique}.status.*")
        dying = Client(broker, f"{unique}-d", will=(f"{unique}/status/d", b"offline", 1, False)).connect()
        dying.drop()
        method, properties, body = next(channel.consume(unique, inactivity_timeout=10))
        assert (method.routing_key, body, properties.delivery_mode) == (f"{unique}.status.d", b"offline", 2)
    finally:
        connection.close()
