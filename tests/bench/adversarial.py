"""Costs of adversarial input: topic patterns built to blow up matching, and field tables built to blow up decoding.

    python -m tests.bench.adversarial [--publishes N] [--url amqp://...]

Prints, for each adversarial topic binding set, the median cost of one match on the trie itself and the median
round trip of a confirmed publish through a real broker (Warren started here, or the broker at --url, e.g. a
reference RabbitMQ), next to the same publish with no adversarial binding; then the time to decode each
worst-case 131 KB field table in process. A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import tempfile
import time
from pathlib import Path

import pika

from broker.model.routing.topic import TopicTrie
from protocol.field_table import MAX_DEPTH, field_table
from tests.bench.brokers import start_warren
from tests.unit.broker.model.test_topic import ADVERSARIAL_SETS, LONG_KEYS

TABLE_BYTES = 131_000  # a frame of 131,072 bytes holds a table this large and the method around it


def median_match_ms(patterns: list[str], rounds: int = 50) -> float:
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    times = []
    for _ in range(rounds):
        for routing_key in LONG_KEYS:
            started = time.perf_counter()
            trie.match(routing_key)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def median_publish_ms(channel, exchange: str, publishes: int) -> float:
    """Median round trip of a publish with confirms, cycling through the long routing keys."""
    times = []
    for index in range(publishes):
        started = time.perf_counter()
        channel.basic_publish(exchange, LONG_KEYS[index % len(LONG_KEYS)], b"x")
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def bench_topics(url: str, publishes: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    print(f"{'binding set':24s} {'bindings':>8s} {'trie match':>12s} {'publish':>12s}")
    exchange = "bench-adversarial-none"
    channel.exchange_declare(exchange, "topic", auto_delete=True)
    channel.queue_bind(queue, exchange, "no.match")
    print(f"{'(none)':24s} {1:8d} {'':>12s} {median_publish_ms(channel, exchange, publishes):9.3f} ms")
    channel.exchange_delete(exchange)
    for name, patterns in ADVERSARIAL_SETS.items():
        exchange = "bench-adversarial-" + name.replace(" ", "-").replace("#", "H").replace("*", "S")
        channel.exchange_declare(exchange, "topic", auto_delete=True)
        for pattern in patterns:
            channel.queue_bind(queue, exchange, pattern)
        channel.queue_purge(queue)
        publish_ms = median_publish_ms(channel, exchange, publishes)
        print(f"{name:24s} {len(patterns):8d} {median_match_ms(patterns):9.3f} ms {publish_ms:9.3f} ms")
        channel.exchange_delete(exchange)
        channel.queue_purge(queue)
    connection.close()


def sized(kind: bytes, content: bytes) -> bytes:
    return kind + struct.pack(">I", len(content)) + content


def table(content: bytes) -> bytes:
    return struct.pack(">I", len(content)) + content


def fill(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit))


def deep(depth: int) -> bytes:
    inner = b""
    for _ in range(depth - 1):
        inner = b"\x01kF" + struct.pack(">I", len(inner)) + inner
    return table(inner)


WORST_TABLES = {
    "entries '' = void": table(fill(b"\x00V", TABLE_BYTES)),
    "array of voids": table(b"\x00" + sized(b"A", fill(b"V", TABLE_BYTES - 7))),
    "array of booleans": table(b"\x00" + sized(b"A", fill(b"t\x01", TABLE_BYTES - 7))),
    "array of empty strings": table(b"\x00" + sized(b"A", fill(b"S\0\0\0\0", TABLE_BYTES - 7))),
    "array of empty tables": table(b"\x00" + sized(b"A", fill(b"F\0\0\0\0", TABLE_BYTES - 7))),
    "entries '' = empty table": table(fill(b"\x00F\0\0\0\0", TABLE_BYTES)),
    f"nested {MAX_DEPTH} deep": deep(MAX_DEPTH),
    "nested 18,000 deep (refused)": deep(18_000),
}


def bench_tables(rounds: int = 15) -> None:
    print(f"\n{'131 KB field table':30s} {'bytes':>8s} {'min':>9s} {'median':>9s}")
    for name, data in WORST_TABLES.items():
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            try:
                field_table(data)
            except ValueError:
                pass
            times.append(time.perf_counter() - started)
        print(f"{name:30s} {len(data):8d} {min(times) * 1000:6.2f} ms {statistics.median(times) * 1000:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=200, help="confirmed publishes per binding set")
    parser.add_argument("--url", help="broker to use instead of starting Warren (e.g. a reference RabbitMQ)")
    args = parser.parse_args()
    if args.url:
        bench_topics(args.url, args.publishes)
    else:
        with tempfile.TemporaryDirectory(prefix="warren-adversarial-") as workdir:
            warren = start_warren(Path(workdir))
            try:
                bench_topics(warren.url, args.publishes)
            finally:
                warren.stop()
    bench_tables()


if __name__ == "__main__":
    main()
