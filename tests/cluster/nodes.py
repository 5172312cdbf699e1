"""Three Warren processes forming one cluster on a test's etcd, and an observer of its etcd keys.

Each node runs on 127.0.0.1 by default, or at a Place of its own (an address in a network namespace of
tests/cluster/netns.py, for the partition tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.cluster.netns import LOCAL, Place
from tests.cluster.scratch import scratch_dir
from tests.conftest import REPO_ROOT, free_port, free_ports_in_a_row
from tests.waiting import wait_for  # also imported from here by tests of the cluster


def _zombie(pid: int) -> bool:
    """Whether the process has ended and waits to be reaped (by whichever process adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return True

LEASE_TTL = 2.0  # the acceptance tests' lease (seconds)
ACK_TIMEOUT = 1.0  # and follower ack deadline
# free memory a cluster's data dirs ask for (tests/cluster/scratch.py): three copies of the suite's deepest queue,
# a million messages of test_failover_load.py, with room to spare
DATA_ROOM = 2 * 1024 ** 3


class Node:
    """One Warren process of the cluster; its ports and data dir stay the same across restarts."""

    def __init__(self, root: Path, name: str, cluster: str, etcd: str, *, ports: tuple[int, int, int] | None = None,
                 place: Place = LOCAL, workers: int = 1, tables: str = "", loopback_users: list[str] | None = None,
                 data_root: Path | None = None, **settings: object) -> None:
        """Its config and log in ``root``, its data dir in ``data_root`` (root when None).
        ``ports``: (AMQP, management, replication), free ones when None. ``place``: where it runs (its address
        serves AMQP, replication and, off loopback, the management API; guest may log in from anywhere there,
        unless ``loopback_users`` names it).
        ``workers``: its worker processes, each in the replication group of its number (replication ports from
        the one given on). ``tables``: config text after the rest ([[vhosts]]...)."""
        self.name = name
        self.host = place.host
        self.prefix = place.prefix  # the command prefix that runs it at its place (`ip netns exec NS`)
        self.port, self.management_port, self.replication_port = ports or (free_port(), free_port(),
                                                                           free_ports_in_a_row(workers))
        self.data_dir = (data_root or root) / name
        self.config_path = root / f"{name}.toml"
        self.log_path = root / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.ended_by_test = False  # whether the test killed or stopped its process (an exit otherwise is its own)
        # what its next start runs with besides the test's own: the working directory, and environment variables
        # (a PYTHONPATH holding another version's package metadata, for a rolling upgrade)
        self.workdir = REPO_ROOT
        self.environment: dict[str, str] = {}
        cluster_settings = {"lease_ttl": LEASE_TTL, "ack_timeout": ACK_TIMEOUT, "min_insync": 2, **settings}
        self.prometheus_port = free_port() if workers > 1 else 0
        self.mqtt_port = free_port()  # (the default, 1883, is one per machine: never the tests')
        self.mqtt_web_port = free_port()  # MQTT over WebSockets
        if place != LOCAL:  # the test process reaches it from another address: not loopback
            cluster_settings.setdefault("advertise_host", self.host)
        self.config_path.write_text("\n".join([
            "[server]", f'host = "{self.host}"', f"port = {self.port}", f'data_dir = "{self.data_dir}"',
            f'cluster_name = "{cluster}"', f"workers = {workers}", "[management]", f"port = {self.management_port}",
            *([] if place == LOCAL else [f'host = "{self.host}"', "[amqp]",
                                         f"loopback_users = {json.dumps(loopback_users or [])}"]),
            "[prometheus]", f"port = {self.prometheus_port}", "[mqtt]", f"port = {self.mqtt_port}",
            f"web_port = {self.mqtt_web_port}",
            "[cluster]", f'etcd_endpoints = ["{etcd}"]', f'node_id = "{name}"',
            f"replication_port = {self.replication_port}",
            *(f"{key} = {json.dumps(value) if isinstance(value, bool) else repr(value)}"
              for key, value in cluster_settings.items()), tables, ""]))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, f"{self.name} runs already"
        self.ended_by_test = False
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "broker", "--config", str(self.config_path)],
                cwd=self.workdir, env={**os.environ, **self.environment}, stdout=log, stderr=subprocess.STDOUT)

    def signal(self, sig: int) -> None:
        """sig to every process of the node, its supervisor and its workers (each in a process group of its own): a
        SIGSTOP pauses the whole node."""
        assert self.process is not None
        for each in self.pids():
            os.kill(each, sig)

    def pids(self) -> list[int]:
        """The node's processes: its supervisor, then its workers."""
        assert self.process is not None
        pid = self.process.pid
        return [pid, *(int(child) for task in Path(f"/proc/{pid}/task").glob("*")
                       for child in (task / "children").read_text().split())]

    def kill(self) -> None:
        """kill -9 of the whole node, as a crash of its machine: its supervisor and its workers at once (a worker
        whose supervisor alone died would still lead its group until it noticed), waiting until they are gone."""
        self.ended_by_test = True
        if self.process is not None and self.process.poll() is None:
            workers = self.pids()[1:]
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait(10)
            for pid in workers:
                wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, f"worker {pid} gone")

    def stop(self) -> int | None:
        if self.process is None:
            return None
        self.ended_by_test = True
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(10)

    def api(self, method: str, path: str, body: dict | None = None, user: str = "guest:guest",
            host: str | None = None) -> tuple[int, object]:
        """(status, JSON or None) of a request to the node's management API (host: the Host header, if not its
        address); (0, the reason) while it does not listen."""
        headers = {"Authorization": "Basic " + base64.b64encode(user.encode()).decode(),
                   "Content-Type": "application/json", **({"Host": host} if host is not None else {})}
        request = urllib.request.Request(f"http://{self.host}:{self.management_port}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")
        except urllib.error.URLError as error:  # not listening yet
            return 0, str(error)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_not_exited(self) -> None:
        """Fail, with the end of its log, if the node's process ended though the test neither killed nor stopped it
        (a restart refused: its port taken meanwhile, its data dir locked...)."""
        if self.process is not None and not self.ended_by_test and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited by itself with code {self.process.returncode}; the end of its "
                                 f"log:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Observer:
    """Reads the cluster's keys in etcd from a loop of its own, for tests written as plain functions."""

    def __init__(self, etcd: str, cluster: str, group: int = 0) -> None:
        """``group``: the replication group whose keys it reads (a node's workers' groups, cluster.groups)."""
        from cluster.etcd import EtcdCoordinator

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="etcd-observer", daemon=True)
        self._thread.start()
        prefix = f"/warren/{cluster}" + (f"/groups/{group}" if group else "")
        self._coordinator = EtcdCoordinator([etcd], prefix, "observer", 10.0)
        self._run(self._coordinator.start())

    def _run(self, coroutine, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def leader(self) -> tuple[str, int] | None:
        """(node id, epoch) of the leader, or None; None too while etcd does not answer."""
        from cluster.coordinator import CoordinatorUnavailable

        try:
            current = self._run(self._coordinator.leader())
        except CoordinatorUnavailable:
            return None
        return None if current is None else (current[0].node_id, current[1])

    def secret(self) -> str:
        """The secret etcd keeps for the cluster (made now if no node has asked for it yet)."""
        return self._run(self._coordinator.secret())

    def isr(self) -> list[str] | None:
        from cluster.coordinator import CoordinatorUnavailable

        try:
            return self._run(self._coordinator.isr())
        except CoordinatorUnavailable:
            return None

    def close(self) -> None:
        try:
            self._run(self._coordinator.close())
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class Cluster:
    """Three nodes a, b, c; ``ready()`` waits for a leader with every running node in the ISR."""

    def __init__(self, root: Path, cluster: str, etcd: str, *, places: Mapping[str, Place] | None = None,
                 in_memory: bool = True, **settings: object) -> None:
        """``places``: where each node runs, by name (127.0.0.1 for a name not given). The nodes' configs and logs
        in ``root``; their data dirs in memory where there is room (removed by ``stop()``), or with ``in_memory``
        False in ``root`` too, on the disk a benchmark measures."""
        self.name = cluster
        self.observer = Observer(etcd, cluster)  # (first: should etcd not answer, no data dir is left in memory)
        self.data_root = scratch_dir("warren-cluster-", DATA_ROOM) if in_memory else None
        self.nodes = {name: Node(root, name, cluster, etcd, place=(places or {}).get(name, LOCAL),
                                 data_root=self.data_root, **settings)
                      for name in ("a", "b", "c")}

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes.values()]

    def leader(self) -> Node | None:
        current = self.observer.leader()
        return self.nodes[current[0]] if current else None

    def followers(self) -> list[Node]:
        leader = self.leader()
        return [node for node in self.nodes.values() if node is not leader]

    def ready(self, timeout: float = 30.0) -> Node:
        """Wait until a leader serves and every running node is in the ISR; the leader. Fails at once if a node
        exited by itself."""
        def settled():
            for node in self.nodes.values():
                node.check_not_exited()
            leader = self.leader()
            isr = self.observer.isr() or []
            running = {name for name, node in self.nodes.items() if node.running}
            return leader if leader is not None and running <= set(isr) else None
        return wait_for(settled, timeout, "a leader with every running node in the ISR")

    @contextlib.contextmanager
    def running(self) -> Iterator[Cluster]:
        """Start the nodes and wait until they are ready; on the way out, their logs when that failed, and stop them."""
        self.start()
        try:
            self.ready()
            yield self
        except BaseException:
            print(self.logs())
            raise
        finally:
            self.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{node.log()[-6000:]}" for name, node in self.nodes.items())

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.observer.close()
        if self.data_root is not None:
            shutil.rmtree(self.data_root, ignore_errors=True)
