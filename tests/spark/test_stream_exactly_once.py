"""Exactly once from a stream queue through a driver killed at random points: the replay example
(examples/stream_replay.py) writes each micro-batch whole to Parquet under its batch id, and restarted from its
checkpoint after every SIGKILL it ends with each published message in its output exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.spark.conftest import BOUNDED_WAIT_SECONDS, REPO_ROOT

pytestmark = pytest.mark.spark

REPLAY = REPO_ROOT / "examples" / "stream_replay.py"
MESSAGES = 100_000


def batches_written(output: Path) -> int:
    return sum(1 for path in output.glob("batch=*/_SUCCESS")) if output.exists() else 0


def run_replay(arguments: list[str], continuous: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(REPLAY), *arguments, *(["--continuous"] if continuous else [])],
                            cwd=REPO_ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_every_message_reaches_the_output_once_though_the_driver_is_killed_three_times(spark, broker, unique,
                                                                                         tmp_path):
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    import stream_replay

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
        driver = run_replay(arguments, continuous=True)
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

    final = run_replay(arguments, continuous=False)  # Trigger.AvailableNow: up to the tail, then stop
    assert final.wait(BOUNDED_WAIT_SECONDS * 3) == 0

    table = pyarrow_parquet.read_table(output, columns=["stream", "offset", "body"]).to_pydict()
    assert len(table["offset"]) == MESSAGES, f"seed {seed}"
    assert len(set(zip(table["stream"], table["offset"]))) == MESSAGES
    bodies = Counter(table["body"])
    assert set(bodies) == {f"event-{number}".encode() for number in range(MESSAGES)} and max(bodies.values()) == 1
