"""The x-delayed-message exchange, compatible with the community plugin rabbitmq-delayed-message-exchange (its
behaviour checked against the plugin's source: the reference RabbitMQ has no such plugin, so these tests run on
Warren only). Beyond the plugin, a confirmed persistent message waiting in a durable delayed exchange survives a
kill -9."""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    Inbox, beyond_rabbitmq, channel_error, connect, consume, declare_queue, reply_text, stay_quiet, wait_until,
)

pytestmark = beyond_rabbitmq

DELAY_MS = 400


def delayed(delay, **kwargs) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-delay": delay}, **kwargs)


def delayed_exchange(channel, name: str, routing: str = "direct", durable: bool = False) -> None:
    channel.exchange_declare(name, "x-delayed-message", durable=durable, arguments={"x-delayed-type": routing})


@pytest.mark.parametrize("arguments, text", [
    ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": 5}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ({"x-delayed-type": "x-delayed-message"}, "Invalid argument, 'x-delayed-message' can't be used for "
                                              "'x-delayed-type'"),
    ({"x-delayed-type": "nosuch"}, "unknown exchange type 'nosuch'"),
])
def test_the_routing_type_must_be_an_exchange_type(channel, unique, arguments, text):
    assert channel_error(lambda: channel.exchange_declare(unique, "x-delayed-message", arguments=arguments)) == (
        406, reply_text(f"PRECONDITION_FAILED - {text}"))


def test_messages_wait_their_delay_and_arrive_by_due_time(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    inbox = Inbox()
    consume(channel, unique, inbox, auto_ack=True)
    published = time.monotonic()
    channel.basic_publish(unique, "key", b"later", delayed(2 * DELAY_MS))
    channel.basic_publish(unique, "key", b"sooner", delayed(DELAY_MS))
    channel.basic_publish(unique, "key", b"now")  # no x-delay: routed at once
    assert inbox.wait_for(conn, 1)[0].body == b"now"
    assert inbox.wait_for(conn, 2)[1].body == b"sooner"
    assert time.monotonic() - published >= DELAY_MS / 1000
    assert inbox.wait_for(conn, 3)[2].body == b"later"
    assert time.monotonic() - published >= 2 * DELAY_MS / 1000


def test_a_routed_message_carries_its_delay_negated(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    received = []
    channel.basic_consume(unique, lambda _ch, _method, properties, _body: received.append(properties.headers),
                          auto_ack=True)
    channel.basic_publish(unique, "key", b"m", delayed(50, delivery_mode=2))
    wait_until(conn, lambda: received)
    assert received == [{"x-delay": -50}]


@pytest.mark.parametrize("value", [0, -100, "soon", True, 4294967296])
def test_other_delays_route_at_once(conn, unique, value):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    _, inbox = consume(channel, unique, auto_ack=True)
    channel.basic_publish(unique, "key", b"m", delayed(value))
    assert inbox.wait_for(conn, 1, timeout=1)[0].body == b"m"


def test_a_numeric_string_delay_counts(conn, unique):
    """The plugin converts a string x-delay to an integer."""
    channel = conn.channel()
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    _, inbox = consume(channel, unique, auto_ack=True)
    channel.basic_publish(unique, "key", b"m", delayed(str(DELAY_MS)))
    stay_quiet(conn, DELAY_MS / 1000 / 2)
    assert not inbox.deliveries
    inbox.wait_for(conn, 1)


def test_routing_follows_the_delayed_type_and_the_bindings_at_due_time(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique, "topic")
    declare_queue(channel, unique)
    channel.basic_publish(unique, "orders.eu.new", b"m", delayed(DELAY_MS))
    channel.queue_bind(unique, unique, "orders.*.new")  # bound after the publish, before the message is due
    _, inbox = consume(channel, unique, auto_ack=True)
    assert inbox.wait_for(conn, 1)[0].body == b"m"


def test_a_headers_delayed_exchange_matches_headers(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique, "headers")
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, arguments={"x-match": "all", "kind": "order"})
    _, inbox = consume(channel, unique, auto_ack=True)
    channel.basic_publish(unique, "", b"other", pika.BasicProperties(headers={"x-delay": 50, "kind": "invoice"}))
    channel.basic_publish(unique, "", b"order", pika.BasicProperties(headers={"x-delay": 50, "kind": "order"}))
    assert [delivery.body for delivery in inbox.wait_for(conn, 1)] == [b"order"]
    stay_quiet(conn)
    assert len(inbox.deliveries) == 1


def test_a_delayed_publish_is_confirmed_at_once_and_never_returned(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args))
    channel.confirm_delivery()
    started = time.monotonic()
    channel.basic_publish(unique, "nowhere", b"m", delayed(60_000), mandatory=True)  # confirmed, not routed yet
    assert time.monotonic() - started < 5
    stay_quiet(conn)
    assert returned == []


