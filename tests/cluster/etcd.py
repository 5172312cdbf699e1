"""One etcd member for the cluster tests: on 127.0.0.1 (or at a Place of tests/cluster/netns.py) with ephemeral
client and peer ports and a temp data dir, in memory where the machine has room (tests/cluster/scratch.py).

The binary is the first of: $WARREN_ETCD, `etcd` on PATH, or the copy `make etcd` unpacks from Debian's
etcd-server package into .cache/etcd. Without one, the tests that need etcd are skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.cluster.netns import LOCAL, Place
from tests.cluster.scratch import scratch_dir
from tests.conftest import REPO_ROOT, free_port
from tests.waiting import wait_for

UNPACKED_ETCD = REPO_ROOT / ".cache" / "etcd" / "usr" / "bin" / "etcd"
START_ATTEMPTS = 5  # fresh ports are tried this many times when another process takes the chosen ones first
HEALTHY_TIMEOUT = 20.0  # seconds etcd may take to answer /health after its start
ROOM = 512 * 1024 * 1024  # free memory etcd's data dir asks for (it preallocates a 64 MiB log file)


def find_etcd() -> str | None:
    """The etcd binary the tests use, or None when there is none."""
    if named := os.environ.get("WARREN_ETCD"):
        return named
    return shutil.which("etcd") or (str(UNPACKED_ETCD) if os.access(UNPACKED_ETCD, os.X_OK) else None)


NO_ETCD_REASON = ("no etcd binary: set WARREN_ETCD, put etcd on PATH, or run `make etcd` "
                  "(it unpacks Debian's etcd-server into .cache/etcd)")


class EtcdServer:
    """An etcd process the tests own. kill() and restart() make an outage (it comes back on the same ports with the
    same data, so its keys and leases are still there); pause() and resume() make it hang."""

    def __init__(self, binary: str, workdir: Path, place: Place = LOCAL):
        self.binary = binary
        self.host = place.host  # where it listens, for clients and peers
        self.prefix = place.prefix  # the command prefix that runs it there (`ip netns exec NS`)
        self.data_dir = workdir / "data"
        self.log_path = workdir / "etcd.log"
        self.client_port = 0  # where clients connect (0 until start() picks it)
        self.peer_port = 0  # raft's port, unused with one member but etcd listens on it all the same
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "etcd was never started"
        return self.process.pid

    def start(self) -> None:
        """Start on fresh free ports, trying others when another process takes them first."""
        for _ in range(START_ATTEMPTS):
            self.client_port, self.peer_port = free_port(), free_port()
            if self._launch():
                return
        raise RuntimeError(f"etcd did not start in {START_ATTEMPTS} attempts; see {self.log_path}")

    def restart(self) -> None:
        """Start again after kill(), on the same ports and data dir."""
        if not self._launch():
            raise RuntimeError(f"etcd did not restart on {self.endpoint}; see {self.log_path}")

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP, returning once every thread of etcd has stopped: a hung etcd, its connections open."""
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(self._stopped, 5, f"etcd {self.pid} stopped", 0.01)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def _launch(self) -> bool:
        """Run etcd and wait until it is healthy; False when it exited first (its ports were taken)."""
        client_url, peer_url = f"http://{self.endpoint}", f"http://{self.host}:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*self.prefix, self.binary, "--name", "warren-test", "--data-dir", str(self.data_dir),
                 "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"warren-test={peer_url}", "--logger", "zap", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + HEALTHY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._healthy():
                return True
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd on {self.endpoint} not healthy after {HEALTHY_TIMEOUT}s; see {self.log_path}")

    def _stopped(self) -> bool:
        """Whether every thread is in the stopped state (a group stop reaches the threads one by one)."""
        tasks = Path(f"/proc/{self.pid}/task")
        return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks.iterdir())

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False


def started_etcd(place: Place = LOCAL):
    """Yield a started EtcdServer (running at ``place``), then stop it and remove its files (a generator for
    fixtures)."""
    binary = find_etcd()
    if binary is None:
        pytest.skip(NO_ETCD_REASON)
    workdir = scratch_dir("warren-etcd-", ROOM)
    server = EtcdServer(binary, workdir, place)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def etcd_server():
    """One etcd for the whole run; tests keep apart by key prefix (etcd_prefix). Not to be killed: a test that
    makes an outage takes own_etcd."""
    yield from started_etcd()


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server) -> str:
    return etcd_server.endpoint


@pytest.fixture
def own_etcd():
    """An etcd for one test alone, free to kill and restart."""
    yield from started_etcd()


@pytest.fixture
def etcd_prefix(request) -> str:
    """A key prefix no other test uses."""
    return f"/warren-test/{request.node.name}-{uuid.uuid4().hex[:8]}"
