"""Load generator for any AMQP 0-9-1 broker.

    python -m tests.bench.loadgen --url amqp://guest:guest@127.0.0.1:PORT/%2F --scenario NAME [--seconds N]

Prints the scenario's figures; with --json, one JSON object on the last line (what tests.bench.compare reads).
These are the scenarios one process runs; a publisher and a consumer in processes of their own are warren-perf's
(warrenperf.run).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvloop

from tests.bench.scenarios import SCENARIOS, Options
from warrenperf.client import BrokerURL
from warrenperf.roles import time_limit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.loadgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    url = BrokerURL.parse(args.url)
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
