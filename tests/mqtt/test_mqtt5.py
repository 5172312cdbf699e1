"""MQTT 5.0 with paho-mqtt: what CONNACK says of the server, properties carried to MQTT and AMQP subscribers alike,
subscription identifiers, topic aliases, session expiry, shared subscriptions, reason codes."""

from __future__ import annotations

import time

import pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.conftest import wait_for_port
from tests.integration.helpers import RABBITMQ4
from tests.integration.management import quote, request
from tests.mqtt.clients import Client, RawClient, connect_packet, connected, user_properties, wait_until_gone
from tests.waiting import wait_for

pytestmark = list(RABBITMQ4)  # (MQTT 5.0 came with RabbitMQ 3.13)


def v5(broker, client_id: str, **options):
    return connected(broker, client_id, version=5, **options)


def connect_properties(**values) -> Properties:
    properties = Properties(PacketTypes.CONNECT)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def test_connack_says_what_the_server_supports_and_assigns_a_client_id(broker):
    client = Client(broker, "", version=5).connect()
    try:
        properties = client.connack[2]
        assert not hasattr(properties, "MaximumQoS")  # (2: QoS 2 publishes are taken; subscriptions get 1)
        assert properties.ReceiveMaximum == 1024
        assert properties.RetainAvailable == 1
        assert properties.TopicAliasMaximum == 16
        assert properties.SharedSubscriptionAvailable == 1
        assert properties.SubscriptionIdentifierAvailable == 1
        assert len(properties.AssignedClientIdentifier) == 22
    finally:
        client.disconnect()


def test_user_properties_content_type_response_topic_and_correlation_data_reach_a_5_0_subscriber(broker, unique):
    with v5(broker, f"{unique}-s") as subscriber, v5(broker, f"{unique}-p") as publisher:
        subscriber.subscribe(f"{unique}/req", qos=1)
        properties = user_properties(("region", "eu"), ("unit", "C"), ContentType="text/plain",
                                     ResponseTopic=f"{unique}/replies/1", CorrelationData=b"\x00\x01id")
        publisher.publish(f"{unique}/req", b"21.5", qos=1, properties=properties)
        got = subscriber.receive().properties
        assert sorted(got.UserProperty) == [("region", "eu"), ("unit", "C")]
        assert (got.ContentType, got.ResponseTopic, got.CorrelationData) == (
            "text/plain", f"{unique}/replies/1", b"\x00\x01id")


def test_5_0_properties_are_amqp_properties_for_an_amqp_consumer(broker, unique):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        channel.queue_declare(unique, exclusive=True)
        channel.queue_bind(unique, "amq.topic", f"{unique}.req")
        with v5(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/req", b"x", qos=1, properties=user_properties(
                ("region", "eu"), ContentType="application/json", ResponseTopic=f"{unique}/replies",
                CorrelationData=b"42", MessageExpiryInterval=60))
        method, properties, body = next(channel.consume(unique, inactivity_timeout=10))
        assert (properties.content_type, properties.reply_to, properties.correlation_id, properties.expiration) == (
            "application/json", f"{unique}.replies", "42", "60000")
        assert properties.headers["region"] == "eu"
    finally:
        connection.close()


def test_deliveries_carry_the_identifier_of_the_subscription_they_match(broker, unique):
    with v5(broker, f"{unique}-s") as subscriber, v5(broker, f"{unique}-p") as publisher:
        identified = Properties(PacketTypes.SUBSCRIBE)
        identified.SubscriptionIdentifier = 7
        subscriber.subscribe(f"{unique}/a/#", qos=1, properties=identified)
        publisher.publish(f"{unique}/a/b", b"x", qos=1)
        assert subscriber.receive().properties.SubscriptionIdentifier == [7]


def test_a_topic_alias_stands_for_its_topic(broker, unique):
    with v5(broker, f"{unique}-s") as subscriber:
        subscriber.subscribe(f"{unique}/long/topic/name", qos=1)
        raw = RawClient(broker)
        raw.send(connect_packet(f"{unique}-raw", level=5))
        assert raw.read(3)[:1] == b"\x20"
        topic = f"{unique}/long/topic/name".encode()
        # PUBLISH QoS 0 with the topic and alias 1, then with no topic and alias 1
        first = len(topic).to_bytes(2, "big") + topic + b"\x03\x23\x00\x01" + b"first"
        second = b"\x00\x00\x03\x23\x00\x01" + b"second"
        raw.send(bytes((0x30, len(first))) + first + bytes((0x30, len(second))) + second)
        assert [subscriber.receive().payload, subscriber.receive().payload] == [b"first", b"second"]
        raw.close()


