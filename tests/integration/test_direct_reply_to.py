"""Direct reply-to: replies to amq.rabbitmq.reply-to.<token> go straight to the requesting channel."""

import pika
import pytest

from tests.integration.helpers import channel_error, connect, wait_until

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"


def test_a_reply_reaches_the_requesting_consumer(broker):
    replies = []
    with connect(broker) as conn:
        client = conn.channel()
        client.basic_consume(PSEUDO_QUEUE, lambda ch, method, properties, body: replies.append((method, body)),
                             auto_ack=True)
        server = conn.channel()
        requests = server.queue_declare("", exclusive=True).method.queue
        client.basic_publish("", requests, b"request", pika.BasicProperties(reply_to=PSEUDO_QUEUE))
        request = []
        wait_until(conn, lambda: request.append(server.basic_get(requests, auto_ack=True)) or request[-1][0])
        method, properties, body = request[-1]
        assert body == b"request"
        assert properties.reply_to.startswith(PSEUDO_QUEUE + ".")
        server.basic_publish("", properties.reply_to, b"response")
        wait_until(conn, lambda: replies)
        method, body = replies[0]
        assert (body, method.routing_key, method.exchange, method.redelivered, method.delivery_tag) == (
            b"response", properties.reply_to, "", False, 1)
        assert client.queue_declare(PSEUDO_QUEUE, passive=True).method.consumer_count == 1


@pytest.mark.parametrize("action, text", [
    (lambda ch: ch.basic_consume(PSEUDO_QUEUE, lambda *args: None, auto_ack=False),
     "PRECONDITION_FAILED - reply consumer cannot acknowledge"),
    (lambda ch: (ch.basic_publish("", "anywhere", b"x", pika.BasicProperties(reply_to=PSEUDO_QUEUE)),
                 ch.basic_qos(prefetch_count=1)),
     "PRECONDITION_FAILED - fast reply consumer does not exist"),
    (lambda ch: (ch.basic_consume(PSEUDO_QUEUE, lambda *args: None, auto_ack=True),
                 ch.basic_consume(PSEUDO_QUEUE, lambda *args: None, auto_ack=True)),
     "PRECONDITION_FAILED - reply consumer already set"),
], ids=["with-acks", "request-without-consumer", "second-consumer"])
def test_misuse_closes_the_channel_with_406(broker, action, text):
    with connect(broker) as conn:
        ch = conn.channel()
        assert channel_error(lambda: action(ch), ch) == (406, text)


def test_a_reply_to_an_unknown_token_is_dropped_silently(broker):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.basic_publish("", PSEUDO_QUEUE + ".no-such-channel", b"lost")
        ch.basic_qos(prefetch_count=1)  # a round trip: the channel is still open
        assert ch.is_open
