"""One Warren against a three-node Warren cluster on this machine, with the same load generator.

    python -m tests.bench.cluster [--seconds N] [--failovers N] [--join-messages N] [--lease-ttl S]

Starts one etcd (tests/cluster/etcd.py), one single node (as tests.bench.compare starts it) and a cluster of three
nodes (tests/cluster/nodes.py), all on 127.0.0.1, then prints a table of:

(a) persistent confirms, window 1000, 16 B: msg/s of the single node and of the cluster (the load generator's
    "confirms" scenario pointed at the leader's AMQP port, in a process of its own, as tests.bench.compare runs it),
    the ratio, and the broker CPU per confirmed message of the single node, the leader and each follower;
(b) the same with window 1: confirm latency p50 and p99, and the ratio of the p50s;
(c) failover: --failovers rounds of kill -9 of the leader under tests.cluster.publisher (window 500, persistent
    16 B), the time from the kill to the first confirm from the new leader (p50 and max; the killed node is
    restarted and back in the in-sync replica set before the next round);
(d) join: a queue on a two-node cluster filled with --join-messages persistent 16 B messages, then a fresh third
    node (empty data dir) started, and the time until it is in the in-sync replica set.

(a) and (b) alternate single node and cluster S C C S and average each side's two runs. The leader's and the single
node's CPU is the load generator's figure (over its timed part); a follower's is read around the load generator's
whole process (its queue's declaration and deletion included). CPU is a process's and its children's, from /proc.
Everything shares this machine's cores and disk: the figures compare the two set-ups here, not what three machines
would give.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.bench.brokers import RunningBroker, start_warren
from tests.bench.compare import RUNS_BY_NAME, BenchRun, _mean, run_loadgen
from tests.cluster.etcd import NO_ETCD_REASON, EtcdServer, find_etcd
from tests.cluster.nodes import ACK_TIMEOUT, LEASE_TTL, Cluster
from tests.cluster.publisher import start_publisher
from tests.waiting import wait_for
from warrenperf.process_memory import cpu_seconds

CONFIRMS = RUNS_BY_NAME["confirms-persistent"]  # window 1000, persistent, durable queue, 16 B
LATENCY = RUNS_BY_NAME["confirm-latency-persistent"]  # window 1
FAILOVER_WINDOW = 500  # the acceptance tests' publisher window
CONFIRMS_BEFORE_KILL = 20_000  # a failover round publishes this many confirms before it kills the leader
FILL_WINDOW = 1000
FOLLOWER_LABELS = ("follower 1", "follower 2")  # the followers in name order at the time of each run


Figures = dict[str, float] | str  # a run's figures, or why it failed


@dataclass
class Side:
    """A set-up the load generator runs against: the single node, or the cluster's current leader."""

    name: str
    broker: RunningBroker  # the process the load generator talks to and reads CPU of
    others: dict[str, int]  # label -> pid of each process whose CPU is read around the load generator's process


WHOLE_RUN = "whole run"  # the label of the single node's or the leader's CPU read around the whole process


def single_side(broker: RunningBroker) -> Side:
    return Side("single", broker, {WHOLE_RUN: broker.pid})


def cluster_side(cluster: Cluster, etcd: EtcdServer) -> Side:
    leader = cluster.ready()
    assert leader.process is not None
    followers = sorted(cluster.followers(), key=lambda node: node.name)
    others = {WHOLE_RUN: leader.process.pid}
    others.update({label: node.process.pid for label, node in zip(FOLLOWER_LABELS, followers) if node.process})
    others["etcd"] = etcd.pid
    return Side("cluster", RunningBroker(f"leader {leader.name}", leader.port, leader.process, leader.process.pid),
                others)


def measure(side: Side, run: BenchRun, seconds: float) -> Figures:
    """One load-generator run against the side; the figures gain "cpu us/msg LABEL" for each of side.others."""
    before = {label: cpu_seconds(pid) for label, pid in side.others.items()}
    figures = run_loadgen(side.broker, run, seconds)
    if isinstance(figures, str):
        return figures
    confirmed = figures["confirmed"] or 1
    for label, pid in side.others.items():
        figures[f"cpu us/msg {label}"] = (cpu_seconds(pid) - before[label]) * 1e6 / confirmed
    return figures