def test_the_management_api_shows_type_and_waiting_messages(broker, conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    channel.confirm_delivery()
    channel.basic_publish(unique, "key", b"m", delayed(60_000))
    shown = management.request(broker, "GET", f"/api/exchanges/%2F/{unique}").body
    assert (shown["type"], shown["arguments"], shown["messages_delayed"]) == (
        "x-delayed-message", {"x-delayed-type": "direct"}, 1)
    channel.exchange_delete(unique)


def test_a_message_published_through_the_api_waits_its_delay_too(broker, conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    published = time.monotonic()
    reply = management.request(broker, "POST", f"/api/exchanges/%2F/{unique}/publish", {
        "routing_key": "key", "payload": "later", "payload_encoding": "string",
        "properties": {"headers": {"x-delay": DELAY_MS}}})
    assert reply == (200, {"routed": False})  # the plugin routes it to no queue when it is published
    assert management.request(broker, "GET", f"/api/exchanges/%2F/{unique}").body["messages_delayed"] == 1
    inbox = Inbox()
    consume(channel, unique, inbox, auto_ack=True)
    assert inbox.wait_for(conn, 1)[0].body == b"later"
    assert time.monotonic() - published >= DELAY_MS / 1000


def test_deleting_the_exchange_drops_its_waiting_messages(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, unique)
    channel.confirm_delivery()
    channel.basic_publish(unique, "key", b"m", delayed(DELAY_MS))
    channel.exchange_delete(unique)
    delayed_exchange(channel, unique)
    declare_queue(channel, unique)
    channel.queue_bind(unique, unique, "key")
    _, inbox = consume(channel, unique, auto_ack=True)
    stay_quiet(conn, DELAY_MS / 1000 * 2)
    assert inbox.deliveries == []


def test_a_delayed_dead_letter_exchange_delays_dead_letters(conn, unique):
    channel = conn.channel()
    delayed_exchange(channel, f"{unique}-retry")
    declare_queue(channel, f"{unique}-work", arguments={"x-dead-letter-exchange": f"{unique}-retry"})
    declare_queue(channel, f"{unique}-later")
    channel.queue_bind(f"{unique}-later", f"{unique}-retry", f"{unique}-work")
    channel.basic_publish("", f"{unique}-work", b"m", delayed(DELAY_MS))
    method, _, _ = channel.basic_get(f"{unique}-work")
    rejected = time.monotonic()
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, inbox = consume(channel, f"{unique}-later", auto_ack=True)
    assert inbox.wait_for(conn, 1)[0].body == b"m"
    assert time.monotonic() - rejected >= DELAY_MS / 1000


def test_a_confirmed_persistent_delayed_message_survives_a_kill(own_broker, unique):
    broker = own_broker()
    with connect(broker) as conn:
        channel = conn.channel()
        delayed_exchange(channel, unique, durable=True)
        declare_queue(channel, unique, durable=True)
        channel.queue_bind(unique, unique, "key")
        channel.confirm_delivery()
        published = time.monotonic()  # before the broker reads the publish, so the delay measured is never short
        channel.basic_publish(unique, "key", b"kept", delayed(1500, delivery_mode=2))
        channel.basic_publish(unique, "key", b"transient", delayed(1500))
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        channel = conn.channel()
        _, inbox = consume(channel, unique, auto_ack=True)
        assert [delivery.body for delivery in inbox.wait_for(conn, 1)] == [b"kept"]
        assert time.monotonic() - published >= 1.5  # at its original due time
        stay_quiet(conn)
        assert len(inbox.deliveries) == 1  # the transient one was in memory only
