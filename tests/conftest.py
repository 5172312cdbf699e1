"""Shared fixtures: a Warren broker on an ephemeral loopback port with a temporary data dir.

Set WARREN_TEST_URL (e.g. amqp://guest:guest@127.0.0.1:21672/%2F) to run the same tests against another
broker, such as a reference RabbitMQ started with tools/rabbitmq-ref; its management API is taken to be
on the AMQP port + 10000 (rabbitmq-ref's --management), or at WARREN_TEST_MANAGEMENT_URL.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from tests.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
EXTERNAL_URL = os.environ.get("WARREN_TEST_URL")
EXTERNAL_MANAGEMENT_URL = os.environ.get("WARREN_TEST_MANAGEMENT_URL")
WORKERS = int(os.environ.get("WARREN_TEST_WORKERS", "1"))  # worker processes of the brokers the tests start
WORKER_OPTIONS = ["--workers", str(WORKERS)] if WORKERS > 1 else []  # the options that ask for them
# [queues] leader_locator of those brokers (a test that gives a config of its own runs with that config's)
LEADER_LOCATOR = os.environ.get("WARREN_TEST_LEADER_LOCATOR")
# [server] spread_vhosts of those brokers: every worker serves every vhost's clients
SPREAD = os.environ.get("WARREN_TEST_SPREAD") == "1"
if LEADER_LOCATOR or SPREAD:
    _workers_config = Path(tempfile.mkdtemp(prefix="warren-test-config-")) / "warren.toml"
    _workers_config.parent.chmod(0o755)  # (a broker some tests run as another user reads it too)
    _workers_config.write_text(("[server]\nspread_vhosts = true\n" if SPREAD else "")
                               + (f'[queues]\nleader_locator = "{LEADER_LOCATOR}"\n' if LEADER_LOCATOR else ""))
    WORKER_OPTIONS += ["--config", str(_workers_config)]
# The Spark JVMs the tests start (a session here, the drivers of the examples) run for seconds to minutes: the C1
# compiler alone and one GC thread serve them as well, and save a third of their CPU time (C2's compiler threads),
# which the other tests running at the same time on a small machine get instead.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1")
# Every broker, worker and node the tests start imports aiohttp, which loads the system's CA certificates as it is
# imported (two SSL contexts: 35 ms of CPU of a broker's 0.3 s start, and the suite starts about a thousand). No test
# trusts a certificate through the system's list (each TLS test makes its own CA and names it), so the processes of
# the suite read an empty one.
os.environ["SSL_CERT_FILE"] = os.devnull


def pytest_sessionstart(session) -> None:
    """Tests of a compiled module older than its source would test the old code: refuse, saying how to rebuild."""
    from broker.compiled import refusal
    if refused := refusal():
        pytest.exit(refused, returncode=2)


def pytest_sessionfinish(session) -> None:
    """The private directories of the `--workers` supervisors the tests killed (own_broker ends its brokers with
    kill -9) go, as the next supervisor's start would remove them; one whose supervisor lives stays. So does this
    test process's config for WARREN_TEST_LEADER_LOCATOR or WARREN_TEST_SPREAD (its brokers are stopped by now)."""
    from broker.workers.supervisor import remove_stale_private_directories
    remove_stale_private_directories()
    if LEADER_LOCATOR or SPREAD:
        shutil.rmtree(_workers_config.parent, ignore_errors=True)


# `make test` runs the suite on several processes at once (pytest-xdist), then the tests marked `alone` by
# themselves: these time the broker, or what runs at the same time, which other tests' load would blur.
# Folders whose tests run one after another in one process, ahead of the rest so that the longest stretches start
# first: the Spark tests (one SparkSession, and drivers of their own that two at once would starve) and the clusters
# on one etcd and its network namespaces. Within Spark's, the replay scenarios that start and kill drivers go first.
# And the modules that start a reference RabbitMQ on a port of their own (tests/integration/reference.py): their
# tests in one process, so that no two start a node on one port, nor three nodes run at once on a small machine.
# And Paho's interoperability cases, which the process that runs their module starts all at once.
SERIAL_GROUPS = ["spark", "cluster", "rabbitmq", "paho"]
FIRST_IN_GROUP = {"test_stream_exactly_once.py"}
SERIAL_MODULES = {"test_definitions.py": "rabbitmq", "test_shovel_migration.py": "rabbitmq",
                  "test_federation_with_rabbitmq.py": "rabbitmq", "test_paho_interop.py": "paho"}


