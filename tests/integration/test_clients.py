"""Round trips through the other popular Python clients: aio-pika (asyncio) and kombu (Celery's, over py-amqp)."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq.exceptions
import kombu
import pamqp.commands
import pytest

from tests.integration.helpers import EVENT_TIMEOUT


def run(coroutine):
    """Run an asyncio scenario with an overall deadline."""
    return asyncio.run(asyncio.wait_for(coroutine, EVENT_TIMEOUT * 2))


def test_aio_pika_declare_publish_consume_ack_with_confirms(broker, unique):
    async def scenario():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True)
            queue = await ch.declare_queue(unique, exclusive=True)
            for index in range(5):
                confirmation = await ch.default_exchange.publish(
                    aio_pika.Message(f"m-{index}".encode(), headers={"index": index}), routing_key=queue.name)
                assert isinstance(confirmation, pamqp.commands.Basic.Ack)
            declared = await ch.declare_queue(unique, passive=True)
            assert declared.declaration_result.message_count == 5
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    received.append((message.body, message.headers["index"], message.delivery_tag,
                                     message.redelivered))
                    await message.ack()
                    if len(received) == 5:
                        break
            assert received == [(f"m-{index}".encode(), index, index + 1, False) for index in range(5)]
            assert (await ch.declare_queue(unique, passive=True)).declaration_result.message_count == 0

    run(scenario())


def test_aio_pika_unroutable_mandatory_publish_raises_with_on_return_raises(broker, unique):
    async def scenario():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(aiormq.exceptions.DeliveryError) as failed:
                await ch.default_exchange.publish(aio_pika.Message(b"lost"), routing_key=f"{unique}-nowhere",
                                                  mandatory=True)
            returned = failed.value.frame
            assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")

    run(scenario())


def test_aio_pika_get_and_reject_requeue(broker, unique):
    async def scenario():
        async with await aio_pika.connect(broker.url) as conn:
            ch = await conn.channel()
            queue = await ch.declare_queue(unique, exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"again"), routing_key=queue.name)
            first = await queue.get(timeout=EVENT_TIMEOUT)
            await first.reject(requeue=True)
            second = await queue.get(timeout=EVENT_TIMEOUT)
            assert (second.body, second.redelivered) == (b"again", True)
            await second.ack()

    run(scenario())


def test_kombu_produce_consume_round_trip(broker, unique):
    url = f"pyamqp://guest:guest@{broker.host}:{broker.port}//"
    exchange = kombu.Exchange(unique, type="direct", auto_delete=True, durable=False)
    queue = kombu.Queue(unique, exchange, routing_key="work", auto_delete=True, durable=False)
    received = []

    def on_message(body, message):
        received.append((body, message.content_type, message.delivery_info["routing_key"]))
        message.ack()

    with kombu.Connection(url, connect_timeout=EVENT_TIMEOUT) as conn:
        with conn.Consumer(queue, callbacks=[on_message]):
            producer = conn.Producer(serializer="json")
            producer.publish({"task": "add", "args": [2, 3]}, exchange=exchange, routing_key="work",
                             declare=[queue])
            while not received:
                conn.drain_events(timeout=EVENT_TIMEOUT)
    assert received == [({"task": "add", "args": [2, 3]}, "application/json", "work")]
