"""A cluster of workers: three nodes of three workers, vhosts v0, v1 and v2 pinned to groups 0, 1 and 2, each
group led by another node. On this machine, all on 127.0.0.1 with one etcd (tests/cluster/etcd.py):

(a) persistent confirms (window 1000, 16 B) in the three vhosts at once, a load generator process for each,
    connected to the node that leads its vhost: each vhost's rate against the same cluster with v0 alone busy
    (the goal: each within 0.8x), runs alternated one, all, all, one;
(b) opening a connection (pika, TCP connect to connection.open-ok, p50 and p99): through the front door of the node
    that leads the vhost's group (a hand-off to its worker), through another node's (a forward), and to a
    one-process broker.

    python -m tests.bench.groups [--seconds N] [--opens N]

(a) needs a core for each busy group's leader, its followers' writers and each load generator: on a small
machine it shows that the set-up runs, not how it scales.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pika

from tests.bench.brokers import start_warren
from tests.bench.loadgen import time_limit
from tests.cluster.etcd import NO_ETCD_REASON, find_etcd, started_etcd
from tests.cluster.nodes import Cluster, Observer
from tests.conftest import REPO_ROOT
from tests.waiting import wait_for

GROUPS = 3
VHOSTS = [f"v{group}" for group in range(GROUPS)]
TABLES = "\n".join(
    f'[[vhosts]]\nname = "{name}"\nworker = {group}\n'
    f'[[permissions]]\nuser = "guest"\nvhost = "{name}"\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
    for group, name in enumerate(VHOSTS))


def led_one_per_node(cluster: Cluster, observers: list[Observer]) -> dict[str, str]:
    """Have group k led by the k-th node (an operator's choice, PUT /api/vhosts/vk/leader); vhost -> its node."""
    wanted = dict(zip(VHOSTS, sorted(cluster.nodes)))
    port = cluster.nodes["a"].management_port
    for vhost, node in wanted.items():
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/vhosts/{vhost}/leader", method="PUT",
            data=json.dumps({"node": node}).encode(),
            headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"})
        wait_for(lambda: answered(request), 60, f"{node} asked to lead {vhost}", step=0.2)
    for group, vhost in enumerate(VHOSTS):
        wait_for(lambda: (observers[group].leader() or ("",))[0] == wanted[vhost], 60, f"{vhost} led by its node")
    return wanted


def answered(request: urllib.request.Request) -> bool:
    try:
        with urllib.request.urlopen(request, timeout=10):
            return True
    except OSError:
        return False


def confirms(url: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.bench.loadgen", "--url", url, "--scenario", "confirms",
                             "--window", "1000", "--persistent", "--seconds", str(seconds), "--json"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def busy(cluster: Cluster, leaders: dict[str, str], vhosts: list[str], seconds: float) -> dict[str, float]:
    """Persistent confirms in each of vhosts at once, each at the node leading it: vhost -> msg/s."""
    runs = {vhost: confirms(f"amqp://guest:guest@127.0.0.1:{cluster.nodes[leaders[vhost]].port}/{vhost}", seconds)
            for vhost in vhosts}
    rates = {}
    for vhost, process in runs.items():
        output, errors = process.communicate(timeout=time_limit(seconds) + 60)
        if process.returncode != 0:
            raise RuntimeError(f"the load generator of {vhost} failed: {errors.strip().splitlines()[-1:]}")
        rates[vhost] = json.loads(output.strip().splitlines()[-1])["figures"]["msg/s"]
    return rates


def opens(port: int, vhost: str, count: int) -> tuple[float, float]:
    """p50 and p99 milliseconds of opening a connection (after a few untimed ones)."""
    times = []
    for index in range(count + 10):
        started = time.perf_counter()
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost)).close()
        if index >= 10:
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.groups", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each throughput run")
    parser.add_argument("--opens", type=int, default=200, help="connections opened for each figure of (b)")
    args = parser.parse_args(argv)
    if find_etcd() is None:
        print(NO_ETCD_REASON, file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        etcd = stack.enter_context(contextlib.contextmanager(started_etcd)())
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="warren-bench-groups-")))
        name = f"bench{uuid.uuid4().hex[:8]}"
        cluster = Cluster(workdir, name, etcd.endpoint, workers=GROUPS, tables=TABLES, in_memory=False)
        observers = [cluster.observer, *(Observer(etcd.endpoint, name, group) for group in range(1, GROUPS))]
        for observer in observers[1:]:
            stack.callback(observer.close)
        stack.callback(cluster.stop)
        cluster.start()
        leaders = led_one_per_node(cluster, observers)
        print(f"groups led by: {leaders}", file=sys.stderr)
        alone: list[float] = []
        together: dict[str, list[float]] = {vhost: [] for vhost in VHOSTS}
        for turn in ("one", "all", "all", "one"):
            rates = busy(cluster, leaders, VHOSTS if turn == "all" else ["v0"], args.seconds)
            print(f"{turn}: {rates}", file=sys.stderr, flush=True)
            if turn == "one":
                alone.append(rates["v0"])
            else:
                for vhost, rate in rates.items():
                    together[vhost].append(rate)
        baseline = statistics.mean(alone)
        print(f"(a) persistent confirms, v0 alone busy: {baseline:,.0f} msg/s")
        for vhost, rates in together.items():
            print(f"    {vhost} with all three busy: {statistics.mean(rates):,.0f} msg/s "
                  f"({statistics.mean(rates) / baseline:.2f} x v0 alone)")
        here = cluster.nodes[leaders["v0"]]
        elsewhere = cluster.nodes[leaders["v1"]]
        local, forwarded = opens(here.port, "v0", args.opens), opens(elsewhere.port, "v0", args.opens)
        single = start_warren(workdir)
        stack.callback(single.stop)
        alone_open = opens(single.port, "/", args.opens)
        print("(b) opening a connection, p50 / p99 ms:")
        for what, (p50, p99) in (("one process", alone_open), ("through the leading node (hand-off)", local),
                                 ("through another node (forward)", forwarded)):
            print(f"    {what}: {p50:.2f} / {p99:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
