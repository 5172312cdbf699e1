"""`--workers N`: the supervisor's private directory (the workers' API sockets, in the temporary directory) goes with
it. A supervisor killed with kill -9 cannot remove its own: its workers end with it, and the next supervisor to
start removes it, never the directory of one that lives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.integration.management import request
from tests.integration.test_workers import worker_pids
from tests.waiting import wait_for

PRIVATE = "warren-workers-*"


def ended(pid: int) -> bool:
    """Whether process pid has ended (a zombie not yet reaped has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def private_directories(temporary: Path) -> set[Path]:
    return set(temporary.glob(PRIVATE))


def test_a_killed_supervisors_private_directory_is_removed_by_the_next_start_not_a_live_ones(
        own_broker, tmp_path, monkeypatch, short_temporary):
    temporary = short_temporary
    monkeypatch.setenv("TMPDIR", str(temporary))  # (the brokers' temporary directory)
    live = own_broker("--workers", "2", data_dir=tmp_path / "live")
    (live_directory,) = private_directories(temporary)
    killed = own_broker("--workers", "2", data_dir=tmp_path / "killed")
    (killed_directory,) = private_directories(temporary) - {live_directory}
    workers = worker_pids(killed).values()
    killed.kill()
    wait_for(lambda: all(ended(pid) for pid in workers), 10, "the killed supervisor's workers ended")
    assert private_directories(temporary) == {live_directory, killed_directory}
    started = own_broker("--workers", "2", data_dir=tmp_path / "started")
    remaining = private_directories(temporary)
    assert killed_directory not in remaining
    assert live_directory in remaining and len(remaining) == 2  # the live one's, and the one just started's
    assert request(live, "GET", "/api/overview").status == 200  # its workers' sockets are where they were
    assert request(started, "GET", "/api/overview").status == 200
    assert f"removed {killed_directory}, left by a supervisor that died" in started.log()


def test_a_temporary_directory_too_long_for_the_workers_sockets_is_refused_at_start(tmp_path):
    temporary = tmp_path / ("t" * (100 - len(str(tmp_path))))
    temporary.mkdir()
    done = subprocess.run([sys.executable, "-m", "broker", "--workers", "2", "--port", "0", "--management-port", "0",
                           "--prometheus-port", "0", "--mqtt-port", "0", "--data-dir", str(tmp_path / "data")],
                          cwd=REPO_ROOT, env={**os.environ, "TMPDIR": str(temporary)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert f"the temporary directory {temporary} is too long a path for the workers' sockets" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not list(temporary.iterdir())
