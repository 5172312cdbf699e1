"""Compare Warren with a reference RabbitMQ on this machine, in one run, with the same load generator.

    python -m tests.bench.compare [--seconds N] [--scenario NAME ...]

Starts Warren and a throwaway RabbitMQ on free loopback ports, runs each scenario against both (the load generator
in its own process, scenario by scenario, brokers alternated W R R W and each broker's two figures averaged, so that
drift on a shared machine touches both alike), prints a table of figures with the ratio Warren / RabbitMQ, and stops
both brokers. Scenarios with a publisher and a consumer are warren-perf runs (warrenperf.run): two processes, the
publisher unthrottled (as RabbitMQ's PerfTest does). Every rate comes with the broker's CPU time (its process and
children) per message delivered or confirmed, or per connection.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.bench.brokers import REPO_ROOT, BrokerUnavailable, RunningBroker, start_rabbitmq, start_warren
from warrenperf.roles import Split, time_limit
from warrenperf.run import run as perf_run


@dataclass(frozen=True)
class Row:
    label: str
    metric: str  # key in the load generator's figures
    higher_is_better: bool = True


@dataclass(frozen=True)
class BenchRun:
    name: str  # what --scenario selects
    scenario: str  # the load generator's scenario, or "split": a warren-perf run (a consumer and a producer process)
    extra_args: tuple[str, ...]  # for the load generator; for a split run, Split's fields it sets, as (name, value)
    rows: tuple[Row, ...]
    alternate: bool = True  # run W R R W and average; False: once each (a fresh broker's memory)


CPU_PER_MESSAGE = Row("  broker CPU per message (µs)", "cpu us/msg", higher_is_better=False)


def _split(name: str, label: str, **fields) -> BenchRun:
    """A producer process -> broker -> consumer process run: delivery rate and broker CPU per message."""
    return BenchRun(name, "split", tuple(fields.items()), (Row(label, "msg/s"), CPU_PER_MESSAGE))


# idle-memory runs first: after message-heavy scenarios freed memory makes RSS growth meaningless.
RUNS = (
    BenchRun("idle-memory", "idle-memory", ("--connections", "500"),
             (Row("memory per idle connection (KiB)", "KiB/conn", higher_is_better=False),), alternate=False),
    BenchRun("churn", "churn", (), (Row("connection open+close (conn/s)", "conn/s"),
                                    Row("  broker CPU per connection (µs)", "cpu us/conn", higher_is_better=False))),
    BenchRun("publish", "publish", (), (Row("publish, 1 publisher (msg/s)", "msg/s"), CPU_PER_MESSAGE)),
    BenchRun("consume", "consume", (), (Row("consume pre-filled queue, auto-ack (msg/s)", "msg/s"), CPU_PER_MESSAGE)),
    _split("pubsub", "publisher -> queue -> consumer, auto-ack, 16 B (msg/s)"),
    _split("pubsub-ack", "the same, manual acks: prefetch 100, multiple ack every 50 (msg/s)", ack_every=50),
    _split("pubsub-1k", "publisher -> queue -> consumer, auto-ack, 1 KiB (msg/s)", size=1024),
    _split("pubsub-ack-1k", "the same, manual acks, 1 KiB (msg/s)", ack_every=50, size=1024),
    _split("fanout", "fanout to 10 queues, a consumer each (deliveries/s)", queues=10),
    BenchRun("confirms", "confirms", ("--window", "1000"),
             (Row("confirms, window 1000 (msg/s)", "msg/s"), CPU_PER_MESSAGE)),
    BenchRun("confirms-persistent", "confirms", ("--window", "1000", "--persistent"),
             (Row("confirms, persistent, durable queue (msg/s)", "msg/s"), CPU_PER_MESSAGE)),
    _split("confirms-persistent-consumed", "the same, consumed with manual acks meanwhile (msg/s)",
           window=1000, persistent=True, ack_every=50),
    BenchRun("latency", "split", (("rate", 1000), ("latency", True)), (
        Row("end-to-end latency p50 at 1,000 msg/s (ms)", "p50 ms", higher_is_better=False),
        Row("end-to-end latency p99 at 1,000 msg/s (ms)", "p99 ms", higher_is_better=False))),
    BenchRun("confirm-latency", "confirms", ("--window", "1"),
             (Row("confirm latency p50, window 1 (ms)", "p50 ms", higher_is_better=False),
              Row("confirm latency p99, window 1 (ms)", "p99 ms", higher_is_better=False))),
    BenchRun("confirm-latency-persistent", "confirms", ("--window", "1", "--persistent"),
             (Row("persistent confirms, window 1 (msg/s)", "msg/s"), CPU_PER_MESSAGE,
              Row("persistent confirm latency p50, window 1 (ms)", "p50 ms", higher_is_better=False),
              Row("persistent confirm latency p99, window 1 (ms)", "p99 ms", higher_is_better=False))),
)
RUNS_BY_NAME = {run.name: run for run in RUNS}


_names = itertools.count()  # numbers the queues and exchanges of split runs


def _loadgen(broker: RunningBroker, scenario: str, seconds: float, args) -> list[str]:
    return [sys.executable, "-m", "tests.bench.loadgen", "--url", broker.url, "--scenario", scenario,
            "--seconds", str(seconds), "--broker-pid", str(broker.pid), "--json", *args]


def _figures(output: str) -> dict[str, float]:
    return json.loads(output.strip().splitlines()[-1])["figures"]


def _failure(stderr: str, returncode: int) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {returncode}"


def run_loadgen(broker: RunningBroker, run: BenchRun, seconds: float) -> dict[str, float] | str:
    """The figures of one scenario against one broker, or the reason it failed."""
    if run.scenario == "split":
        return run_split(broker, run, seconds)
    try:
        done = subprocess.run(_loadgen(broker, run.scenario, seconds, run.extra_args), cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=time_limit(seconds) + 60)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0:
        return _failure(done.stderr, done.returncode)
    return _figures(done.stdout)


def run_split(broker: RunningBroker, bench: BenchRun, seconds: float) -> dict[str, float] | str:
    """A warren-perf run of one consumer and one producer process; the broker's CPU time read around the
    producer's run."""
    name = f"bench-{bench.name}-{os.getpid()}-{next(_names)}"
    fields = dict(bench.extra_args)
    split = Split(queue=name, exchange=name if fields.get("queues", 1) > 1 else "", **fields)
    return perf_run(broker.url, split, seconds, broker_pid=broker.pid)


