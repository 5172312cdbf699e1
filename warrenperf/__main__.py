"""warren-perf: producers and consumers, each a process of its own, against any AMQP 0-9-1 broker.

    warren-perf --uri amqp://guest:guest@127.0.0.1:5672/%2F [--producers N] [--consumers N] [--seconds S]
                [--size BYTES] [--persistent] [--confirm WINDOW] [--ack-every N] [--prefetch N] [--rate R]
                [--queue NAME] [--queues K] [--latency] [--broker-pid PID] [--json]

Prints the publishing and delivery rates (totals over the processes), end-to-end latency percentiles (with
--latency: each body carries its publishing time; the processes run on this machine, so one clock serves), the
clients' CPU time per message, and the broker's where it runs on this machine (the process listening on the URL's
port, or --broker-pid). The queue (or the fanout exchange and its queues, with --queues) is declared for the run
and deleted after it. Deliveries are counted until the producers stop."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from warrenperf.roles import Split
from warrenperf.run import broker_process, run

PREFETCH_MAX = 65535  # basic.qos's prefetch-count is an unsigned short


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warren-perf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                        help="the broker (amqp:// or amqps://)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes (default 1)")
    parser.add_argument("--consumers", type=int, default=1, help="consumer processes, each on every queue (default 1)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the producers publish (default 10)")
    parser.add_argument("--size", type=int, default=16, help="body bytes (default 16)")
    parser.add_argument("--persistent", action="store_true", help="persistent messages to durable queues")
    parser.add_argument("--confirm", type=int, default=0, metavar="WINDOW",
                        help="publisher confirms, at most WINDOW unconfirmed per producer (default: no confirms)")
    parser.add_argument("--ack-every", type=int, default=0, metavar="N",
                        help="manual acks, one multiple ack every N deliveries (1: each; default: auto-ack)")
    parser.add_argument("--prefetch", type=int, default=100, help="basic.qos of a manual-ack consumer (default 100)")
    parser.add_argument("--rate", type=int, default=0, help="messages per second per producer (default: unthrottled)")
    parser.add_argument("--queue", help="the queue's name (with --queues: the exchange's, and the queues' prefix); "
                                        "declared for the run and deleted after it (default: a unique name)")
    parser.add_argument("--queues", type=int, default=1,
                        help="K > 1: publish to a fanout exchange feeding K queues (default: one queue)")
    parser.add_argument("--latency", action="store_true", help="measure end-to-end latency (stamped bodies)")
    parser.add_argument("--broker-pid", type=int, help="the broker's process, for its CPU time (default: found)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    for name in ("producers", "consumers", "queues", "prefetch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    for name in ("size", "confirm", "ack_every", "rate"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    if args.prefetch > PREFETCH_MAX:
        parser.error(f"--prefetch must be at most {PREFETCH_MAX} (basic.qos's prefetch count is 16 bits)")
    if args.latency and args.size < 8:
        parser.error("--latency needs --size 8 or more (the publishing time takes 8 bytes)")
    if args.ack_every > args.prefetch:
        parser.error("--ack-every above --prefetch would stall: the consumer is sent no more than --prefetch unacked")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = args.queue or f"warren-perf-{os.getpid()}-{time.monotonic_ns()}"
    split = Split(exchange=name if args.queues > 1 else "", queue=name, queues=args.queues, size=args.size,
                  persistent=args.persistent, ack_every=args.ack_every, prefetch=args.prefetch, window=args.confirm,
                  rate=args.rate, latency=args.latency)
    figures = run(args.uri, split, args.seconds, producers=args.producers, consumers=args.consumers,
                  broker_pid=args.broker_pid or broker_process(args.uri))
    if isinstance(figures, str):
        print(f"warren-perf: the run failed: {figures}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(figures))
    else:
        print(report(figures))
    return 0


def report(figures: dict[str, float]) -> str:
    lines = [f"published  {figures['published/s']:>12,.0f} msg/s  ({figures['published']:,.0f} messages)",
             f"delivered  {figures['msg/s']:>12,.0f} msg/s  ({figures['delivered']:,.0f} deliveries)"]
    if "p50 ms" in figures:
        lines.append("latency    " + "  ".join(f"{name.split()[0]} {figures[name]:.2f} ms"
                                               for name in ("p50 ms", "p95 ms", "p99 ms", "max ms")))
    cpu = [f"clients {figures['client cpu us/msg']:.2f} µs"]
    if "cpu us/msg" in figures:
        cpu.insert(0, f"broker {figures['cpu us/msg']:.2f} µs")
    lines.append("CPU/msg    " + "  ".join(cpu))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
