"""`make cluster-demo`: one etcd and three Warren nodes on 127.0.0.1, until Ctrl-C or SIGTERM.

    python -m tests.cluster.demo [--dir demo-cluster] [--etcd-port 2379] [--port 5672] [--management-port 15672]
                                 [--replication-port 5680] [--lease-ttl 5]

Node a, b and c take the given AMQP, management and replication ports, the next one and the one after (5672, 5673,
5674; 15672, ...; 5680, ...); etcd takes --etcd-port for clients and the next port for its peer URL. Everything the
demo writes (etcd's data dir, each node's config file, data dir and log) is under --dir, and kept: the next run
starts from it (remove the directory to start afresh). It runs on the cluster tests' harness (tests/cluster/etcd.py
and nodes.py). While it runs it reports every change of leader or of the in-sync replicas and every node that exits;
Enter (in a terminal) starts the nodes that exited again.
"""

from __future__ import annotations

import argparse
import select
import signal
import socket
import sys
import time
from pathlib import Path

from broker.config import Config
from tests.cluster.etcd import NO_ETCD_REASON, EtcdServer, find_etcd
from tests.cluster.nodes import Node, Observer
from tests.conftest import listening
from tests.waiting import wait_for

CLUSTER = "demo"
NAMES = ("a", "b", "c")
READY_TIMEOUT = 60.0  # seconds the nodes may take to elect a leader and all be in sync
POLL = 0.5  # seconds between reads of the leader and the ISR


class Stop(Exception):
    """SIGTERM, as Ctrl-C is KeyboardInterrupt."""


def _terminate(signum, frame) -> None:
    raise Stop


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("demo-cluster"), help="where everything is written")
    parser.add_argument("--etcd-port", type=int, default=2379, help="etcd's client port (its peer port: the next)")
    parser.add_argument("--port", type=int, default=5672, help="node a's AMQP port (b and c: the next two)")
    parser.add_argument("--management-port", type=int, default=15672, help="node a's management port")
    parser.add_argument("--replication-port", type=int, default=5680, help="node a's replication port")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="the nodes' etcd lease (s): the failover time")
    return parser.parse_args(argv)


def taken(ports: list[int]) -> list[int]:
    """The ports of 127.0.0.1 something else listens on or holds."""
    busy = []
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def check_ports(args: argparse.Namespace) -> None:
    """Stop at once, naming the ports, when one the demo needs is taken: a node that cannot listen exits and is
    elected again and again, with the reason only in its log."""
    ports = [args.etcd_port, args.etcd_port + 1] + [base + index for base in (
        args.port, args.management_port, args.replication_port) for index in range(len(NAMES))]
    busy = taken(ports)
    if busy:
        raise SystemExit(f"cluster-demo: port{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} of "
                         "127.0.0.1 taken; choose others, e.g. make cluster-demo DEMO_ARGS=\"--port 6672 "
                         "--management-port 16672 --replication-port 6680 --etcd-port 3379\"")


def start_etcd(root: Path, port: int) -> EtcdServer:
    binary = find_etcd()
    if binary is None:
        raise SystemExit(f"cluster-demo: {NO_ETCD_REASON}")
    (root / "etcd").mkdir(parents=True, exist_ok=True)
    etcd = EtcdServer(binary, root / "etcd")
    etcd.client_port, etcd.peer_port = port, port + 1  # fixed ports: restart() launches on the ports it is given
    try:
        etcd.restart()
    except RuntimeError:
        raise SystemExit(f"cluster-demo: etcd did not start on 127.0.0.1:{port} and :{port + 1} (taken? see "
                         f"{etcd.log_path}, or choose --etcd-port)") from None
    return etcd


def describe(observer: Observer) -> str:
    leader, isr = observer.leader(), observer.isr()
    return (f"leader {leader[0]} (epoch {leader[1]})" if leader else "no leader") + \
        f", in sync: {', '.join(isr) if isr else 'none known'}"


def interactive() -> bool:
    """Whether stdin is a terminal, where Enter can be pressed."""
    return sys.stdin is not None and sys.stdin.isatty()


