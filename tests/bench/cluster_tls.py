"""A three-node cluster with TLS between its nodes against the same cluster in clear, on this machine.

    python -m tests.bench.cluster_tls [--seconds N]

Starts one etcd and two clusters of three nodes on 127.0.0.1 (tests/cluster/nodes.py): one plain, one with
``[cluster] tls = true`` (the replication stream, forwarded clients and API requests over mutually authenticated
TLS, with the nodes' certificates of tests/tls_certs.py). Against each one's leader, alternated P T T P, the load
generator's persistent confirms with window 1000 and with window 1 (16 B, a durable queue, in a process of its own,
as tests.bench.cluster runs them), and prints msg/s, the ratio TLS / plain (the goal: at least 0.8), confirm
latency, and the broker CPU per confirmed message of the leader and each follower (from /proc). Every process shares
this machine's cores: the figures compare the two set-ups here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import uuid
from pathlib import Path

from tests.bench.cluster import (
    CONFIRMS, FOLLOWER_LABELS, LATENCY, WHOLE, Figures, cluster_side, figure, measure, number, once, print_table,
    ratio, remove_unless_failed, started_etcd,
)
from tests.bench.compare import BenchRun, _mean
from tests.cluster.etcd import NO_ETCD_REASON, EtcdServer, find_etcd
from tests.cluster.nodes import Cluster
from tests.tls_certs import make_certificates

GOAL = ">= 0.80"  # TLS / plain throughput asked for


def tls_cluster(root: Path, etcd: str) -> Cluster:
    """Three nodes with TLS between them (and the management API over HTTPS, which it needs)."""
    certificates = make_certificates(root / "certs")
    cluster = Cluster(root, f"tls{uuid.uuid4().hex[:8]}", etcd, in_memory=False, tls=True)
    for node in cluster.nodes.values():
        node.config_path.write_text(
            node.config_path.read_text().replace("[management]\n", "[management]\ntls = true\n")
            + f'[tls]\ncertfile = "{certificates.path("node.pem")}"\nkeyfile = "{certificates.path("node.key")}"\n'
            f'cacertfile = "{certificates.path("ca.pem")}"\n')
    return cluster


def alternate(run: BenchRun, plain: Cluster, tls: Cluster, etcd: EtcdServer, seconds: float) -> dict[str, Figures]:
    """P T T P: each side's two runs averaged."""
    outcomes: dict[str, list[Figures]] = {"plain": [], "tls": []}
    for name in ("plain", "tls", "tls", "plain"):
        figures = measure(cluster_side(plain if name == "plain" else tls, etcd), run, seconds)
        print(f"{run.name} / {name}: {figures}", file=sys.stderr, flush=True)
        outcomes[name].append(figures)
    return {name: _mean(*figures) for name, figures in outcomes.items()}


def rows(title: str, outcomes: dict[str, Figures], latency: bool) -> list[tuple[str, ...]]:
    plain, tls = outcomes["plain"], outcomes["tls"]

    def row(label: str, metric: str, goal: str = "") -> tuple[str, ...]:
        return (label, number(figure(plain, metric)), number(figure(tls, metric)),
                ratio(figure(tls, metric), figure(plain, metric)), goal)

    lines = [row(f"{title} (msg/s)", "msg/s", "" if latency else GOAL),
             row("  leader CPU per message, whole run (µs)", WHOLE),
             *(row(f"  {label} CPU per message, whole process (µs)", f"cpu us/msg {label}")
               for label in FOLLOWER_LABELS)]
    if latency:
        lines += [row(f"  confirm latency {cut} (ms) [lower is better]", f"{cut} ms") for cut in ("p50", "p99")]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cluster_tls", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each run")
    args = parser.parse_args(argv)
    if find_etcd() is None:
        print(f"not run: {NO_ETCD_REASON}")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="warren-cluster-tls-bench-"))
    failed = True
    try:
        with contextlib.ExitStack() as stack:
            table, failed = run_all(args.seconds, workdir, stack)
        print_table(table, ("figure", "plain", "tls", "tls/plain", "goal"))
        print("Two clusters of three nodes (one with TLS between its nodes), etcd and the load generator share this "
              "machine's cores and disk; a leader's CPU is over the load generator's timed part, a follower's over "
              "its whole process.")
    finally:
        remove_unless_failed(workdir, failed)
    return 1 if failed else 0


def run_all(seconds: float, workdir: Path, stack: contextlib.ExitStack) -> tuple[list[tuple[str, ...]], bool]:
    """Both clusters started (stopped by ``stack``) and both runs alternated; (table rows, whether a run failed)."""
    etcd = started_etcd(workdir, stack)
    (workdir / "plain").mkdir()
    plain = Cluster(workdir / "plain", f"plain{uuid.uuid4().hex[:8]}", etcd.endpoint, in_memory=False)
    tls = tls_cluster(workdir / "tls", etcd.endpoint)
    for cluster in (plain, tls):
        stack.callback(once(cluster.stop))
        cluster.start()
    table: list[tuple[str, ...]] = []
    failed = False
    for run, title, latency in ((CONFIRMS, "persistent confirms, window 1000, 16 B", False),
                                (LATENCY, "persistent confirms, window 1, 16 B", True)):
        outcomes = alternate(run, plain, tls, etcd, seconds)
        failed |= any(isinstance(outcome, str) for outcome in outcomes.values())
        table += rows(title, outcomes, latency)
    return table, failed


if __name__ == "__main__":
    sys.exit(main())
