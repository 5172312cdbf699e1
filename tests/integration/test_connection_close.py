"""The connection.close handshake with frames still in flight: as rabbit_reader, the broker answers close-ok and goes
on reading (and discarding) until the client closes its socket, so the client gets its close-ok and a clean end of
stream, never a reset."""

from __future__ import annotations

import pika
import pytest
from pamqp import body, commands, frame, header

from tests.integration.rawclient import RawClient
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest

IN_FLIGHT = 2000  # publishes a client still had queued when it closed


def publishes(routing_key: str, count: int, size: int = 1024) -> bytes:
    """`count` basic.publish frame sets on channel 1, as one buffer."""
    frames = (commands.Basic.Publish(exchange="", routing_key=routing_key),
              header.ContentHeader(0, size, commands.Basic.Properties()), body.ContentBody(b"x" * size))
    return b"".join(frame.marshal(value, 1) for value in frames) * count


def close_frame() -> bytes:
    return frame.marshal(commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0), 0)


def assert_not_reset(client: RawClient) -> None:
    """The broker has not reset the connection: what follows is its end of stream (Warren) or silence (RabbitMQ,
    until we close our socket; it then resets, as it closes every socket with SO_LINGER 0)."""
    client.sock.settimeout(1.0)
    try:
        assert client.sock.recv(65536) == b""
    except TimeoutError:
        pass


@pytest.fixture
def client(broker):
    with RawClient.connect(broker, timeout=10) as raw:
        raw.handshake()
        raw.open_channel(1)
        yield raw


def test_frames_behind_a_client_close_are_discarded_and_close_ok_arrives(client, unique):
    # A client library writes its close while earlier publishes are still queued behind it (amqplib does).
    client.send_raw(publishes(unique, IN_FLIGHT) + close_frame() + publishes(unique, IN_FLIGHT))
    client.expect(commands.Connection.CloseOk, channel=0)
    client.send_raw(publishes(unique, IN_FLIGHT))  # still flushing its queue: these writes must not fail
    assert_not_reset(client)


def test_frames_after_a_server_close_are_discarded_until_close_ok(client, unique):
    client.send(0, commands.Basic.Qos(prefetch_count=1))  # a channel method on channel 0 is a connection error
    client.send_raw(publishes(unique, IN_FLIGHT))
    close = client.expect_connection_close()  # answered with close-ok
    assert close.reply_code == 504
    client.expect_closed()


def test_exclusive_queues_are_gone_when_close_ok_arrives(broker, client, unique):
    client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
    client.expect(commands.Queue.DeclareOk, channel=1)
    client.close_connection()  # the socket stays open: the broker waits for us to close it
    with RawClient.connect(broker) as other:
        other.handshake()
        other.open_channel(1)
        other.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
        other.expect(commands.Queue.DeclareOk, channel=1)


def test_pika_closes_cleanly_after_a_burst_of_publishes(broker, unique):
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    for _ in range(IN_FLIGHT):
        channel.basic_publish(exchange="", routing_key=unique, body=b"x" * 1024)
    connection.close()
    assert connection.is_closed


MANY_EXCLUSIVE = 20_000  # exclusive queues a client holds, each bound to a topic exchange: 0.2 s to delete at once
# seconds to make them, and to close with them (Warren: about a second each, 15 s where the client's worker is not the
# vhost's home with spread_vhosts, each change a round trip to the home; RabbitMQ 3.10 here: tens of seconds)
SLOW_TIMEOUT = 120.0


def many_exclusive_queues(client: RawClient, unique: str) -> list[str]:
    """MANY_EXCLUSIVE exclusive queues of the client's, each bound to a topic exchange; their names."""
    client.send(1, commands.Exchange.Declare(exchange=unique, exchange_type="topic", auto_delete=True))
    client.expect(commands.Exchange.DeclareOk, channel=1)
    names = [f"{unique}.{number}" for number in range(MANY_EXCLUSIVE)]
    client.send_raw(b"".join(
        frame.marshal(commands.Queue.Declare(queue=name, exclusive=True, nowait=True), 1)
        + frame.marshal(commands.Queue.Bind(queue=name, exchange=unique, routing_key=f"{name}.#", nowait=True), 1)
        for name in names), timeout=SLOW_TIMEOUT)
    client.send(1, commands.Queue.Declare(queue=names[-1], passive=True))
    client.expect(commands.Queue.DeclareOk, channel=1, timeout=SLOW_TIMEOUT)
    return names


def declared_again(broker, names: list[str]) -> None:
    """Another connection declares each of names as its own exclusive queue (405 if one of the old is left)."""
    with RawClient.connect(broker) as other:
        other.handshake()
        for number, name in enumerate(names, 1):
            other.open_channel(number)
            other.send(number, commands.Queue.Declare(queue=name, exclusive=True))
            other.expect(commands.Queue.DeclareOk, channel=number)


@pytest.mark.alone
def test_many_exclusive_queues_go_in_slices_and_every_one_is_gone_at_close_ok(broker, client, unique):
    """A client closing with tens of thousands of exclusive queues holds the others a few milliseconds at a time,
    and its close-ok comes once they are all gone (the last one can be declared again at once)."""
    names = many_exclusive_queues(client, unique)
    probe = RoundTrips(broker)
    try:
        client.close_connection(SLOW_TIMEOUT)
    finally:
        times = probe.stop()
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
    declared_again(broker, names[::400])


def test_a_server_close_comes_once_the_exclusive_queues_are_gone(broker, client, unique):
    names = many_exclusive_queues(client, unique)
    client.send(0, commands.Basic.Qos(prefetch_count=1))  # a channel method on channel 0 is a connection error
    assert client.expect_connection_close(SLOW_TIMEOUT).reply_code == 504  # (answered with close-ok)
    declared_again(broker, names[::400])
