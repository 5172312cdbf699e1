"""The same broker through aiomqtt (asyncio, on paho-mqtt): publish and subscribe, retained messages, 5.0 properties
and a will, as an asyncio service would use them."""

from __future__ import annotations

import asyncio

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.integration.helpers import rabbitmq4
from tests.mqtt.clients import RawClient, connect_packet

TIMEOUT = 10


def client(broker, identifier: str, **options) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", broker.mqtt_port, identifier=identifier, username="guest", password="guest",
                          **options)


async def first_message(subscriber: aiomqtt.Client) -> aiomqtt.Message:
    async with asyncio.timeout(TIMEOUT):
        async for message in subscriber.messages:
            return message
    raise AssertionError("no message")


def test_publish_and_subscribe_at_qos1(broker, unique):
    async def scenario() -> aiomqtt.Message:
        async with client(broker, f"{unique}-s") as subscriber, client(broker, f"{unique}-p") as publisher:
            await subscriber.subscribe(f"{unique}/+/t", qos=1)
            await publisher.publish(f"{unique}/room/t", b"21.5", qos=1)
            return await first_message(subscriber)
    message = asyncio.run(scenario())
    assert (str(message.topic), message.payload, message.qos) == (f"{unique}/room/t", b"21.5", 1)


def test_a_retained_message_reaches_a_later_subscriber(broker, unique):
    async def scenario() -> aiomqtt.Message:
        async with client(broker, f"{unique}-p") as publisher:
            await publisher.publish(f"{unique}/state", b"on", qos=1, retain=True)
        async with client(broker, f"{unique}-s") as subscriber:
            await subscriber.subscribe(f"{unique}/state", qos=1)
            return await first_message(subscriber)
    message = asyncio.run(scenario())
    assert (message.payload, message.retain) == (b"on", True)


@rabbitmq4
def test_5_0_user_properties_and_response_topic(broker, unique):
    async def scenario() -> aiomqtt.Message:
        v5 = {"protocol": aiomqtt.ProtocolVersion.V5}
        async with client(broker, f"{unique}-s", **v5) as subscriber, client(broker, f"{unique}-p", **v5) as publisher:
            await subscriber.subscribe(f"{unique}/req", qos=1)
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = [("trace", "abc")]
            properties.ResponseTopic = f"{unique}/reply"
            await publisher.publish(f"{unique}/req", b"?", qos=1, properties=properties)
            return await first_message(subscriber)
    message = asyncio.run(scenario())
    assert message.properties.UserProperty == [("trace", "abc")]
    assert message.properties.ResponseTopic == f"{unique}/reply"


def test_the_will_of_a_client_that_drops(broker, unique):
    async def scenario() -> aiomqtt.Message:
        async with client(broker, f"{unique}-w") as watcher:
            await watcher.subscribe(f"{unique}/status", qos=1)
            dying = RawClient(broker)  # (a client that drops: its socket goes without DISCONNECT)
            dying.send(connect_packet(f"{unique}-d", will=(f"{unique}/status", b"offline")))
            assert dying.read(4) == b"\x20\x02\x00\x00"
            dying.close()
            return await first_message(watcher)
    assert asyncio.run(scenario()).payload == b"offline"