def watch(nodes: list[Node], observer: Observer, etcd: EtcdServer) -> None:
    """Report changes until interrupted (or until etcd exits); a line on stdin (Enter) starts every node that exited
    again."""
    state = describe(observer)
    exited: set[str] = set()
    stdin = [sys.stdin] if interactive() else []
    while True:
        if stdin and select.select(stdin, [], [], POLL)[0]:
            if not sys.stdin.readline():
                stdin = []  # end of input: nothing more to read
            for node in nodes:
                if node.name in exited:
                    node.start()
                    exited.discard(node.name)
                    print(f"{time.strftime('%H:%M:%S')} node {node.name} started again (pid {node.process.pid})",
                          flush=True)
        elif not stdin:
            time.sleep(POLL)
        if etcd.process.poll() is not None:
            print(f"{time.strftime('%H:%M:%S')} etcd exited with code {etcd.process.returncode} (see "
                  f"{etcd.log_path}): stopping", flush=True)
            return
        now = describe(observer)
        if now != state:
            print(f"{time.strftime('%H:%M:%S')} {now}", flush=True)
            state = now
        for node in nodes:
            if node.name not in exited and not node.running:
                exited.add(node.name)
                again = "; press Enter to start it again" if stdin else ""
                print(f"{time.strftime('%H:%M:%S')} node {node.name} exited with code {node.process.returncode} "
                      f"(see {node.log_path}){again}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_ports(args)
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even where started with SIGINT ignored
    defaults = Config()
    etcd: EtcdServer | None = None
    nodes: list[Node] = []
    observer: Observer | None = None
    try:
        etcd = start_etcd(root, args.etcd_port)
        for index, name in enumerate(NAMES):
            ports = (args.port + index, args.management_port + index, args.replication_port + index)
            nodes.append(Node(root, name, CLUSTER, etcd.endpoint, ports=ports, lease_ttl=args.lease_ttl,
                              ack_timeout=defaults.cluster_ack_timeout, min_insync=defaults.cluster_min_insync))
        observer = Observer(etcd.endpoint, CLUSTER)
        stale = observer.leader()  # the leader key of an earlier run lives until its lease runs out
        for node in nodes:
            node.start()

        def ready() -> bool:
            leader, isr = observer.leader(), set(observer.isr() or ())
            return (leader is not None and (stale is None or leader[1] > stale[1]) and isr >= set(NAMES)
                    and all(listening(node.port) for node in nodes))
        try:
            wait_for(ready, READY_TIMEOUT, "a leader with all three nodes in sync", step=0.1)
        except AssertionError as error:
            print(f"cluster-demo: {error}: {describe(observer)}; see the logs under {root}", flush=True)
        print(f"Warren cluster {CLUSTER!r} on 127.0.0.1, etcd at {etcd.endpoint} (data in {etcd.data_dir}): "
              f"{describe(observer)}")
        for node in nodes:
            print(f"  node {node.name} (pid {node.process.pid}): amqp://guest:guest@127.0.0.1:{node.port}/  "
                  f"management :{node.management_port}  replication :{node.replication_port}  "
                  f"MQTT :{node.mqtt_port}  "
                  f"data {node.data_dir}  log {node.log_path}")
        leader = observer.leader()
        led_by = next((node for node in nodes if leader is not None and node.name == leader[0]), None)
        if led_by is not None:
            print(f"Management API and console: http://127.0.0.1:{led_by.management_port}/ (node {led_by.name}, the "
                  "leader; each follower's management port answers for the cluster too)")
        print("Connect to any node: a follower forwards the connection to the leader. kill -9 the leader's pid to "
              f"watch a failover (lease_ttl {args.lease_ttl:g} s); changes are reported below.")
        restart = "Enter starts the nodes that exited again. " if interactive() else ""
        print(f"{restart}Ctrl-C (or SIGTERM) stops all three nodes and etcd; their data stays in {root} for the next "
              "run (remove it to start afresh).", flush=True)
        watch(nodes, observer, etcd)
    except (KeyboardInterrupt, Stop):
        print("\ncluster-demo: stopping", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stopping short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for node in nodes:
            code = node.stop()
            if code is not None:
                print(f"node {node.name} stopped (exit code {code})", flush=True)
        if observer is not None:
            observer.close()
        if etcd is not None:
            etcd.stop()
            print("etcd stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
