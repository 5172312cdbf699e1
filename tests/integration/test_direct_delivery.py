"""A message that finds an idle consumer goes straight to it, as in RabbitMQ: a length limit or a TTL of 0 only
applies to messages that have to wait in the queue."""

import pika
import pytest

from tests.integration.helpers import connect, wait_until

COUNT = 50


@pytest.mark.parametrize("arguments, properties", [
    ({"x-message-ttl": 0}, None),
    ({}, pika.BasicProperties(expiration="0")),
    ({"x-max-length": 0}, None),
    ({"x-max-length": 1, "x-overflow": "reject-publish"}, None),
], ids=["queue-ttl-0", "message-expiration-0", "max-length-0", "max-length-1-reject"])
def test_an_idle_consumer_gets_every_message(broker, unique, arguments, properties):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, exclusive=True, arguments=arguments)
        received = []
        ch.basic_consume(unique, lambda _ch, _method, _props, body: received.append(body), auto_ack=True)
        publisher = conn.channel()
        publisher.confirm_delivery()
        for index in range(COUNT):
            publisher.basic_publish("", unique, str(index).encode(), properties)
            wait_until(conn, lambda: len(received) == index + 1)  # the consumer is idle again before the next
        assert received == [str(index).encode() for index in range(COUNT)]
