"""What several worker processes cost: the hand-off of a connection, and broker CPU per message.

    python -m tests.bench.workers [--seconds N] [--opens N]

- Opening a connection (TCP connect to connection.open-ok, the bench client): to vhost v1 on one worker, and on two
  workers where worker 1 leads v1 (the kernel gives about half of the connections to worker 0, which hands them
  over). The slower half of the second shifts by what a hand-off costs.
- Broker CPU per message (all its processes), a producer and a consumer process per vhost, 16 B, auto-ack: one
  worker with one busy vhost, against two workers with two busy vhosts, one on each.

Brokers alternate (1 2 2 1) and each figure is the mean of its two runs. On a 2-core machine the load generators
share the cores with the workers, so rates say little here; CPU per message is the figure to read.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.brokers import REPO_ROOT, RunningBroker, start_warren
from tests.bench.client import BenchConnection, BrokerURL
from tests.bench.compare import _failure, _figures
from tests.bench.loadgen import time_limit
from tests.bench.process_memory import cpu_seconds

CONFIG = """
[[vhosts]]
name = "v1"

[[permissions]]
user = "guest"
vhost = "v1"
configure = ".*"
write = ".*"
read = ".*"
"""


def url(broker: RunningBroker, vhost: str) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}/{vhost.replace('/', '%2F')}"


async def open_times(target: str, opens: int) -> list[float]:
    """Seconds from connect to open-ok, for opens connections one after another."""
    times = []
    for _ in range(opens):
        started = time.perf_counter()
        connection = await BenchConnection.open(BrokerURL.parse(target))
        times.append(time.perf_counter() - started)
        await connection.close()
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def loadgen(target: str, role: str, seconds: float, queue: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.bench.loadgen", "--url", target, "--scenario", role,
                             "--seconds", str(seconds), "--json", "--window", "0", "--queue", queue],
                            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def busy_vhosts(broker: RunningBroker, vhosts: list[str], seconds: float) -> dict[str, float]:
    """A consumer and a producer process per vhost, all started at once; delivered messages and the broker's CPU
    microseconds per message (its supervisor, workers and their threads)."""
    sides = [(vhost, loadgen(url(broker, vhost), role, seconds, f"bench-workers-{vhost.strip('/') or 'root'}"))
             for vhost in vhosts for role in ("consumer", "producer")]
    try:
        for _, side in sides:
            if side.stdout.readline().strip() != "ready":
                raise RuntimeError(_failure(side.communicate()[1], side.wait()))
        before = cpu_seconds(broker.process.pid)
        for _, side in sides:
            side.stdin.write("go\n")
            side.stdin.flush()
        producers, consumers = sides[1::2], sides[0::2]
        for _, producer in producers:
            producer.communicate(timeout=time_limit(seconds))
        for _, consumer in consumers:
            consumer.stdin.write("stop\n")
            consumer.stdin.flush()
        cpu = cpu_seconds(broker.process.pid) - before
        delivered = sum(_figures(consumer.communicate(timeout=time_limit(seconds))[0])["delivered"]
                        for _, consumer in consumers)
    finally:
        for _, side in sides:
            if side.poll() is None:
                side.kill()
    return {"delivered": delivered, "msg/s": delivered / seconds, "cpu us/msg": cpu * 1e6 / delivered}


def run(workdir: Path, workers: int, args: argparse.Namespace) -> dict[str, float]:
    config = workdir / "warren.toml"
    config.write_text(CONFIG)
    broker = start_warren(workdir, "--workers", str(workers), "--config", str(config))
    try:
        times = asyncio.run(open_times(url(broker, "v1"), args.opens))
        busy = busy_vhosts(broker, ["/", "v1"][:workers], args.seconds)
    finally:
        broker.stop()
    return {"open p50 ms": statistics.median(times) * 1000, "open p75 ms": percentile(times, 0.75) * 1000,
            "open p90 ms": percentile(times, 0.9) * 1000, **busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="of each busy run")
    parser.add_argument("--opens", type=int, default=300, help="connections opened one after another")
    args = parser.parse_args(argv)
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="warren-bench-workers-") as scratch:
        for index, workers in enumerate((1, 2, 2, 1)):
            workdir = Path(scratch) / str(index)
            workdir.mkdir()
            results[workers].append(run(workdir, workers, args))
    means = {workers: {key: statistics.mean(run[key] for run in runs) for key in runs[0]}
             for workers, runs in results.items()}
    print(f"{'':52} {'1 worker':>12} {'2 workers':>12} {'ratio':>8}")
    for label, key in (("open a connection to v1, p50 (ms)", "open p50 ms"),
                       ("open a connection to v1, p75 (ms)", "open p75 ms"),
                       ("open a connection to v1, p90 (ms)", "open p90 ms"),
                       ("delivered, 16 B auto-ack, all busy vhosts (msg/s)", "msg/s"),
                       ("broker CPU per message, all processes (µs)", "cpu us/msg")):
        one, two = means[1][key], means[2][key]
        print(f"{label:52} {one:12.2f} {two:12.2f} {two / one:8.2f}")
    print("1 worker: one busy vhost (v1's producer and consumer); 2 workers: two busy vhosts, one on each worker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