def test_an_unknown_topic_alias_ends_the_connection_with_a_protocol_error(broker, unique):
    raw = RawClient(broker)
    raw.send(connect_packet(f"{unique}-raw", level=5))
    connack = raw.read(2)
    raw.read(connack[1])
    raw.send(b"\x30\x07\x00\x00\x03\x23\x00\x09x")  # PUBLISH with no topic and alias 9, never set
    assert raw.read(4) == b"\xe0\x02\x82\x00"  # DISCONNECT, protocol error
    assert raw.closed()
    raw.close()


def test_a_session_with_an_expiry_interval_outlives_the_connection(broker, unique):
    first = Client(broker, f"{unique}-s", version=5, clean=False)
    first.connect(connect_properties(SessionExpiryInterval=60))
    first.subscribe(f"{unique}/a", qos=1)
    first.disconnect()
    with v5(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/a", b"kept", qos=1)
    again = Client(broker, f"{unique}-s", version=5, clean=False)
    again.connect(connect_properties(SessionExpiryInterval=0))
    try:
        assert again.connack[0] is True
        assert again.receive().payload == b"kept"
    finally:
        again.disconnect()
    last = Client(broker, f"{unique}-s", version=5, clean=False).connect()
    try:
        assert last.connack[0] is False  # expiry 0 ended the session with its connection
    finally:
        last.disconnect()


def test_a_message_expiry_interval_is_a_per_message_ttl(broker, unique):
    first = Client(broker, f"{unique}-s", version=5, clean=False)
    first.connect(connect_properties(SessionExpiryInterval=60))
    first.subscribe(f"{unique}/a", qos=1)
    first.disconnect()
    with v5(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/a", b"expires", qos=1, properties=user_properties(MessageExpiryInterval=1))
        publisher.publish(f"{unique}/a", b"stays", qos=1)
    time.sleep(1.2)  # (the expiry itself is what is tested)
    again = Client(broker, f"{unique}-s", version=5, clean=False)
    again.connect(connect_properties(SessionExpiryInterval=0))
    try:
        assert again.receive().payload == b"stays"
        again.nothing_more()
    finally:
        again.disconnect()


def test_a_shared_subscription_hands_each_message_to_one_member(broker, unique):
    with v5(broker, f"{unique}-m1") as one, v5(broker, f"{unique}-m2") as two, \
            v5(broker, f"{unique}-p") as publisher:
        assert [code.value for code in one.subscribe(f"$share/workers/{unique}/jobs/+", qos=1)] == [1]
        assert [code.value for code in two.subscribe(f"$share/workers/{unique}/jobs/+", qos=1)] == [1]
        for number in range(10):
            publisher.publish(f"{unique}/jobs/{number}", b"%d" % number, qos=1)
        received: dict[bytes, str] = {}
        deadline = time.monotonic() + 10
        while len(received) < 10 and time.monotonic() < deadline:
            for name, member in (("one", one), ("two", two)):
                while not member.messages.empty():
                    received[member.receive().payload] = name
        assert sorted(received) == sorted(b"%d" % n for n in range(10))
        assert set(received.values()) == {"one", "two"}  # in turn
        one.nothing_more(0.1)
        two.nothing_more(0.1)


def test_reason_codes_of_suback_and_unsuback(broker, unique):
    with v5(broker, f"{unique}-s") as client:
        assert [code.value for code in client.unsubscribe(f"{unique}/never")] == [0x11]
        client.subscribe(f"{unique}/a", qos=1)
        assert [code.value for code in client.unsubscribe(f"{unique}/a")] == [0x00]
    raw = RawClient(broker)  # (paho refuses to send a bad filter)
    raw.send(connect_packet(f"{unique}-raw", level=5))
    connack = raw.read(2)
    raw.read(connack[1])
    bad = f"{unique}/a/#/b".encode()
    body = b"\x00\x05\x00" + len(bad).to_bytes(2, "big") + bad + b"\x01"
    raw.send(bytes((0x82, len(body))) + body)
    assert raw.read(6) == b"\x90\x04\x00\x05\x00\x8f"  # SUBACK: topic filter invalid
    raw.close()


def test_a_takeover_tells_a_5_0_client_why(broker, unique):
    first = Client(broker, f"{unique}-same", version=5).connect()
    with v5(broker, f"{unique}-same"):
        assert first.disconnected.wait(10)
        assert first.disconnect_reason.value == 0x8E
    first.paho.loop_stop()


def will_properties(**values) -> Properties:
    properties = Properties(PacketTypes.WILLMESSAGE)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def test_a_will_delay_holds_the_will_back_and_a_reconnection_cancels_it(broker, unique):
    with v5(broker, f"{unique}-w") as watcher:
        watcher.subscribe(f"{unique}/status", qos=1)
        dying = Client(broker, f"{unique}-d", version=5, clean=False)
        dying.paho.will_set(f"{unique}/status", b"gone", 1, properties=will_properties(WillDelayInterval=1))
        dying.connect(connect_properties(SessionExpiryInterval=60))
        dropped = time.monotonic()
        dying.drop()
        assert watcher.receive().payload == b"gone"
        assert time.monotonic() - dropped >= 0.9  # (not at once)
        back = Client(broker, f"{unique}-b", version=5, clean=False)
        back.paho.will_set(f"{unique}/status", b"back gone", 1, properties=will_properties(WillDelayInterval=1))
        back.connect(connect_properties(SessionExpiryInterval=60))
        back.drop()
        with v5(broker, f"{unique}-b", clean=False):  # the session taken up again within the delay
            watcher.subscribe(f"{unique}/marker", qos=1)
            time.sleep(1.2)  # (past the delay: the will is not published)
            with v5(broker, f"{unique}-p") as publisher:
                publisher.publish(f"{unique}/marker", b"m", qos=1)
            assert watcher.receive().payload == b"m"
            watcher.nothing_more()


def test_retain_as_published_keeps_the_retain_flag_of_a_live_message(broker, unique):
    with v5(broker, f"{unique}-s") as subscriber, v5(broker, f"{unique}-p") as publisher:
        subscriber.paho.subscribe(f"{unique}/kept", options=SubscribeOptions(qos=1, retainAsPublished=True))
        subscriber.subacks.get(timeout=10)
        subscriber.subscribe(f"{unique}/plain", qos=1)
        publisher.publish(f"{unique}/kept", b"a", qos=1, retain=True)
        publisher.publish(f"{unique}/plain", b"b", qos=1, retain=True)
        assert [(m.payload, m.retain) for m in (subscriber.receive(), subscriber.receive())] == [
            (b"a", True), (b"b", False)]


def test_a_message_matching_two_subscriptions_comes_once_with_both_identifiers(broker, unique):
    with v5(broker, f"{unique}-s") as subscriber, v5(broker, f"{unique}-p") as publisher:
        for identifier, topic_filter in ((2, f"{unique}/a"), (3, f"{unique}/#")):
            properties = Properties(PacketTypes.SUBSCRIBE)
            properties.SubscriptionIdentifier = identifier
            subscriber.subscribe(topic_filter, qos=1, properties=properties)
        publisher.publish(f"{unique}/a", b"x", qos=1)
        assert sorted(subscriber.receive().properties.SubscriptionIdentifier) == [2, 3]
        subscriber.nothing_more()


def test_a_no_local_subscription_takes_no_message_of_its_own_connection(broker, unique):
    with v5(broker, f"{unique}-a") as client, v5(broker, f"{unique}-b") as other:
        client.paho.subscribe(f"{unique}/chat", options=SubscribeOptions(qos=1, noLocal=True))
        client.subacks.get(timeout=10)
        client.publish(f"{unique}/chat", b"mine", qos=1)
        other.publish(f"{unique}/chat", b"theirs", qos=1)
        assert client.receive().payload == b"theirs"
        client.nothing_more()


def test_a_message_expiry_interval_reaches_the_subscriber_as_what_is_left_of_it(broker, unique):
    first = Client(broker, f"{unique}-s", version=5, clean=False)
    first.connect(connect_properties(SessionExpiryInterval=60))
    first.subscribe(f"{unique}/a", qos=1)
    first.disconnect()
    with v5(broker, f"{unique}-p") as publisher:
        publisher.publish(f"{unique}/a", b"x", qos=1, properties=user_properties(MessageExpiryInterval=10))
    time.sleep(2.1)  # (the time it waits is what is tested)
    again = Client(broker, f"{unique}-s", version=5, clean=False)
    again.connect(connect_properties(SessionExpiryInterval=0))
    try:
        assert again.receive().properties.MessageExpiryInterval in (7, 8)
    finally:
        again.disconnect()


def test_the_server_names_topics_by_alias_where_the_client_takes_them(broker, unique):
    client = Client(broker, f"{unique}-s", version=5)
    client.connect(connect_properties(TopicAliasMaximum=1))
    try:
        client.subscribe(f"{unique}/#", qos=1)
        with v5(broker, f"{unique}-p") as publisher:
            for topic in ("a", "a", "b"):
                publisher.publish(f"{unique}/{topic}", topic.encode(), qos=1)
        received = [client.receive() for _ in range(3)]
        # (paho hands a PUBLISH on as it came: the topic the first time, then the alias alone; its one alias taken,
        # the next topic goes without)
        assert [(m.topic, getattr(m.properties, "TopicAlias", None)) for m in received] == [
            (f"{unique}/a", 1), ("", 1), (f"{unique}/b", None)]
    finally:
        client.disconnect()


def test_a_session_ends_when_its_expiry_interval_has_passed_as_its_disconnect_last_set_it(broker, unique):
    def session_present(expiry: int) -> bool:
        client = Client(broker, f"{unique}-s", version=5, clean=False)
        client.connect(connect_properties(SessionExpiryInterval=expiry))
        present = client.connack[0]
        client.subscribe(f"{unique}/a", qos=1)
        properties = Properties(PacketTypes.DISCONNECT)
        properties.SessionExpiryInterval = 3  # (longer than CONNECT's 1)
        client.paho.disconnect(properties=properties) if expiry == 1 else client.paho.disconnect()
        client.disconnected.wait(10)
        client.paho.loop_stop()
        return present

    assert session_present(1) is False
    time.sleep(1.5)  # (past CONNECT's interval, within DISCONNECT's: the waiting is what is tested)
    assert session_present(2) is True
    time.sleep(2.5)  # (past this connection's 2 s)
    assert session_present(0) is False


def test_enhanced_authentication_is_refused_with_bad_authentication_method(broker, unique):
    """A CONNECT that names an authentication method (5.0's enhanced authentication, which RabbitMQ has not either)
    is refused with CONNACK 0x8C, whatever its user name and password."""
    properties = Properties(PacketTypes.CONNECT)
    properties.AuthenticationMethod = "SCRAM-SHA-256"
    client = Client(broker, unique, version=5).connect(properties, expect_success=False)
    try:
        assert client.connack is not None and client.connack[1].value == 0x8C
        assert client.disconnected.wait(10)
    finally:
        client.paho.loop_stop()


def test_a_session_waiting_to_expire_ends_when_due_after_a_restart(own_broker, unique):
    """A session's expiry is kept across a restart: its queue goes when the interval ends, not a day later (the
    longest a session's queue waits unused)."""
    broker = own_broker()
    wait_for_port(broker.host, broker.management_port, broker.process)
    client = Client(broker, f"{unique}-s", version=5, clean=False)
    client.connect(connect_properties(SessionExpiryInterval=4))
    client.subscribe(f"{unique}/a", qos=1)
    client.disconnect()
    queue = f"/api/queues/%2F/{quote(f'mqtt-subscription-{unique}-sqos1')}"
    assert request(broker, "GET", queue).status == 200
    broker.restart()  # (stopped as an operator stops it: a kill at once may come before the disk has the session)
    wait_for_port(broker.host, broker.management_port, broker.process)
    wait_for(lambda: request(broker, "GET", queue).status == 404, 30, "the session's queue deleted when it was due")


def test_a_held_will_goes_when_due_after_a_restart(own_broker, unique):
    broker = own_broker()
    wait_for_port(broker.host, broker.management_port, broker.process)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    channel.queue_declare(unique, durable=True)
    channel.queue_bind(unique, "amq.topic", f"{unique}.status")
    connection.close()
    dying = Client(broker, f"{unique}-d", version=5, clean=False)
    dying.paho.will_set(f"{unique}/status", b"gone", 1, properties=will_properties(WillDelayInterval=10))
    dying.connect(connect_properties(SessionExpiryInterval=60))
    dying.drop()
    wait_until_gone(broker, f"{unique}-d")
    assert request(broker, "GET", f"/api/queues/%2F/{quote(unique)}").body["messages"] == 0  # (held back)
    broker.restart()  # (stopped as an operator stops it: a kill at once may come before the disk has the will)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        method, _, body = next(connection.channel().consume(unique, inactivity_timeout=30))
        assert (method.routing_key, body) == (f"{unique}.status", b"gone")
    finally:
        connection.close()


def test_the_receive_maximum_bounds_what_every_subscription_of_a_client_has_in_flight(broker, unique):
    """A client's receive maximum is the connection's: a plain and a shared subscription together send no more
    unacknowledged QoS 1 messages than it."""
    client = Client(broker, f"{unique}-s", version=5, auto_ack=False)
    client.connect(connect_properties(ReceiveMaximum=2))
    try:
        client.subscribe(f"{unique}/a/#", qos=1)
        client.subscribe(f"$share/g/{unique}/b/#", qos=1)
        with v5(broker, f"{unique}-p") as publisher:
            for number in range(4):
                publisher.publish(f"{unique}/a/{number}", b"a", qos=1)
                publisher.publish(f"{unique}/b/{number}", b"b", qos=1)
        first = [client.receive(), client.receive()]
        client.nothing_more(wait=0.5)
        client.paho.ack(first[0].mid, 1)
        client.receive()
        client.nothing_more(wait=0.5)
    finally:
        client.disconnect()


def test_a_no_local_subscription_takes_no_message_of_an_earlier_connection_of_its_client(broker, unique):
    """no_local is about the client id: a message the client published, still queued when its connection went, is
    not delivered to the next connection of its session."""
    first = Client(broker, f"{unique}-c", version=5, clean=False, auto_ack=False)
    first.connect(connect_properties(ReceiveMaximum=1, SessionExpiryInterval=60))
    first.paho.subscribe(f"{unique}/chat", options=SubscribeOptions(qos=1, noLocal=True))
    first.subacks.get(timeout=10)
    with v5(broker, f"{unique}-other") as other:
        other.publish(f"{unique}/chat", b"from another", qos=1)
    assert first.receive().payload == b"from another"  # (unacknowledged: the receive maximum holds what follows)
    first.publish(f"{unique}/chat", b"its own", qos=1)
    first.drop()
    wait_until_gone(broker, f"{unique}-c")
    again = Client(broker, f"{unique}-c", version=5, clean=False)
    again.connect(connect_properties(SessionExpiryInterval=0))
    try:
        assert again.receive().payload == b"from another"
        again.nothing_more()
    finally:
        again.disconnect()


def test_a_persistent_sessions_subscriptions_keep_their_options_across_a_restart(own_broker, unique):
    """Subscriptions are session state: taken up after a restart, without subscribing again, the session's
    subscription delivers with its identifier and its retain-as-published option, and unsubscribing ends it."""
    broker = own_broker()
    first = Client(broker, f"{unique}-s", version=5, clean=False)
    first.connect(connect_properties(SessionExpiryInterval=600))
    identified = Properties(PacketTypes.SUBSCRIBE)
    identified.SubscriptionIdentifier = 7
    first.paho.subscribe(f"{unique}/a/#", options=SubscribeOptions(qos=1, retainAsPublished=True),
                         properties=identified)
    first.subacks.get(timeout=10)
    first.disconnect()
    broker.restart()
    again = Client(broker, f"{unique}-s", version=5, clean=False)
    again.connect(connect_properties(SessionExpiryInterval=0))
    try:
        assert again.connack[0] is True
        with v5(broker, f"{unique}-p") as publisher:
            publisher.publish(f"{unique}/a/b", b"x", qos=1, retain=True)
            message = again.receive()
            assert (message.payload, message.retain, message.properties.SubscriptionIdentifier) == (b"x", True, [7])
            assert [code.value for code in again.unsubscribe(f"{unique}/a/#")] == [0]
            publisher.publish(f"{unique}/a/b", b"y", qos=1)
            again.nothing_more()
    finally:
        again.disconnect()
