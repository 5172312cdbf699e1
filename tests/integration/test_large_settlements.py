"""A settlement of hundreds of thousands of persistent deliveries on one channel (a multiple ack, the requeue of a
connection that closes with them unacked, a transaction's multiple ack, rollback and commit), and the purge of as many
messages, hold the broker's other clients a few milliseconds at a time, not as long as they take, and settle exactly
what they name."""

from __future__ import annotations

import socket
import threading

import pytest
from pamqp import body, commands, frame, header

from tests.integration.helpers import connect, message_count
from tests.integration.rawclient import RawClient
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest
from tests.waiting import wait_for

COUNT = 400_000  # deliveries unacked on one channel; a multiple ack of half of them took about 0.15 s in one piece


def published(client: RawClient, queue: str, count: int) -> None:
    """count persistent messages of 16 bytes, in writes of 10,000."""
    one = b"".join(frame.marshal(value, 1) for value in (
        commands.Basic.Publish(exchange="", routing_key=queue),
        header.ContentHeader(0, 16, commands.Basic.Properties(delivery_mode=2)), body.ContentBody(b"x" * 16)))
    for _ in range(count // 10_000):
        client.send_raw(one * 10_000)


def discarding(sock: socket.socket) -> threading.Thread:
    """Read and drop what the broker sends the consumer (its deliveries) until the socket closes."""
    def run() -> None:
        try:
            while sock.recv(1 << 20):
                pass
        except OSError:
            pass
    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    return reader


def consumed_unacked(broker, watch, queue: str, tx: bool = False,
                     arguments: dict | None = None) -> tuple[RawClient, threading.Thread]:
    """A raw client on channel 1 (transactional where tx) holding COUNT persistent deliveries of queue (declared
    with arguments) unacked, and the thread that reads and drops what the broker sends it."""
    watch.queue_declare(queue, durable=True, arguments=arguments)
    client = RawClient.connect(broker, timeout=30)
    client.handshake()
    client.open_channel(1)
    published(client, queue, COUNT)
    wait_for(lambda: message_count(watch, queue) == COUNT, 60, f"{COUNT} messages in the queue")
    if tx:
        client.send(1, commands.Tx.Select())
    client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
    reader = discarding(client.sock)
    wait_for(lambda: message_count(watch, queue) == 0, 60, "every message delivered")
    return client, reader


def closed(client: RawClient, reader: threading.Thread) -> None:
    """The client's connection shut down, so what it leaves unacked goes back to its queue."""
    client.sock.shutdown(socket.SHUT_RDWR)
    client.close()
    reader.join()


@pytest.mark.alone
def test_a_multiple_ack_a_close_and_a_purge_of_hundreds_of_thousands_of_messages_hold_no_other_client(
        broker, unique):
    if broker.external:
        pytest.skip("a bound of Warren's own: RabbitMQ holds other clients 342 to 885 ms during such a nack or close "
                    "(python -m tests.bench.stalls)")
    with connect(broker) as watching:
        watch = watching.channel()
        client, reader = consumed_unacked(broker, watch, unique)
        round_trips = RoundTrips(broker)
        try:
            client.send(1, commands.Basic.Ack(delivery_tag=COUNT // 2, multiple=True))
            closed(client, reader)  # the other half, unacked, goes back to the queue
            wait_for(lambda: message_count(watch, unique) == COUNT // 2, 60, "the unacked half back in the queue")
            assert watch.queue_purge(unique).method.message_count == COUNT // 2
        finally:
            times = round_trips.stop()
        watch.queue_delete(unique)
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())


@pytest.mark.alone
def test_a_transactions_multiple_ack_rollback_and_commit_of_hundreds_of_thousands_hold_no_other_client(
        broker, unique):
    """Within a transaction: a multiple ack of half the deliveries, rolled back, then a multiple ack of a quarter,
    committed. Had the rollback not put the half back, the second ack would name unknown tags and close the
    channel, and every message would go back to the queue."""
    if broker.external:
        pytest.skip("a bound of Warren's own: RabbitMQ holds other clients hundreds of ms during such a settlement "
                    "(python -m tests.bench.stalls)")
    with connect(broker) as watching:
        watch = watching.channel()
        client, reader = consumed_unacked(broker, watch, unique, tx=True)
        round_trips = RoundTrips(broker)
        try:
            client.send(1, commands.Basic.Ack(delivery_tag=COUNT // 2, multiple=True))
            client.send(1, commands.Tx.Rollback())
            client.send(1, commands.Basic.Ack(delivery_tag=COUNT // 4, multiple=True))
            client.send(1, commands.Tx.Commit())
            client.send(1, commands.Basic.Cancel(consumer_tag="c"))  # handled once the commit is: a sign of it
            wait_for(lambda: watch.queue_declare(unique, passive=True).method.consumer_count == 0, 60,
                     "the frames after the commit handled")
            closed(client, reader)
            wait_for(lambda: message_count(watch, unique) == COUNT - COUNT // 4, 60,
                     "all but the committed quarter back in the queue")
            assert watch.queue_purge(unique).method.message_count == COUNT - COUNT // 4
        finally:
            times = round_trips.stop()
        watch.queue_delete(unique)
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())


@pytest.mark.alone
def test_a_multiple_nack_of_hundreds_of_thousands_to_a_dead_letter_queue_holds_no_other_client(broker, unique):
    if broker.external:
        pytest.skip("a bound of Warren's own: RabbitMQ holds other clients hundreds of ms during such a settlement "
                    "(python -m tests.bench.stalls)")
    with connect(broker) as watching:
        watch = watching.channel()
        dead = f"{unique}-dead"
        watch.queue_declare(dead, durable=True)
        client, reader = consumed_unacked(broker, watch, unique, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        round_trips = RoundTrips(broker)
        try:
            client.send(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=False))
            wait_for(lambda: message_count(watch, dead) == COUNT, 60, "every message dead-lettered")
            closed(client, reader)
        finally:
            times = round_trips.stop()
        watch.queue_delete(unique)
        watch.queue_delete(dead)
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
