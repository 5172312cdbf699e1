"""Publisher flow control must never stall a client that publishes to a queue it also consumes from."""

from tests.integration.helpers import connect, declare_queue, wait_until

MESSAGES = 20_000  # well above the backlog at which a queue holds its publishers back


def test_a_connection_publishing_to_its_own_manual_ack_consumer_gets_everything(broker, unique):
    received = []
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique, exclusive=True)
        ch.basic_qos(prefetch_count=10)

        def on_message(channel, method, properties, body):
            received.append(body)
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume(queue, on_message)
        for index in range(MESSAGES):
            ch.basic_publish("", queue, str(index).encode())
        wait_until(conn, lambda: len(received) == MESSAGES, timeout=60)
    assert received == [str(index).encode() for index in range(MESSAGES)]
