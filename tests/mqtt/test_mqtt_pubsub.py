"""MQTT 3.1.1 publish and subscribe with paho-mqtt, and the same messages seen from AMQP: RabbitMQ's mapping of
topics to routing keys on amq.topic, its headers, QoS 0 and 1."""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import beyond_rabbitmq, rabbitmq4
from tests.mqtt.clients import Client, RawClient, connect_packet, connected, wait_until_gone
from tests.mqtt.test_mqtt_limits import subscribe_packet


def test_a_qos1_message_reaches_a_qos1_subscriber_as_published(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        assert subscriber.subscribe(f"{unique}/+/c", qos=1) == [1]
        publisher.publish(f"{unique}/b/c", b"hello", qos=1)
        message = subscriber.receive()
        assert (message.topic, message.payload, message.qos, message.retain) == (f"{unique}/b/c", b"hello", 1, False)


def test_the_delivered_qos_is_the_lower_of_the_publish_and_the_subscription(broker, unique):
    with connected(broker, f"{unique}-s1") as at_qos0, connected(broker, f"{unique}-s2") as at_qos1, \
            connected(broker, f"{unique}-p") as publisher:
        assert at_qos0.subscribe(f"{unique}/t", qos=0) == [0]
        assert at_qos1.subscribe(f"{unique}/t", qos=1) == [1]
        publisher.publish(f"{unique}/t", b"one", qos=1)
        publisher.publish(f"{unique}/t", b"zero", qos=0)
        assert [(m.payload, m.qos) for m in (at_qos0.receive(), at_qos0.receive())] == [(b"one", 0), (b"zero", 0)]
        assert [(m.payload, m.qos) for m in (at_qos1.receive(), at_qos1.receive())] == [(b"one", 1), (b"zero", 0)]


def test_a_qos2_subscription_is_granted_qos1_and_a_qos2_publish_completes_its_flow(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        assert subscriber.subscribe(f"{unique}/t", qos=2) == [1]
        publisher.publish(f"{unique}/t", b"two", qos=2)  # (PUBREC, PUBREL, PUBCOMP)
        message = subscriber.receive()
        assert (message.payload, message.qos) == (b"two", 1)
        subscriber.nothing_more()


@beyond_rabbitmq  # (3.10 answers a QoS 2 publish with PUBACK)
def test_a_qos2_publish_sent_again_before_pubrel_is_published_once(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/t", qos=1)
        raw = RawClient(broker)
        raw.send(connect_packet(f"{unique}-raw"))
        assert raw.read(4) == b"\x20\x02\x00\x00"
        topic = f"{unique}/t".encode()
        body = len(topic).to_bytes(2, "big") + topic + b"\x00\x07" + b"once"
        raw.send(bytes((0x34, len(body))) + body)  # QoS 2, packet id 7
        assert raw.read(4) == b"\x50\x02\x00\x07"  # PUBREC
        raw.send(bytes((0x3C, len(body))) + body)  # sent again (DUP)
        assert raw.read(4) == b"\x50\x02\x00\x07"
        raw.send(b"\x62\x02\x00\x07")  # PUBREL
        assert raw.read(4) == b"\x70\x02\x00\x07"  # PUBCOMP
        raw.close()
        assert subscriber.receive().payload == b"once"
        subscriber.nothing_more()


@beyond_rabbitmq  # (3.10 answers a QoS 2 publish with PUBACK)
@pytest.mark.parametrize("takeover", [False, True])
def test_a_qos2_publish_sent_again_by_the_next_connection_of_its_session_is_published_once(broker, unique, takeover):
    """The QoS 2 publishes a persistent session took are the session's: a connection that takes it up (after the
    first went, or taking over from it) answers a resend with PUBREC and publishes nothing again."""
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/t", qos=1)
        first = RawClient(broker)
        first.send(connect_packet(f"{unique}-raw", clean=False))
        assert first.read(4) == b"\x20\x02\x00\x00"
        own = f"{unique}/own".encode()  # (a subscription: the session has a queue, and is present again)
        subscribe = b"\x00\x01" + len(own).to_bytes(2, "big") + own + b"\x01"
        first.send(bytes((0x82, len(subscribe))) + subscribe)
        assert first.read(5) == b"\x90\x03\x00\x01\x01"
        topic = f"{unique}/t".encode()
        body = len(topic).to_bytes(2, "big") + topic + b"\x00\x07" + b"once"
        first.send(bytes((0x34, len(body))) + body)  # QoS 2, packet id 7
        assert first.read(4) == b"\x50\x02\x00\x07"  # PUBREC
        if not takeover:
            first.close()  # (gone before its PUBREL)
            wait_until_gone(broker, f"{unique}-raw")
        second = RawClient(broker)
        second.send(connect_packet(f"{unique}-raw", clean=False))
        assert second.read(4) == b"\x20\x02\x01\x00"  # (session present)
        second.send(bytes((0x3C, len(body))) + body)  # sent again (DUP)
        assert second.read(4) == b"\x50\x02\x00\x07"
        second.send(b"\x62\x02\x00\x07")  # PUBREL
        assert second.read(4) == b"\x70\x02\x00\x07"  # PUBCOMP
        assert subscriber.receive().payload == b"once"
        subscriber.nothing_more()
        second.close()
        first.close()
    with connected(broker, f"{unique}-raw", clean=True):  # (the session ends)
        pass


@pytest.mark.parametrize("topic_filter, topic, matches", [
    ("{u}/+/c", "{u}/b/c", True),
    ("{u}/+/c", "{u}//c", True),  # + matches an empty level
    ("{u}/#", "{u}", True),  # h/# matches h
    ("{u}/#", "{u}/a/b/c", True),
    ("{u}/+", "{u}/a/b", False),
    ("{u}/a/b", "{u}/a.b", True),  # a "." in a topic separates levels, as with RabbitMQ
])
def test_topic_filters_match_as_rabbitmq_maps_them(broker, unique, topic_filter, topic, matches):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        subscriber.subscribe(topic_filter.format(u=unique), qos=1)
        subscriber.subscribe(f"{unique}-marker", qos=1)
        publisher.publish(topic.format(u=unique), b"x", qos=1)
        publisher.publish(f"{unique}-marker", b"marker", qos=1)
        received = [subscriber.receive().payload]
        if received[0] != b"marker":
            received.append(subscriber.receive().payload)
        assert received == ([b"x", b"marker"] if matches else [b"marker"])


def test_an_mqtt_publish_reaches_an_amqp_queue_bound_to_amq_topic(broker, unique):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare(unique, exclusive=True)
        channel.queue_bind(unique, "amq.topic", f"{unique}.sensors.*")
        with connected(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/sensors/t1", b"21.5", qos=1)
            publisher.publish(f"{unique}/sensors/t2", b"19.0", qos=0)
        received = []
        for _ in range(2):
            method, properties, body = next(channel.consume(unique, inactivity_timeout=10))
            received.append((method.routing_key, body, properties.delivery_mode, properties.headers))
            channel.basic_ack(method.delivery_tag)
        assert received == [
            (f"{unique}.sensors.t1", b"21.5", 2, {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}),
            (f"{unique}.sensors.t2", b"19.0", 1, {"x-mqtt-publish-qos": 0, "x-mqtt-dup": False}),
        ]
    finally:
        connection.close()


@rabbitmq4  # (3.10 sends every AMQP message at QoS 1)
def test_an_amqp_publish_to_amq_topic_reaches_mqtt_subscribers(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/orders/#", qos=1)
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            channel = connection.channel()
            channel.basic_publish("amq.topic", f"{unique}.orders.eu.1", b"persistent",
                                  pika.BasicProperties(delivery_mode=2))
            channel.basic_publish("amq.topic", f"{unique}.orders.us", b"transient")
        finally:
            connection.close()
        first, second = subscriber.receive(), subscriber.receive()
        assert (first.topic, first.payload, first.qos) == (f"{unique}/orders/eu/1", b"persistent", 1)
        assert (second.topic, second.payload, second.qos) == (f"{unique}/orders/us", b"transient", 0)


def test_packets_sent_together_are_handled_in_order_a_publish_after_a_subscribe_reaching_it(broker, unique):
    """Several SUBSCRIBEs and a PUBLISH to the first filter in one write: each SUBACK in turn, then the message (the
    first subscription's binding waited for its session queue while the publish went on, unrouted)."""
    client = RawClient(broker)
    try:
        client.send(connect_packet(f"{unique}-c"))
        assert client.read(4) == b"\x20\x02\x00\x00"
        client.send(b"".join(subscribe_packet(packet_id, f"{unique}/{packet_id}", 0) for packet_id in range(1, 6))
                    + publish_packet(f"{unique}/1", b"to myself"))
        assert client.read(25) == b"".join(b"\x90\x03\x00" + bytes((packet_id,)) + b"\x00"
                                           for packet_id in range(1, 6))
        assert client.read(len(publish_packet(f"{unique}/1", b"to myself"))) == publish_packet(f"{unique}/1",
                                                                                              b"to myself")
    finally:
        client.close()


def publish_packet(topic: str, payload: bytes) -> bytes:
    """A QoS 0 PUBLISH, written out by hand."""
    raw = topic.encode()
    body = len(raw).to_bytes(2, "big") + raw + payload
    return bytes((0x30, len(body))) + body


def test_unsubscribe_stops_deliveries(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        subscriber.subscribe(f"{unique}/a", qos=1)
        subscriber.subscribe(f"{unique}/b", qos=0)
        subscriber.unsubscribe(f"{unique}/a")
        publisher.publish(f"{unique}/a", b"gone", qos=1)
        publisher.publish(f"{unique}/b", b"marker", qos=1)
        assert subscriber.receive().payload == b"marker"
        subscriber.nothing_more()


@rabbitmq4  # (3.10 keeps both, and delivers twice)
def test_a_subscription_made_again_with_another_qos_replaces_the_first(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        subscriber.subscribe(f"{unique}/a", qos=0)
        subscriber.subscribe(f"{unique}/a", qos=1)
        publisher.publish(f"{unique}/a", b"once", qos=1)
        assert subscriber.receive().qos == 1
        subscriber.nothing_more()


def test_an_unacknowledged_qos1_message_comes_again_to_the_next_connection(broker, unique):
    with connected(broker, f"{unique}-p") as publisher:
        subscriber = Client(broker, f"{unique}-s", clean=False, auto_ack=False).connect()
        subscriber.subscribe(f"{unique}/a", qos=1)
        publisher.publish(f"{unique}/a", b"again", qos=1)
        assert subscriber.receive().payload == b"again"
        subscriber.drop()  # no PUBACK
        with connected(broker, f"{unique}-s", clean=False) as again:
            message = again.receive()
            assert (message.payload, message.dup) == (b"again", True)
        with connected(broker, f"{unique}-s", clean=True):
            pass


@beyond_rabbitmq  # (the spec's rule, which RabbitMQ does not keep)
def test_a_filter_that_begins_with_a_wildcard_does_not_match_a_dollar_topic(broker, unique):
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p") as publisher:
        subscriber.subscribe(f"+/{unique}", qos=1)
        subscriber.subscribe(f"${unique}/{unique}", qos=1)
        publisher.publish(f"$other/{unique}", b"not matched", qos=1)  # (+/... alone matches it)
        publisher.publish(f"${unique}/{unique}", b"matched", qos=1)
        assert subscriber.receive().payload == b"matched"
        subscriber.nothing_more()