def alternate(run: BenchRun, single: RunningBroker, cluster: Cluster, etcd: EtcdServer,
              seconds: float) -> dict[str, Figures]:
    """S C C S: each side's two runs averaged."""
    outcomes: dict[str, list[Figures]] = {"single": [], "cluster": []}
    for name in ("single", "cluster", "cluster", "single"):
        side = single_side(single) if name == "single" else cluster_side(cluster, etcd)
        figures = measure(side, run, seconds)
        print(f"{run.name} / {side.name} ({side.broker.name}): {figures}", file=sys.stderr, flush=True)
        outcomes[name].append(figures)
    return {name: _mean(*figures) for name, figures in outcomes.items()}


# --- (c) failover -------------------------------------------------------------------------------------------

@dataclass
class Failovers:
    times: list[float]  # seconds from each kill -9 to the first confirm after it
    rejoins: list[float]  # seconds from each restart of the killed node to its return to the ISR
    confirmed: int
    republished: int
    rate: float  # the publisher's confirms per second over the whole run, failovers included


def failovers(cluster: Cluster, rounds: int, workdir: Path) -> Failovers:
    until = workdir / "stop-publishing"
    publisher = start_publisher(cluster.addresses, "failover", 16, FAILOVER_WINDOW, workdir / "failover-publisher",
                                until_file=until)
    kills, rejoins = [], []
    try:
        for round_ in range(rounds):
            publisher.wait_confirmed(publisher.confirmed + CONFIRMS_BEFORE_KILL, timeout=60)
            leader = cluster.leader()
            assert leader is not None, "no leader"
            losses = publisher.progress()["losses"]
            kills.append(time.time())
            leader.kill()
            publisher.wait_for(lambda progress: progress["losses"] > losses, timeout=10)
            publisher.wait_confirmed(publisher.confirmed + 1, timeout=30)
            restarted = time.monotonic()
            leader.start()
            wait_for(lambda: leader.name in (cluster.observer.isr() or []), 120, f"{leader.name} back in the ISR",
                     step=0.05)
            rejoins.append(time.monotonic() - restarted)
            print(f"failover round {round_ + 1}: killed {leader.name}; back in the ISR {rejoins[-1]:.2f} s after "
                  "its restart", file=sys.stderr, flush=True)
            cluster.ready(timeout=30)
        until.touch()
        result = publisher.wait(timeout=60)
    finally:
        publisher.kill()
    times = []
    for moment in kills:
        after = [loss for loss in result["losses"] if loss["at"] >= moment - 0.05 and loss["gap"] is not None]
        if not after:
            raise RuntimeError(f"no connection loss recorded after the kill at {moment}: {result['losses']}")
        times.append(after[0]["at"] + after[0]["gap"] - moment)
    return Failovers(times, rejoins, result["confirmed_count"], result["republished"], result["confirms_per_second"])


# --- (d) join -----------------------------------------------------------------------------------------------

@dataclass
class Join:
    messages: int
    fill_rate: float  # confirms per second while filling the queue on two nodes
    data_bytes: int  # the leader's data dir when the third node started
    seconds: float  # from the third node's start to its entry into the ISR
    copy: str  # what the leader logged of the copy it sent ("follower c got a copy of N files (B bytes) ... in T s")


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def join(workdir: Path, etcd: EtcdServer, messages: int, settings: dict[str, float]) -> Join:
    """A two-node cluster, a queue of `messages` on it, then a fresh third node until it is in the ISR."""
    (workdir / "join").mkdir()
    cluster = Cluster(workdir / "join", f"join{uuid.uuid4().hex[:8]}", etcd.endpoint, in_memory=False, **settings)
    try:
        first, second, joining = cluster.nodes.values()
        first.start()
        second.start()
        leader = cluster.ready(timeout=60)
        filler = start_publisher([leader.address], "queued", 16, FILL_WINDOW, workdir / "join-publisher",
                                 count=messages)
        result = filler.wait(timeout=max(600.0, messages / 1000))
        if result["confirmed_count"] != messages:
            raise RuntimeError(f"the queue holds {result['confirmed_count']} confirmed messages, not {messages}")
        size = directory_bytes(leader.data_dir)
        started = time.monotonic()
        joining.start()
        wait_for(lambda: joining.name in (cluster.observer.isr() or []), 600, "the new node in the ISR", step=0.02)
        seconds = time.monotonic() - started
        copies = re.findall(rf"follower {joining.name} got a copy of .*", leader.log())
        return Join(messages, result["confirms_per_second"], size, seconds, copies[-1] if copies else "")
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.stop()


