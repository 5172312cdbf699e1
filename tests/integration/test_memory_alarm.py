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


def test_a_blocked_connection_is_not_dropped_for_missed_heartbeats(own_broker, tmp_path, unique):
    config = tmp_path / "warren.toml"
    config.write_text("[server]\nmemory_limit = 1\n")  # the alarm is on for the whole test
    broker = own_broker("--config", str(config))
    parameters = pika.URLParameters(broker.url)
    parameters.heartbeat = 1  # the broker stops reading a blocked connection, heartbeats included
    publisher = pika.BlockingConnection(parameters)
    channel = publisher.channel()
    channel.queue_declare(unique, exclusive=True)  # goes with the connection, should the broker drop it
    received = []
    channel.basic_consume(unique, lambda _ch, _method, _properties, body: received.append(body), auto_ack=True)
    blocked = []
    publisher.add_on_connection_blocked_callback(lambda connection, frame: blocked.append(frame))
    channel.basic_publish("", unique, b"blocks")
    wait_until(publisher, lambda: blocked and received == [b"blocks"])
    publisher.sleep(3.5)  # more than twice the heartbeat interval, while the broker reads nothing from it
    assert publisher.is_open
    # The broker still holds the connection: its exclusive queue is there and its consumer is served. (Another
    # connection's first publish goes through before that one is blocked in turn.)
    other = pika.BlockingConnection(pika.URLParameters(broker.url))
    other.channel().basic_publish("", unique, b"after the interval")
    wait_until(publisher, lambda: len(received) == 2)
    assert received == [b"blocks", b"after the interval"]
    # No close: as with RabbitMQ, a blocked connection is not read, so its connection.close would wait for the
    # alarm to clear; the broker is stopped at the end of the test instead.