def serial_group(path: Path) -> str | None:
    if path.parent.name in SERIAL_GROUPS:
        return path.parent.name
    return SERIAL_MODULES.get(path.name)


def pytest_collection_modifyitems(items) -> None:
    """The serial groups first; then the other tests, those marked slow first: a process free takes the next test
    in this order, so the long ones (Paho's cases, which mostly wait, and the wheel's build) run beside the groups
    rather than last, when the other processes are done (a minute or two of a machine left idle)."""
    def place(item) -> tuple[int, bool, bool]:
        group = serial_group(item.path)
        return (SERIAL_GROUPS.index(group) if group else len(SERIAL_GROUPS), item.path.name not in FIRST_IN_GROUP,
                group is None and item.get_closest_marker("slow") is None)
    items.sort(key=place)


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(SerialGroupScheduling())


class SerialGroupScheduling:
    """`--dist loadgroup` as this suite means it: the tests of a serial group go to one process, in the order
    collected (groups first); every other test goes to whichever process is free. (pytest-xdist's own loadgroup
    reads groups from node ids it rewrites, which pytest 9.2 no longer reads back.)"""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return serial_group(Path(nodeid.split("::")[0])) or nodeid

        config.option.loadscopereorder = False  # keep the collection's order: the groups first
        return Scheduling(config, log)


# The ports the tests pick for their brokers, nodes and etcd lie below the kernel's ephemeral range: a client that
# retries a broker it was killed under (a publisher trying every node of a cluster, a follower its leader) must not
# reach a listener the kernel has meanwhile given another process on a port of that range (Spark serves each
# collect() on a listener of port 0 that takes one connection: a stray one there failed a Spark query in the suite).
# Each pytest-xdist process takes its ports in turn from a slice of its own, so that two tests at once never pick
# the same one, and a port let go comes round again only after the rest of its slice.
LOWEST_PORT = 20_000  # (below: the services a machine may run, and the ports the tests must never use, 5672...)
PORT_SLICES = 8  # slices of [LOWEST_PORT, the ephemeral range): pytest-xdist's processes gw0..gw7 (gw8 shares gw0's)


def _port_slice() -> range:
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768  # Linux's default
    size = (ephemeral - LOWEST_PORT) // PORT_SLICES
    if size < 100:  # an ephemeral range reaching this low: ports of the kernel's choosing, as the best there is
        return range(0)
    process = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % PORT_SLICES
    return range(LOWEST_PORT + process * size, LOWEST_PORT + (process + 1) * size)


PORTS = _port_slice()  # this process's
_next_port = [0]  # the index in PORTS of the next port to try


def free_port() -> int:
    """A loopback port free now: the next of this process's slice (or one the kernel picks, where there is none)."""
    for _ in range(len(PORTS)):
        port = PORTS[_next_port[0] % len(PORTS)]
        _next_port[0] += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports_in_a_row(count: int) -> int:
    """The first of ``count`` consecutive ports free now (a node's workers take replication_port + k)."""
    while True:
        first = free_port()
        if PORTS and first + count > PORTS.stop:  # (into the next process's slice)
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first + 1, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except (OSError, OverflowError):  # taken, or past port 65535
                continue
        if first in PORTS:
            _next_port[0] += count - 1  # the next free_port() goes past them
        return first


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on host:port now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, process: subprocess.Popen | None, timeout: float = 15.0) -> None:
    """Block until something accepts TCP connections on host:port (or the process dies)."""
    def accepting() -> bool:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"broker exited with code {process.returncode} before listening")
        return listening(port, host)
    wait_for(accepting, timeout, f"something listening on {host}:{port}")


