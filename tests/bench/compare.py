"""Compare Warren with a reference RabbitMQ on this machine, in one run, with the same load generator.

    python -m tests.bench.compare [--seconds N] [--scenario NAME ...]

Starts Warren and a throwaway RabbitMQ on free loopback ports, runs each scenario against both (the load generator
in its own process, scenario by scenario so that drift on a shared machine touches both alike), prints a table of
figures with the ratio Warren / RabbitMQ, and stops both brokers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.bench.brokers import REPO_ROOT, BrokerUnavailable, RunningBroker, start_rabbitmq, start_warren
from tests.bench.loadgen import time_limit


@dataclass(frozen=True)
class Row:
    label: str
    metric: str  # key in the load generator's figures
    higher_is_better: bool = True


@dataclass(frozen=True)
class BenchRun:
    name: str  # what --scenario selects
    scenario: str  # the load generator's scenario
    extra_args: tuple[str, ...]
    rows: tuple[Row, ...]


# idle-memory runs first: after message-heavy scenarios freed memory makes RSS growth meaningless.
RUNS = (
    BenchRun("idle-memory", "idle-memory", ("--connections", "500"),
             (Row("memory per idle connection (KiB)", "KiB/conn", higher_is_better=False),)),
    BenchRun("churn", "churn", (), (Row("connection open+close (conn/s)", "conn/s"),)),
    BenchRun("publish", "publish", (), (Row("publish, 1 publisher (msg/s)", "msg/s"),)),
    BenchRun("consume", "consume", (), (Row("consume pre-filled queue, auto-ack (msg/s)", "msg/s"),)),
    BenchRun("publish-consume", "publish-consume", (), (Row("publish -> consume, auto-ack (msg/s)", "msg/s"),)),
    BenchRun("publish-consume-ack", "publish-consume-ack", ("--ack-every", "1"),
             (Row("publish -> consume, ack each, prefetch 100 (msg/s)", "msg/s"),)),
    BenchRun("fanout", "fanout", (), (Row("fanout to 10 queues (deliveries/s)", "msg/s"),)),
    BenchRun("confirms", "confirms", ("--window", "1000"), (Row("confirms, window 1000 (msg/s)", "msg/s"),)),
    BenchRun("confirms-persistent", "confirms", ("--window", "1000", "--persistent"),
             (Row("confirms, persistent, durable queue (msg/s)", "msg/s"),)),
    BenchRun("confirm-latency", "confirms", ("--window", "1"),
             (Row("confirm latency p50, window 1 (ms)", "p50 ms", higher_is_better=False),
              Row("confirm latency p99, window 1 (ms)", "p99 ms", higher_is_better=False))),
    BenchRun("confirm-latency-persistent", "confirms", ("--window", "1", "--persistent"),
             (Row("persistent confirms, window 1 (msg/s)", "msg/s"),
              Row("persistent confirm latency p50, window 1 (ms)", "p50 ms", higher_is_better=False),
              Row("persistent confirm latency p99, window 1 (ms)", "p99 ms", higher_is_better=False))),
)
RUNS_BY_NAME = {run.name: run for run in RUNS}


def run_loadgen(broker: RunningBroker, run: BenchRun, seconds: float) -> dict[str, float] | str:
    """The figures of one scenario against one broker, or the reason it failed."""
    command = [sys.executable, "-m", "tests.bench.loadgen", "--url", broker.url, "--scenario", run.scenario,
               "--seconds", str(seconds), "--broker-pid", str(broker.pid), "--json", *run.extra_args]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=time_limit(seconds) + 60)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit code {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1])["figures"]


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
                results[run.name] = {}
                for broker in brokers:
                    outcome = run_loadgen(broker, run, args.seconds)
                    results[run.name][broker.name] = outcome
                    print(f"{run.name} / {broker.name}: {outcome}", file=sys.stderr, flush=True)
            print_table(results, runs)
        finally:
            for broker in brokers:
                broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
