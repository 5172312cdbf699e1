"""Start and stop the brokers a comparison runs against: Warren and a throwaway reference RabbitMQ."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, free_ports_in_a_row
from tests.waiting import wait_for
from warrenperf.client import BenchConnection, BrokerURL
from warrenperf.process_memory import descendants, listener_pid

REPO_ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_REF = Path(os.environ.get("WARREN_RABBITMQ_REF", REPO_ROOT / "tools" / "rabbitmq-ref"))
WARREN_START_SECONDS = 30
RABBITMQ_START_SECONDS = 120
STOP_SECONDS = 30
READY_POLL_SECONDS = 0.2  # an external process gives no event to await: its port is polled


class BrokerUnavailable(Exception):
    """A broker could not be started; the message says why."""


@dataclass
class RunningBroker:
    name: str
    port: int
    process: subprocess.Popen  # the process we started (for RabbitMQ, the rabbitmq-ref script)
    pid: int  # the process listening on the port, whose memory is measured

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def stop(self) -> None:
        """Stop every process we started for this broker: SIGTERM to each of their groups, then SIGKILL."""
        tree = [self.process.pid, *descendants(self.process.pid)]
        _signal_groups(tree, signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
            self.process.poll()  # reaps our direct child so that it stops counting as alive
            time.sleep(READY_POLL_SECONDS)
        _signal_groups([pid for pid in tree if _alive(pid)], signal.SIGKILL)
        self.process.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _signal_groups(pids: list[int], signum: int) -> None:
    """Signal the process group of each pid (rabbitmq-server runs beam.smp in a session of its own under su)."""
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgrp())
    for group in groups:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            continue


async def _handshake(url: str) -> None:
    connection = await BenchConnection.open(BrokerURL.parse(url))
    await connection.close()


def _wait_until_ready(name: str, process: subprocess.Popen, port: int, log: Path, seconds: float) -> RunningBroker:
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"

    def ready() -> bool:
        if process.poll() is not None:
            raise BrokerUnavailable(f"{name} exited with code {process.returncode}: {_tail(log)}")
        try:
            asyncio.run(asyncio.wait_for(_handshake(url), READY_POLL_SECONDS * 25))
            return True
        except Exception:  # not listening yet, or still booting
            return False
    try:
        wait_for(ready, seconds, f"{name} accepting an AMQP handshake", READY_POLL_SECONDS)
    except AssertionError:
        RunningBroker(name, port, process, process.pid).stop()
        raise BrokerUnavailable(f"{name} did not accept an AMQP handshake within {seconds:.0f} s: {_tail(log)}") \
            from None
    return RunningBroker(name, port, process, listener_pid(port))


def _tail(log: Path, lines: int = 5) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:]) or "(no output)"


def start_warren(workdir: Path, *extra_args: str, wrapper: tuple[str, ...] = (),
                 start_seconds: float = WARREN_START_SECONDS) -> RunningBroker:
    """Warren on a free port, its data dir in workdir (extra_args: more command-line options, e.g. --config;
    wrapper: a command that runs Python, e.g. valgrind and its options)."""
    port = free_port()
    log = workdir / "warren.log"
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(workdir / "warren-data"), "--log-level", "warning", "--management-port", "0",
             "--prometheus-port", "0", "--mqtt-port", "0", *extra_args],
            cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    return _wait_until_ready("Warren", process, port, log, start_seconds)


def start_rabbitmq(workdir: Path, *options: str) -> RunningBroker:
    """A reference RabbitMQ on free ports, its data dir in workdir (options: rabbitmq-ref's, e.g. --management)."""
    if shutil.which("rabbitmq-server") is None:
        raise BrokerUnavailable("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
    if not RABBITMQ_REF.exists():
        raise BrokerUnavailable(f"{RABBITMQ_REF} is missing (set WARREN_RABBITMQ_REF)")
    port = free_ports_in_a_row(2)  # RabbitMQ takes PORT + 1 for Erlang distribution
    log = workdir / "rabbitmq.log"
    with open(log, "wb") as output:
        process = subprocess.Popen([str(RABBITMQ_REF), str(port), str(workdir / "rabbitmq-data"), *options],
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    return _wait_until_ready("RabbitMQ", process, port, log, RABBITMQ_START_SECONDS)