def _mean(first: dict[str, float] | str, second: dict[str, float] | str) -> dict[str, float] | str:
    """Two runs' figures averaged (a failure of either stands)."""
    if isinstance(first, str):
        return first
    if isinstance(second, str):
        return second
    return {metric: (value + second[metric]) / 2 for metric, value in first.items()}


def _cell(figures: dict[str, float] | str | None, metric: str) -> str:
    if figures is None:
        return "-"
    if isinstance(figures, str):
        return "failed"
    value = figures[metric]
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _ratio(warren: dict | str | None, rabbitmq: dict | str | None, metric: str) -> str:
    if not isinstance(warren, dict) or not isinstance(rabbitmq, dict) or not rabbitmq[metric]:
        return "-"
    return f"{warren[metric] / rabbitmq[metric]:.2f}"


def print_table(results: dict[str, dict[str, dict | str]], runs: list[BenchRun]) -> None:
    header = ("scenario", "Warren", "RabbitMQ", "Warren/RabbitMQ")
    table = []
    for run in runs:
        warren, rabbitmq = results[run.name].get("Warren"), results[run.name].get("RabbitMQ")
        for row in run.rows:
            label = row.label if row.higher_is_better else f"{row.label} [lower is better]"
            table.append((label, _cell(warren, row.metric), _cell(rabbitmq, row.metric),
                          _ratio(warren, rabbitmq, row.metric)))
    widths = [max(len(line[column]) for line in (header, *table)) for column in range(len(header))]
    for line in (header, tuple("-" * width for width in widths), *table):
        print("  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                        for column, (cell, width) in enumerate(zip(line, widths))))
    failures = [(run.name, broker, outcome) for run in runs for broker, outcome in results[run.name].items()
                if isinstance(outcome, str)]
    for name, broker, reason in failures:
        print(f"{name} failed against {broker}: {reason}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each time-bounded scenario")
    parser.add_argument("--scenario", action="append", choices=list(RUNS_BY_NAME),
                        help="run only this scenario (repeatable; default: all)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = [RUNS_BY_NAME[name] for name in args.scenario] if args.scenario else list(RUNS)
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as workdir:
        os.chmod(workdir, 0o755)  # rabbitmq-server runs as the rabbitmq user and must reach its data dir
        brokers: list[RunningBroker] = []
        try:
            for start in (start_warren, start_rabbitmq):
                try:
                    brokers.append(start(Path(workdir)))
                except BrokerUnavailable as reason:
                    print(f"not compared: {reason}", flush=True)
            if not brokers:
                return 1
            results: dict[str, dict[str, dict | str]] = {}
            for run in runs:
                outcomes: dict[str, list] = {broker.name: [] for broker in brokers}
                order = brokers + brokers[::-1] if run.alternate else brokers  # W R R W
                for broker in order:
                    outcome = run_loadgen(broker, run, args.seconds)
                    outcomes[broker.name].append(outcome)
                    print(f"{run.name} / {broker.name}: {outcome}", file=sys.stderr, flush=True)
                results[run.name] = {name: _mean(*figures) if len(figures) == 2 else figures[0]
                                     for name, figures in outcomes.items()}
            print_table(results, runs)
        finally:
            for broker in brokers:
                broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
