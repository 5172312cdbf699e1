"""Exactly once from a stream queue through failures: the replay example (examples/stream_replay.py) writes each
micro-batch whole to Parquet under its batch id, and whatever fails — the driver killed at random points, task
workers killed mid-read, the broker killed — it ends with each published message in its output exactly once,
each task's range in offset order."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration import management
from tests.procfs import fd_links, socket_links
from tests.spark.conftest import BOUNDED_WAIT_SECONDS, REPO_ROOT, replay_module, start_driver

pytestmark = pytest.mark.spark

REPLAY = REPO_ROOT / "examples" / "stream_replay.py"
MESSAGES = 100_000
# These scenarios start Spark drivers several times over 100,000-message streams: a minute or two each here
LONG_SCENARIO = pytest.mark.timeout(480)


def batches_written(output: Path) -> int:
    return sum(1 for path in output.glob("batch=*/_SUCCESS")) if output.exists() else 0


def check_output(output: Path, messages: int, context: str = "") -> None:
    """Each of the messages event-0 .. once in the output, and each part file (one task's range) in offset
    order without a hole."""
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    table = pyarrow_parquet.read_table(output, columns=["stream", "offset", "body"]).to_pydict()
    assert len(table["offset"]) == messages, context
    assert len(set(zip(table["stream"], table["offset"]))) == messages, context
    bodies = Counter(table["body"])
    assert set(bodies) == {f"event-{number}".encode() for number in range(messages)}, context
    assert max(bodies.values()) == 1, context
    for part in output.glob("batch=*/*.parquet"):
        offsets = pyarrow_parquet.read_table(part, columns=["offset"]).column("offset").to_pylist()
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, part


def seeded_replay(url: str, stream: str, tmp_path: Path, messages: int, per_trigger: int,
                  *extra: str) -> tuple[Path, list[str]]:
    """A stream holding events 0 .. messages-1 (confirmed), and the replay example's output dir and arguments."""
    stream_replay = replay_module()
    stream_replay.declare(url, stream)
    assert stream_replay.publish(url, stream, 0, messages) == messages
    output = tmp_path / "output"
    return output, ["--uri", url, "--stream", stream, "--output", str(output), "--checkpoint",
                    str(tmp_path / "checkpoint"), "--max-per-trigger", str(per_trigger), "--min-partitions", "4",
                    *extra]


def run_replay(arguments: list[str], continuous: bool, tmp_path: Path) -> subprocess.Popen:
    return start_driver([str(REPLAY), *arguments, *(["--continuous"] if continuous else [])], tmp_path / "driver")


@LONG_SCENARIO
def test_every_message_reaches_the_output_once_though_the_driver_is_killed_three_times(spark_installed, broker, unique,
                                                                                         tmp_path):
    stream_replay = replay_module()
    output = tmp_path / "output"
    arguments = ["--uri", broker.url, "--stream", unique, "--output", str(output), "--checkpoint",
                 str(tmp_path / "checkpoint"), "--max-per-trigger", "5000", "--min-partitions", "4"]
    stream_replay.declare(broker.url, unique)
    confirmed: list[int] = []
    publisher = threading.Thread(target=lambda: confirmed.append(stream_replay.publish(broker.url, unique, 0,
                                                                                       MESSAGES)))
    publisher.start()
    seed = random.randrange(1 << 30)
    chance = random.Random(seed)
    for kill in range(3):
        driver = run_replay(arguments, continuous=True, tmp_path=tmp_path)
        try:
            before = batches_written(output)
            deadline = time.monotonic() + BOUNDED_WAIT_SECONDS * 2
            while batches_written(output) <= before and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(chance.uniform(0, 3))  # somewhere in the middle of a later batch, or between two
        finally:
            os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and Spark's Python workers
            driver.wait()
        assert driver.returncode == -signal.SIGKILL, f"the driver ended before kill {kill + 1} (seed {seed})"
    publisher.join(BOUNDED_WAIT_SECONDS * 2)
    assert confirmed == [MESSAGES]

    final = run_replay(arguments, continuous=False, tmp_path=tmp_path)  # Trigger.AvailableNow: up to the tail, then stop
    assert final.wait(BOUNDED_WAIT_SECONDS * 3) == 0

    check_output(output, MESSAGES, f"seed {seed}")


def task_connections(broker, stream: str) -> list[dict]:
    """The connections the source's tasks read ranges of the stream on (named by their range)."""
    prefix = f"spark amqp source: stream {stream} offsets ["
    return [connection for connection in management.request(broker, "GET", "/api/connections").body
            if str(connection.get("user_provided_name", "")).startswith(prefix)]


def spark_worker_with_socket(local_port: int, remote_port: int) -> int | None:
    """The pid of the Spark Python worker holding the TCP socket from local_port to remote_port (from /proc), if
    any. (The management API's list of connections may be a moment old: the port of a connection that closed
    meanwhile may be another process's now, say the driver's, which is never the one killed.)"""
    links = socket_links(local_port, remote_port)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if fd_links(int(pid)) & links and b"pyspark" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        except OSError:  # gone meanwhile
            continue
    return None


@LONG_SCENARIO
@pytest.mark.skipif(bool(os.environ.get("WARREN_TEST_URL")),
                    reason="RabbitMQ's API lists connections seconds late: a task's connection is gone before it shows")
def test_a_task_killed_mid_read_is_retried_and_reads_its_range_again(spark_installed, broker, unique, tmp_path):
    """Five batches of four ranges; in each batch the Python worker of one task is killed (SIGKILL) while it reads
    (found by its connection, which the management API names by range), and Spark runs the task again."""
    batch_size, batches = 40_000, 5
    output, arguments = seeded_replay(broker.url, unique, tmp_path, batch_size * batches, batch_size,
                                      "--master", "local[4,3]")
    driver = run_replay(arguments, continuous=False, tmp_path=tmp_path)
    killed: dict[int, str] = {}  # batch (first offset // batch size) -> the range whose task was killed
    try:
        deadline = time.monotonic() + BOUNDED_WAIT_SECONDS * 3
        while len(killed) < batches and driver.poll() is None and time.monotonic() < deadline:
            for connection in task_connections(broker, unique):
                name = connection["user_provided_name"]
                low = int(name.rsplit("[", 1)[1].split(",")[0])
                worker = spark_worker_with_socket(connection["peer_port"], broker.port)
                if low // batch_size not in killed and worker is not None:
                    os.kill(worker, signal.SIGKILL)
                    killed[low // batch_size] = name
            time.sleep(0.02)
        assert driver.wait(BOUNDED_WAIT_SECONDS * 3) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert sorted(killed) == list(range(batches)), killed
    check_output(output, batch_size * batches)


@LONG_SCENARIO
def test_a_broker_killed_mid_query_fails_it_and_a_restart_resumes_with_every_message_once(spark_installed, own_broker,
                                                                                           unique, tmp_path):
    broker = own_broker()
    messages = 60_000
    output, arguments = seeded_replay(broker.url, unique, tmp_path, messages, 5000)
    driver = run_replay(arguments, continuous=True, tmp_path=tmp_path)
    try:
        deadline = time.monotonic() + BOUNDED_WAIT_SECONDS * 2
        while batches_written(output) < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batches_written(output) >= 2
        broker.kill()
        assert driver.wait(BOUNDED_WAIT_SECONDS * 2) != 0  # the query fails: its broker is gone
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert batches_written(output) < messages // 5000, "the broker was meant to die mid-query"
    broker.start()  # the same data dir and port
    final = run_replay(arguments, continuous=False, tmp_path=tmp_path)
    assert final.wait(BOUNDED_WAIT_SECONDS * 3) == 0
    check_output(output, messages)


@LONG_SCENARIO
@pytest.mark.skipif(bool(os.environ.get("WARREN_TEST_URL")),
                    reason="RabbitMQ's API lists connections seconds late: a task's connection is gone before it shows")
def test_a_batch_is_read_by_four_tasks_at_once(spark_installed, broker, unique, tmp_path):
    """minPartitions 4 on four task slots: the four ranges of a batch are read at the same time. Each task's Python
    worker is stopped (SIGSTOP) as soon as its connection shows, so a task read only after another finished would
    never show while that one is held; once the four connections are open together they all go on, and the output
    is complete."""
    messages = 40_000
    output, arguments = seeded_replay(broker.url, unique, tmp_path, messages, messages)  # one batch, 4 tasks
    driver = run_replay(arguments, continuous=False, tmp_path=tmp_path)
    held: dict[str, int | None] = {}  # a range's connection name -> its task's stopped Python worker
    try:
        deadline = time.monotonic() + BOUNDED_WAIT_SECONDS * 3
        while len(held) < 4 and driver.poll() is None and time.monotonic() < deadline:
            for connection in task_connections(broker, unique):
                name = connection["user_provided_name"]
                if name not in held:
                    held[name] = spark_worker_with_socket(connection["peer_port"], broker.port)
                    if held[name] is not None:
                        os.kill(held[name], signal.SIGSTOP)
            time.sleep(0.02)
        open_together = len({connection["user_provided_name"] for connection in task_connections(broker, unique)})
    finally:
        for worker in filter(None, held.values()):
            os.kill(worker, signal.SIGCONT)
    try:
        assert driver.wait(BOUNDED_WAIT_SECONDS) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert open_together == 4, held
    check_output(output, messages)