# --- the table ----------------------------------------------------------------------------------------------

def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def figure(outcome: Figures | None, metric: str) -> float | None:
    return outcome.get(metric) if isinstance(outcome, dict) else None


def ratio(top: float | None, bottom: float | None) -> str:
    return f"{top / bottom:.2f}" if top is not None and bottom else "-"


def print_table(rows: list[tuple[str, ...]],
                header: tuple[str, ...] = ("figure", "single", "cluster", "cluster/single", "goal")) -> None:
    widths = [max(len(line[column]) for line in (header, *rows)) for column in range(len(header))]
    for line in (header, tuple("-" * width for width in widths), *rows):
        print("  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                        for column, (cell, width) in enumerate(zip(line, widths))))


WHOLE = f"cpu us/msg {WHOLE_RUN}"


def throughput_rows(title: str, outcomes: dict[str, Figures], goal: str, latency: bool) -> list[tuple[str, ...]]:
    single, cluster = outcomes.get("single"), outcomes.get("cluster")
    rows: list[tuple[str, ...]] = [
        (f"{title} (msg/s)", number(figure(single, "msg/s")), number(figure(cluster, "msg/s")),
         ratio(figure(cluster, "msg/s"), figure(single, "msg/s")), "" if latency else goal),
        ("  broker CPU per message (µs): single node / leader", number(figure(single, "cpu us/msg")),
         number(figure(cluster, "cpu us/msg")), ratio(figure(cluster, "cpu us/msg"), figure(single, "cpu us/msg")), "")]
    rows.append(("  the same over the load generator's whole process", number(figure(single, WHOLE)),
                 number(figure(cluster, WHOLE)), ratio(figure(cluster, WHOLE), figure(single, WHOLE)), ""))
    for label in (*FOLLOWER_LABELS, "etcd"):
        rows.append((f"  {label}: CPU per message, whole process (µs)", "-",
                     number(figure(cluster, f"cpu us/msg {label}")), "", ""))
    if latency:
        for cut in ("p50", "p99"):
            rows.append((f"  confirm latency {cut} (ms) [lower is better]", number(figure(single, f"{cut} ms")),
                         number(figure(cluster, f"{cut} ms")),
                         ratio(figure(cluster, f"{cut} ms"), figure(single, f"{cut} ms")),
                         goal if cut == "p50" else ""))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput and latency run")
    parser.add_argument("--failovers", type=int, default=5, help="kill -9 rounds of (c) (0 skips it)")
    parser.add_argument("--join-messages", type=int, default=1_000_000,
                        help="messages queued before (d)'s third node joins (0 skips it)")
    parser.add_argument("--lease-ttl", type=float, default=LEASE_TTL,
                        help="the nodes' etcd lease (s): about the failover time (default: the acceptance tests')")
    parser.add_argument("--ack-timeout", type=float, default=ACK_TIMEOUT, help="the follower ack deadline (s)")
    return parser.parse_args(argv)


def once(stop: Callable[[], object]) -> Callable[[], None]:
    """`stop`, run at its first call only (the ExitStack calls it again at the end)."""
    calls: list[int] = []

    def call() -> None:
        if not calls:
            calls.append(1)
            stop()
    return call


def started_etcd(workdir: Path, stack: contextlib.ExitStack) -> EtcdServer:
    """etcd, its data in workdir/etcd, stopped by ``stack`` (its binary found: the caller checked)."""
    (workdir / "etcd").mkdir()
    binary = find_etcd()
    assert binary is not None, NO_ETCD_REASON
    etcd = EtcdServer(binary, workdir / "etcd")
    stack.callback(etcd.stop)
    etcd.start()
    return etcd


def remove_unless_failed(workdir: Path, failed: bool) -> None:
    """A run's directory goes once it is done, unless a part failed: then its logs are kept, and it says where."""
    if failed:
        print(f"logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def run_all(args: argparse.Namespace, workdir: Path, stack: contextlib.ExitStack) -> tuple[list, list, bool]:
    """The four parts; (table rows, notes, whether a part failed). Whatever is started is stopped by `stack`."""
    settings = {"lease_ttl": args.lease_ttl, "ack_timeout": args.ack_timeout}
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    failed = False
    etcd = started_etcd(workdir, stack)
    (workdir / "single").mkdir()
    single = start_warren(workdir / "single")
    stop_single = stack.callback(once(single.stop))
    (workdir / "cluster").mkdir()
    cluster = Cluster(workdir / "cluster", f"bench{uuid.uuid4().hex[:8]}", etcd.endpoint, in_memory=False,
                      **settings)
    stop_cluster = stack.callback(once(cluster.stop))
    cluster.start()
    for run, title, goal, latency in ((CONFIRMS, "persistent confirms, window 1000, 16 B", ">= 0.70", False),
                                      (LATENCY, "persistent confirms, window 1, 16 B", "<= 2.00", True)):
        outcomes = alternate(run, single, cluster, etcd, args.seconds)
        rows += throughput_rows(title, outcomes, goal, latency)
        for name, outcome in outcomes.items():
            if isinstance(outcome, str):
                failed = True
                notes.append(f"{run.name} failed against the {name}: {outcome}")
    stop_single()
    if args.failovers:
        try:
            result = failovers(cluster, args.failovers, workdir)
        except Exception as error:
            failed = True
            notes.append(f"failover failed: {error}")
            print(cluster.logs(), file=sys.stderr)
        else:
            times = result.times
            rows.append((f"failover: kill -9 of the leader -> first confirm, {len(times)} rounds (s): p50", "",
                         number(statistics.median(times)), "", ""))
            rows.append(("  max", "", number(max(times)), "", ""))
            rows.append(("  the killed node back in the ISR after its restart (s): p50", "",
                         number(statistics.median(result.rejoins)), "", ""))
            notes.append(f"failover: every round {[round(t, 2) for t in times]} s; back in the ISR "
                         f"{[round(t, 2) for t in result.rejoins]} s after the restart; {result.confirmed:,} "
                         f"confirmed, {result.republished:,} republished, {result.rate:,.0f} confirms/s over the "
                         f"run (window {FAILOVER_WINDOW})")
    stop_cluster()
    if args.join_messages:
        try:
            joined = join(workdir, etcd, args.join_messages, settings)
        except Exception as error:
            failed = True
            notes.append(f"join failed: {error}")
        else:
            rows.append((f"join: a fresh node into the ISR, {joined.messages:,} queued 16 B messages (s)", "",
                         number(joined.seconds), "", ""))
            notes.append(f"join: the leader's data dir held {joined.data_bytes / 2**20:,.0f} MiB; the queue was "
                         f"filled at {joined.fill_rate:,.0f} confirms/s on two nodes (window {FILL_WINDOW}); the "
                         f"time runs from the process's start (Python and the broker's start-up included); the "
                         f"leader logged: {joined.copy or 'no copy'}")
    return rows, notes, failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if find_etcd() is None:
        print(f"not run: {NO_ETCD_REASON}")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="warren-cluster-bench-"))
    failed = True
    try:
        with contextlib.ExitStack() as stack:
            rows, notes, failed = run_all(args, workdir, stack)
        print_table(rows)
        for note in notes:
            print(note)
        print(f"A same-box comparison: the single node (S C C S against the cluster), three nodes (lease_ttl "
              f"{args.lease_ttl} s, ack_timeout {args.ack_timeout} s, min_insync 2), the load generator and etcd "
              f"share {os.cpu_count()} cores and one disk. The single node's and the leader's CPU is over the load "
              "generator's timed part, a follower's and etcd's over its whole process.")
    finally:
        remove_unless_failed(workdir, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
