"""What an operator sees when the broker cannot start: one line naming the data dir or the address and why, exit
code 1, no traceback. A port in use is reported before the data dir is touched. Runs only against Warren."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import EXTERNAL_URL, REPO_ROOT, WORKER_OPTIONS, Broker, free_port, wait_for_port
from tests.integration.helpers import connect
from tests.tmpfs import tmpfs

pytestmark = pytest.mark.skipif(bool(EXTERNAL_URL), reason="starts broker processes of its own")

EXIT_TIMEOUT = 30  # seconds a broker that cannot start gets to say so (it normally takes a fraction of one)


def run_broker(data_dir: Path, port: int | None = None, user: int | None = None,
               extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run a broker that is expected to exit at once; `user` runs it under that uid (and gid); `extra` options come
    last (a later option overrides an earlier one)."""
    command = [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port or free_port()),
               "--data-dir", str(data_dir), "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0", *WORKER_OPTIONS, *extra]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=EXIT_TIMEOUT)


def assert_refused(result: subprocess.CompletedProcess, message: str) -> None:
    assert (result.returncode, result.stderr) == (1, f"warren-server: {message}\n")
    assert "Traceback" not in result.stdout


def test_a_missing_data_dir_is_created_with_its_parents(tmp_path):
    data_dir = tmp_path / "not" / "yet" / "data"
    port = free_port()
    command = [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
               "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"]
    broker = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, broker)
        connect(Broker("127.0.0.1", port)).close()
    finally:
        broker.terminate()
        assert broker.wait(EXIT_TIMEOUT) == 0
    assert data_dir.is_dir()


@pytest.mark.parametrize("where", ["file", "file/data"], ids=["a file", "below a file"])
def test_a_data_dir_that_is_not_a_directory(tmp_path, where):
    (tmp_path / "file").write_text("not a directory")
    data_dir = tmp_path / where
    assert_refused(run_broker(data_dir), f"cannot use data dir {data_dir}: Not a directory")


@pytest.mark.parametrize("where", ["", "new/data"], ids=["the dir", "a dir to create"])
def test_a_read_only_data_dir(tmp_path, where):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mount_point:
        data_dir = mount_point / where
        assert_refused(run_broker(data_dir), f"cannot use data dir {data_dir}: Read-only file system")


@pytest.mark.parametrize("mode, where", [(0o555, "data"), (0o700, "data/sub")],
                         ids=["not writable", "not searchable"])
def test_a_data_dir_the_broker_may_not_use(mode, where):
    user = None
    if os.geteuid() == 0:  # root may write anywhere: run the broker as nobody
        if shutil.which("setpriv") is None:
            pytest.skip("runs as root, and setpriv (util-linux) is missing to run the broker as another user")
        user = 65534
    root = Path(tempfile.mkdtemp(prefix="warren-startup-"))  # outside pytest's tmp dirs, which only root may enter
    try:
        root.chmod(0o755)
        (root / "data").mkdir(mode)
        data_dir = root / where
        assert_refused(run_broker(data_dir, user=user), f"cannot use data dir {data_dir}: Permission denied")
    finally:
        shutil.rmtree(root)


def test_an_error_while_recovering_names_the_data_dir_and_the_file(tmp_path):
    data_dir = tmp_path / "data"
    (data_dir / "definitions.log").mkdir(parents=True)  # a directory where the definitions log should be
    assert_refused(run_broker(data_dir),
                   f"cannot use data dir {data_dir}: Is a directory ({data_dir / 'definitions.log'})")


def test_a_port_in_use_is_reported_before_the_data_dir_is_touched(tmp_path):
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_broker(data_dir, port=port)
    assert_refused(result, f"cannot listen on 127.0.0.1:{port}: Address already in use")
    assert not data_dir.exists()  # neither created nor recovered: the port was checked first


@pytest.mark.parametrize("option, what", [("--management-port", "management API"),
                                          ("--prometheus-port", "Prometheus metrics")])
def test_an_http_port_in_use_is_reported_before_the_data_dir_is_touched(tmp_path, option, what):
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_broker(data_dir, extra=(option, str(port)))
    assert_refused(result, f"cannot listen on 127.0.0.1:{port} for the {what}: Address already in use")
    assert not data_dir.exists()  # no default user made in a new data dir that then cannot serve


def test_a_second_broker_on_the_same_data_dir_is_refused_and_the_first_goes_on(own_broker):
    first = own_broker()
    assert_refused(run_broker(first.data_dir),
                   f"data dir {first.data_dir} is in use by another Warren (pid {first.process.pid})")
    connection = connect(first)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("still-served", durable=True)
    channel.basic_publish("", "still-served", b"kept")
    assert channel.basic_get("still-served", auto_ack=True)[2] == b"kept"
    connection.close()


def test_a_store_format_from_a_newer_version_is_refused(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "format").write_text("99\n")
    result = run_broker(data_dir)
    assert result.returncode == 1
    assert result.stderr.startswith(f"warren-server: data dir {data_dir} has store format 99, written by a newer")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stdout
