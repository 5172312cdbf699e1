"""Above its memory limit the broker blocks connections that publish (connection.blocked "low on memory", as
RabbitMQ does) and keeps serving the ones that only consume."""

import pika

from tests.integration.helpers import wait_until


def test_publishers_are_blocked_and_consumers_go_on(own_broker, tmp_path, unique):
    config = tmp_path / "warren.toml"
    config.write_text("[server]\nmemory_limit = 1\n")  # any broker is above one byte: the alarm is on from the start
    broker = own_broker("--config", str(config))
    consumer = pika.BlockingConnection(pika.URLParameters(broker.url))
    consumer_channel = consumer.channel()
    consumer_channel.queue_declare(unique)
    blocked = []
    publisher = pika.BlockingConnection(pika.URLParameters(broker.url))
    publisher.add_on_connection_blocked_callback(lambda connection, frame: blocked.append(frame.method.reason))
    publisher.channel().basic_publish("", unique, b"first")
    wait_until(publisher, lambda: blocked)
    assert blocked == ["low on memory"]
    # The message published before the block is there, and a connection that does not publish is served.
    method, _properties, body = consumer_channel.basic_get(unique, auto_ack=True)
    assert body == b"first"
    assert consumer_channel.queue_declare(unique, passive=True).method.message_count == 0
    assert "memory alarm" in broker.log()
    consumer.close()
