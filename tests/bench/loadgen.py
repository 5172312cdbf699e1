"""Load generator for any AMQP 0-9-1 broker.

    python -m tests.bench.loadgen --url amqp://guest:guest@127.0.0.1:PORT/%2F --scenario NAME [--seconds N]

Prints the scenario's figures; with --json, one JSON object on the last line (what tests.bench.compare reads).
The scenarios "consumer" and "producer" are the two sides of a split scenario (tests.bench.roles), each started in
a process of its own by tests.bench.compare, which tells them when to start over stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvloop

from tests.bench.client import BrokerURL
from tests.bench.roles import Split, consumer, producer
from tests.bench.scenarios import SCENARIOS, Options

ROLES = ("consumer", "producer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS) + list(ROLES))
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of time-bounded scenarios")
    parser.add_argument("--count", type=int, default=200_000, help="messages pre-filled for 'consume'")
    parser.add_argument("--window", type=int, default=1000,
                        help="'confirms': unconfirmed publishes allowed (1 also reports latency p50/p99)")
    parser.add_argument("--persistent", action="store_true",
                        help="'confirms': delivery_mode 2 to a durable queue")
    parser.add_argument("--ack-every", type=int, default=0,
                        help="consumer: 0 auto-acks; 1 acks each delivery; N > 1 sends one multiple ack every N "
                             "deliveries (keep N below the prefetch)")
    parser.add_argument("--connections", type=int, default=500, help="'idle-memory': idle connections to open")
    parser.add_argument("--broker-pid", type=int, help="'idle-memory': broker process (default: the port's listener)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on the last line")
    split = parser.add_argument_group("consumer and producer")
    split.add_argument("--queue", help="the queue (or the fanout queues' prefix)")
    split.add_argument("--exchange", default="", help="a fanout exchange feeding --queues queues ('' = none)")
    split.add_argument("--queues", type=int, default=1)
    split.add_argument("--size", type=int, default=16, help="body bytes")
    split.add_argument("--prefetch", type=int, default=100, help="of a manual-ack consumer")
    split.add_argument("--rate", type=int, default=0, help="producer: messages per second (0 = unthrottled)")
    split.add_argument("--latency", action="store_true", help="stamp bodies; the consumer reports p50/p99")
    return parser.parse_args(argv)


def split_of(args: argparse.Namespace) -> Split:
    """The options both sides of a split scenario share; --window 0 means no confirms."""
    return Split(exchange=args.exchange, queue=args.queue, queues=args.queues, size=args.size,
                 persistent=args.persistent, ack_every=args.ack_every, prefetch=args.prefetch, window=args.window,
                 rate=args.rate, latency=args.latency)


def time_limit(seconds: float) -> float:
    """The longest a scenario may take in all, pre-filling and cleaning up included."""
    return 12 * seconds + 120


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    url = BrokerURL.parse(args.url)
    if args.scenario == "consumer":
        scenario = consumer(url, split_of(args))
    elif args.scenario == "producer":
        scenario = producer(url, split_of(args), args.seconds)
    else:
        options = Options(seconds=args.seconds, count=args.count, window=args.window, persistent=args.persistent,
                          connections=args.connections, broker_pid=args.broker_pid)
        scenario = SCENARIOS[args.scenario](url, options)
    # A stalled broker (e.g. blocking publishers) must not hang the run; pre-filling may take longer than a run.
    figures = uvloop.run(asyncio.wait_for(scenario, timeout=time_limit(args.seconds)))
    if args.json:
        print(json.dumps({"scenario": args.scenario, "figures": figures}))
    else:
        print(f"{args.scenario}: " + ", ".join(f"{value:,.2f} {name}" if isinstance(value, float)
                                                 else f"{value:,} {name}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
