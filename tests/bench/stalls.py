"""How long one client's operation over many messages holds the broker's other clients, Warren and RabbitMQ in the
same run (W R R W): a client holds COUNT persistent deliveries of a durable queue unacked (or the queue holds them
ready), then acks them all with one multiple ack, nacks them all with requeue, closes its connection with them
unacked, or purges the queue; meanwhile another client times passive declares on its own connection, one after
another, in a process of its own. Printed: how long each operation took to show in the queue's count, and the
slowest round trip of the other client during it.

    python -m tests.bench.stalls [--messages 200000] [--operation ack --operation purge]
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pika
from pamqp import body, commands, frame, header

from tests.bench.brokers import BrokerUnavailable, RunningBroker, start_rabbitmq, start_warren
from tests.integration.rawclient import RawClient
from tests.round_trips import RoundTrips, slowest
from tests.waiting import wait_for

OPERATIONS = ("ack", "nack", "close", "purge")
SETTLE_SECONDS = 300  # the longest an operation (or the filling of a queue) may take to show


class Counts:
    """The queues' ready messages, read with passive declares on a connection of its own (the round trips timed are
    another client's, in a process of its own: tests/round_trips.py)."""

    def __init__(self, broker: RunningBroker) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        self.channel = self.connection.channel()

    def count(self, queue: str) -> int:
        return self.channel.queue_declare(queue, passive=True).method.message_count

    def close(self) -> None:
        self.connection.close()


def filled(broker: RunningBroker, watch: Counts, queue: str, count: int) -> RawClient:
    """A client on channel 1 that declared queue (durable) and published count persistent messages of 16 bytes to it,
    all of them counted ready."""
    client = RawClient(socket.create_connection(("127.0.0.1", broker.port), timeout=60), timeout=60)
    client.handshake()
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue=queue, durable=True))
    client.expect(commands.Queue.DeclareOk)
    one = b"".join(frame.marshal(value, 1) for value in (
        commands.Basic.Publish(exchange="", routing_key=queue),
        header.ContentHeader(0, 16, commands.Basic.Properties(delivery_mode=2)), body.ContentBody(b"x" * 16)))
    for _ in range(count // 10_000):
        client.send_raw(one * 10_000)
    wait_for(lambda: watch.count(queue) == count, SETTLE_SECONDS, f"{count} messages in {queue}", step=0.2)
    return client


def consumed(client: RawClient, watch: Counts, queue: str) -> threading.Thread:
    """The client consumes every message of queue, unacked (prefetch unlimited), reading and dropping what comes."""
    client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))

    def drop() -> None:
        try:
            while client.sock.recv(1 << 20):
                pass
        except OSError:
            pass
    reader = threading.Thread(target=drop, daemon=True)
    reader.start()
    wait_for(lambda: watch.count(queue) == 0, SETTLE_SECONDS, f"every message of {queue} delivered", step=0.2)
    return reader


def measure(broker: RunningBroker, operation: str, count: int) -> tuple[float, float]:
    """Seconds the operation took to show in the queue's count, and the other client's slowest round trip."""
    watch = Counts(broker)
    queue = f"stalls-{operation}-{time.monotonic_ns()}"
    client = filled(broker, watch, queue, count)
    reader = consumed(client, watch, queue) if operation != "purge" else None
    time.sleep(0.5)  # (what the consumer's deliveries left behind settles)
    round_trips = RoundTrips(SimpleNamespace(host="127.0.0.1", port=broker.port))
    start = time.monotonic()
    if operation == "ack":
        client.send(1, commands.Basic.Ack(delivery_tag=count, multiple=True))
        client.send(1, commands.Basic.Cancel(consumer_tag="c"))
        shown = lambda: True  # noqa: E731 (the ack leaves nothing to count: its window is the round trips after it)
    elif operation == "nack":
        client.send(1, commands.Basic.Cancel(consumer_tag="c"))
        client.send(1, commands.Basic.Nack(delivery_tag=count, multiple=True, requeue=True))
        shown = lambda: watch.count(queue) == count  # noqa: E731
    elif operation == "close":
        client.sock.shutdown(socket.SHUT_RDWR)
        shown = lambda: watch.count(queue) == count  # noqa: E731
    else:
        client.send(1, commands.Queue.Purge(queue=queue))
        client.expect(commands.Queue.PurgeOk, timeout=SETTLE_SECONDS)
        shown = lambda: True  # noqa: E731
    wait_for(shown, SETTLE_SECONDS, f"the {operation} shown", step=0.05)
    end = time.monotonic()
    time.sleep(0.5)  # (round trips that began during it end)
    slowest_trip = slowest(round_trips.stop())
    watch.close()
    client.close()
    if reader is not None:
        reader.join()
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as cleanup:
        cleanup.channel().queue_delete(queue)
    return end - start, slowest_trip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.stalls", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--operation", action="append", choices=OPERATIONS)
    args = parser.parse_args()
    operations = args.operation or list(OPERATIONS)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="warren-stalls-") as work:
        os.chmod(work, 0o755)  # rabbitmq-server runs as the rabbitmq user and must reach its data dir
        for order, name in enumerate(("Warren", "RabbitMQ", "RabbitMQ", "Warren")):
            workdir = Path(work) / f"{order}-{name}"
            workdir.mkdir(mode=0o755)
            try:
                broker = start_warren(workdir) if name == "Warren" else start_rabbitmq(workdir)
            except BrokerUnavailable as error:
                print(f"{name}: not measured: {error}")
                continue
            try:
                for operation in operations:
                    results.setdefault((name, operation), []).append(measure(broker, operation, args.messages))
            finally:
                broker.stop()
    print(f"{args.messages} persistent messages; the slowest round trip of another client during each operation")
    print(f"{'operation':10s} {'Warren':>22s} {'RabbitMQ':>22s}")
    for operation in operations:
        cells = []
        for name in ("Warren", "RabbitMQ"):
            runs = results.get((name, operation), [])
            cells.append(", ".join(f"{slowest * 1000:.0f} ms ({took:.2f} s)" for took, slowest in runs) or "-")
        print(f"{operation:10s} {cells[0]:>22s} {cells[1]:>22s}")


if __name__ == "__main__":
    main()
