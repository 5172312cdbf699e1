"""Spark fixtures: one local SparkSession for the whole test session, and AMQP helpers.

Spark's Python workers must import pika and this package, so they run the same interpreter as the
tests (PYSPARK_PYTHON) with the repository on their path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from tests.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
BOUNDED_WAIT_SECONDS = 60.0


@pytest.fixture(scope="session")
def spark_installed() -> None:
    """What a Spark driver needs here (the tests that start drivers of their own ask for this alone)."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need a Java runtime (java not found on PATH)")
    pytest.importorskip("pyarrow", reason="the Python data source API needs pyarrow")


@pytest.fixture(scope="session")
def spark(spark_installed):
    from pyspark.sql import SparkSession

    import spark_connector

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("warren-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    yield session
    session.stop()


def start_driver(command: list[str], scratch: Path) -> subprocess.Popen:
    """An example's Spark driver (`python *command`) in a process group of its own, to be killed whole, with its
    temporary files (the JVM's block manager, artifacts and native libraries, PySpark's) in `scratch`: a driver killed
    with SIGKILL cannot remove them, and they would stay in /tmp for good."""
    scratch.mkdir(exist_ok=True)
    java_options = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Djava.io.tmpdir={scratch}".strip()
    return subprocess.Popen([sys.executable, *command], cwd=REPO_ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(scratch), "JAVA_TOOL_OPTIONS": java_options})


class Amqp:
    """A blocking pika connection for setting up queues and checking what the connector did."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()  # every publish below returns once the broker confirmed it

    def declare(self, queue: str, **arguments) -> str:
        return self.channel.queue_declare(queue, durable=True, arguments=arguments or None).method.queue

    def publish(self, queue: str, bodies: list[bytes], **properties) -> None:
        for body in bodies:
            self.channel.basic_publish("", queue, body, pika.BasicProperties(**properties))

    def counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue."""
        method = self.channel.queue_declare(queue, passive=True).method
        return method.message_count, method.consumer_count

    def wait_for_no_consumer(self, queue: str) -> int:
        """Wait (bounded) until nobody consumes `queue`, so unacked messages are back; return ready count."""
        return self.wait_until(lambda: self.counts(queue)[1] == 0 and self.counts(queue)[0])

    def wait_until(self, probe: Callable[[], object], timeout: float = BOUNDED_WAIT_SECONDS):
        """Poll the broker until `probe()` returns something other than False/None (bounded)."""
        return wait_for(probe, timeout, "the broker state", 0.05,
                        until=lambda value: value is not False and value is not None)

    def drain(self, queue: str) -> list[tuple[pika.spec.Basic.GetOk, pika.BasicProperties, bytes]]:
        messages = []
        while (got := self.channel.basic_get(queue, auto_ack=True))[0] is not None:
            messages.append(got)
        return messages

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


@pytest.fixture
def amqp(broker) -> Iterator[Amqp]:
    client = Amqp(broker.url)
    yield client
    client.close()


class Collector:
    """A foreachBatch function that keeps every row it sees, per batch, and can fail one batch."""

    def __init__(self, fail_batch: int | None = None) -> None:
        self.batches: list[tuple[int, list]] = []  # (batch id, rows) in the order Spark ran them
        self.fail_batch = fail_batch  # batch id whose rows are kept and then made to fail
        self._changed = threading.Condition()

    def __call__(self, frame, batch_id: int) -> None:
        rows = frame.collect()
        with self._changed:
            self.batches.append((batch_id, rows))
            self._changed.notify_all()
        if batch_id == self.fail_batch:
            raise RuntimeError(f"batch {batch_id} fails on purpose")

    @property
    def rows(self) -> list:
        return [row for _, rows in self.batches for row in rows]

    def wait_for_rows(self, count: int, timeout: float = BOUNDED_WAIT_SECONDS) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.rows) >= count, timeout):
                raise TimeoutError(f"{len(self.rows)} rows of {count} after {timeout}s")


def replay_module():
    """examples/stream_replay.py, imported (its publish and declare helpers; it also runs as a driver script)."""
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    import stream_replay

    return stream_replay


def read_queue(spark, url: str, queue: str, **options):
    reader = spark.readStream.format("amqp").option("uri", url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def collect(stream, collector: Collector, checkpoint, **trigger):
    """Start `stream` into `collector` with one trigger (e.g. availableNow=True) and a checkpoint."""
    writer = stream.writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    return writer.trigger(**trigger).start()
