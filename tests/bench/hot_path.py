"""The broker's own CPU time per message on its hot path, in one process and without sockets:
`python -m tests.bench.hot_path [--messages N] [--size BYTES] [--ack-every N] [--rounds N]`.

A publishing connection is fed pre-encoded publishes in 64 KiB pieces, as a socket hands them over, and a consuming
connection's writes are dropped; the event loop runs between pieces, so that writes are flushed and
queues dispatched as they are when serving sockets. The figure (process CPU time per message delivered) leaves out
the kernel and the clients; a round the machine disturbs comes out higher, never lower, so the least of several
rounds tells code changes apart where the split scenarios of `make bench` move by 15 % between runs. `make bench`
says where Warren stands against RabbitMQ.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import uvloop
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from broker import interpreter
from broker.config import load_config
from broker.connection.connection import Connection
from broker.connection.server import Server

PIECE = 65536  # bytes handed to the publishing connection at a time
QUEUE = "hot-path"


class DiscardingTransport(asyncio.Transport):
    """What a connection writes to, keeping nothing."""

    def __init__(self):
        super().__init__()
        self.closing = False

    def write(self, data) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _frames(*methods) -> bytes:
    return b"".join(frame.marshal(method, channel) for channel, method in methods)


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def _open(server: Server) -> Connection:
    """A connection through the handshake with channel 1 open."""
    connection = Connection(server)
    connection.connection_made(DiscardingTransport())
    connection.data_received(b"AMQP\x00\x00\x09\x01")
    connection.data_received(_frames(
        (0, commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest")),
        (0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
        (0, commands.Connection.Open(virtual_host="/")),
        (1, commands.Channel.Open())))
    await _settle()
    assert 1 in connection.channels, "the handshake did not open channel 1"
    return connection


def _publishes(count: int, size: int) -> list[bytes]:
    """count publishes to QUEUE, in PIECE-sized pieces (cut anywhere, as a socket would)."""
    body = b"x" * size
    one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=QUEUE), 1)
           + frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), 1)
           + frame.marshal(ContentBody(body), 1))
    stream = one * count
    return [stream[start : start + PIECE] for start in range(0, len(stream), PIECE)]


async def one_round(messages: int, size: int, ack_every: int) -> float:
    """Broker CPU µs per message: publish -> route -> enqueue -> deliver (-> ack)."""
    interpreter.tune()  # as the daemon runs
    with tempfile.TemporaryDirectory() as data_dir:
        config = load_config(None, {"port": 0, "data_dir": data_dir, "management_port": 0, "mqtt_port": 0,
                                    "log_level": "warning"})
        server = Server(config)
        await server.start()
        try:
            consumer = await _open(server)
            methods = [(1, commands.Queue.Declare(queue=QUEUE))]
            if ack_every:
                methods.append((1, commands.Basic.Qos(prefetch_count=0)))
            methods.append((1, commands.Basic.Consume(queue=QUEUE, consumer_tag="c", no_ack=not ack_every)))
            consumer.data_received(_frames(*methods))
            publisher = await _open(server)
            await _settle()
            pieces = _publishes(messages, size)
            queue = server.node.vhosts["/"].queues[QUEUE]
            acked = 0
            started = time.process_time()
            for piece in pieces:
                publisher.data_received(piece)
                await asyncio.sleep(0)
                if ack_every:
                    delivered = queue.delivered_consume_manual_ack
                    tag = delivered - delivered % ack_every
                    if tag > acked:
                        consumer.data_received(frame.marshal(commands.Basic.Ack(tag, multiple=True), 1))
                        acked = tag
            await _settle()
            elapsed = time.process_time() - started
            delivered = queue.delivered_consume_manual_ack + queue.delivered_consume_auto_ack
            assert delivered == messages, f"{delivered} of {messages} delivered"
            return elapsed / messages * 1e6
        finally:
            await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=16, help="body bytes")
    parser.add_argument("--ack-every", type=int, default=0, help="0: auto-ack; N: a multiple ack every N deliveries")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures = [uvloop.run(one_round(args.messages, args.size, args.ack_every)) for _ in range(args.rounds)]
    print(f"broker CPU per message: least {min(figures):.2f} µs, median {statistics.median(figures):.2f} µs "
          f"(rounds: {', '.join(f'{figure:.2f}' for figure in figures)})")


if __name__ == "__main__":
    main()