@dataclass
class Broker:
    """A broker the tests talk to: started here, or an external one named by WARREN_TEST_URL."""

    host: str
    port: int
    data_dir: Path | None = None  # None for an external broker
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    management_port: int = 0  # the management API's port (an ephemeral one for a broker started here)
    prometheus_port: int = 0  # the Prometheus endpoint's port (likewise)
    mqtt_port: int = 0  # the MQTT listener's port (likewise)
    started: bool = False  # it has run once: its AMQP port stays what clients were told

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    @property
    def management_url(self) -> str:
        """Base URL of the management HTTP API (no trailing slash)."""
        if self.external and EXTERNAL_MANAGEMENT_URL:
            return EXTERNAL_MANAGEMENT_URL.rstrip("/")
        return f"http://{self.host}:{self.management_port}"

    @property
    def external(self) -> bool:
        return self.data_dir is None

    def start(self) -> None:
        """Start the process; should a port picked by free_port() be taken by someone else before the broker binds
        it (another process's client socket may get it as its local port), the ephemeral ones are picked again."""
        first = self.process is None and not self.started  # the AMQP port too may be picked again then
        for attempt in range(3):
            try:
                self._start()
                self.started = True
                return
            except RuntimeError:
                last = (self.log().splitlines() or [""])[-1]
                if attempt == 2 or "Address already in use" not in last:
                    raise
                if f":{self.port}:" in last and first:  # "cannot listen on HOST:PORT: reason"
                    self.port = free_port()
                self.management_port = self.prometheus_port = self.mqtt_port = 0

    def _start(self) -> None:
        assert self.data_dir is not None
        self.log_path = self.data_dir.parent / f"broker-{self.port}.log"
        log = open(self.log_path, "ab")
        if not self.management_port:
            self.management_port = free_port()
        if not self.prometheus_port:
            self.prometheus_port = free_port()
        if not self.mqtt_port:
            self.mqtt_port = free_port()
        cmd = [sys.executable, "-m", "broker", "--host", self.host, "--port", str(self.port),
               "--data-dir", str(self.data_dir), "--log-level", "info",
               "--management-port", str(self.management_port), "--prometheus-port", str(self.prometheus_port),
               "--mqtt-port", str(self.mqtt_port), *WORKER_OPTIONS, *self.extra_args]
        self.process = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for_port(self.host, self.port, self.process)
        for option, port in (("--management-port", self.management_port), ("--prometheus-port", self.prometheus_port)):
            if option not in cmd[cmd.index("--prometheus-port") + 2:]:  # a port no later option takes back
                wait_for_port(self.host, port, self.process)  # it starts listening just after AMQP

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Stop the process with `sig` (SIGKILL for a crash) and return its exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.process = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def logged_at(stamp: str) -> float:
    """time.time() of a log line's local time stamp (its first 23 characters in the text format)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _external_broker() -> Broker:
    parsed = urllib.parse.urlparse(EXTERNAL_URL)
    port = parsed.port or 5672
    return Broker(host=parsed.hostname or "127.0.0.1", port=port, management_port=port + 10000,
                  prometheus_port=port + 20000, mqtt_port=int(os.environ.get("WARREN_TEST_MQTT_PORT", "1883")))


@pytest.fixture(autouse=True)
def no_collection_of_this_process_while_timing(request):
    """A test marked `alone` times the broker from this process (another client's round trips, mostly): this
    process's own collector, which walks what the earlier tests left, must not pause it meanwhile (in a run of the
    alone tests, its full collections took 66 to 194 ms at once, and a round trip timed across one failed its 50 ms).
    Refcounting still frees what the test lets go; a cycle it made waits for the collection at its end."""
    if request.node.get_closest_marker("alone") is None:
        yield
        return
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture(scope="session")
def broker():
    """One broker for the whole session; tests use unique names so they do not see each other."""
    if EXTERNAL_URL:
        yield _external_broker()
        return
    root = Path(tempfile.mkdtemp(prefix="warren-test-"))
    instance = Broker(host="127.0.0.1", port=free_port(), data_dir=root / "data")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def own_broker(tmp_path):
    """A broker of the test's own (for restarts, kills and config), stopped at the end of the test."""
    if EXTERNAL_URL:
        pytest.skip("needs a broker process of its own")
    started: list[Broker] = []

    def start(*extra_args: str, data_dir: Path | None = None) -> Broker:
        instance = Broker(host="127.0.0.1", port=free_port(), data_dir=data_dir or tmp_path / "data",
                          extra_args=list(extra_args))
        instance.start()
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop(signal.SIGKILL)


@pytest.fixture
def unique(request):
    """A name prefix unique to the test, for queues and exchanges on a shared broker."""
    base = request.node.name.replace("[", "-").replace("]", "")
    return f"t-{base}-{os.getpid()}-{int(time.monotonic_ns() % 1_000_000)}"
