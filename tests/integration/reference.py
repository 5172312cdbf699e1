"""A reference RabbitMQ 3.10 (Debian's rabbitmq-server) started by tools/rabbitmq-ref for a test module, with its
management API: for the tests that compare Warren with it, or move messages between the two."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import REPO_ROOT, listening, wait_for_port

REFERENCE_SCRIPT = REPO_ROOT / "tools" / "rabbitmq-ref"


class Reference:
    """A RabbitMQ 3.10 started by rabbitmq-ref with its management API, its state under root (kept across a
    restart)."""

    def __init__(self, port: int, root: Path, options: tuple[str, ...]):
        self.host, self.port = "127.0.0.1", port
        self.management_url = f"http://127.0.0.1:{port + 10000}"
        self.root = root
        self.options = options  # rabbitmq-ref's, beside --management
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    def start(self) -> None:
        with open(self.root / "rabbitmq.log", "ab") as log:
            self.process = subprocess.Popen(
                [str(REFERENCE_SCRIPT), str(self.port), str(self.root / "node"), "--management", *self.options],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # (the management plugin listens before the AMQP listener, which RabbitMQ starts last)
        for listener in (self.port + 10000, self.port):
            wait_for_port("127.0.0.1", listener, self.process, timeout=60)

    def stop(self) -> None:
        if self.process is not None:
            stop_reference(self.process, self.root / "node" / "pid", self.port)
            self.process = None

    def restart(self) -> None:
        """Stopped and started again on the same state: what was durable is there again."""
        self.stop()
        self.start()


@contextlib.contextmanager
def reference_rabbitmq(port: int, *options: str) -> Iterator[Reference]:
    """The reference node on port (its API on port + 10000), with rabbitmq-ref's options; the test is skipped,
    saying why, where it cannot run."""
    if os.environ.get("WARREN_TEST_URL"):
        pytest.skip("starts a RabbitMQ of its own beside a Warren of its own")
    if shutil.which("rabbitmq-server") is None or not REFERENCE_SCRIPT.exists():
        pytest.skip(f"needs rabbitmq-server (apt-get install -y rabbitmq-server) and {REFERENCE_SCRIPT}")
    if listening(port) or listening(port + 10000):
        pytest.skip(f"port {port} or {port + 10000} is taken: the reference RabbitMQ needs both")
    root = Path(tempfile.mkdtemp(prefix="warren-reference-"))
    root.chmod(0o755)  # the node may run as the rabbitmq user, who must reach its data dir
    node = Reference(port, root, options)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def stop_reference(process: subprocess.Popen, pid_file: Path, port: int, timeout: float = 30.0) -> None:
    """Stop the node through the pid it wrote (rabbitmq-server runs it under su, in a session of its own, which
    a signal to the launcher's process group would not reach), then the launcher."""
    if pid_file.exists():
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while (listening(port) or _alive(pid)) and time.monotonic() < deadline:
            time.sleep(0.2)  # (until the node's VM is gone: a restart needs its distribution port free)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
