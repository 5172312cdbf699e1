"""Reading a stream queue: one plain pika consumer against the Spark stream source with four tasks, on Warren and on
a reference RabbitMQ in the same run (brokers alternated W R R W), with broker CPU per message.

    .venv/bin/python -m tests.bench.stream_read --messages 400000

Each round starts the broker afresh, declares a stream, publishes the messages with confirms (window 1000), then
reads them all from `first` with one pika consumer (prefetch 1000, an ack every 500) and then with the Spark source
(Trigger.AvailableNow, minPartitions 4, local[4]), counting how many of its tasks read at once (the stream's
consumers, less the tail follower). Needs the `spark` extra and Java for the Spark part (skipped otherwise).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

from tests.bench.brokers import REPO_ROOT, BrokerUnavailable, RunningBroker, start_rabbitmq, start_warren
from warrenperf.process_memory import cpu_seconds, resident_kib

sys.path.insert(0, str(REPO_ROOT / "examples"))

import stream_replay  # noqa: E402  (examples/stream_replay.py: declare and publish)

STREAM = "bench-stream"
BODY_PREFIX = "event-"


def read_with_pika(url: str, messages: int) -> float:
    """Seconds one consumer takes to read `messages` from the first offset."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    received = 0
    started = time.perf_counter()
    for method, _, _ in channel.consume(STREAM, arguments={"x-stream-offset": "first"}, inactivity_timeout=60):
        if method is None:
            raise RuntimeError(f"pika read stalled after {received} messages")
        received += 1
        if received % 500 == 0:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if received == messages:
            break
    seconds = time.perf_counter() - started
    try:
        connection.close()
    except Exception:  # RabbitMQ 3.10 answers the rejects pika sends on the way out with a 540
        pass
    return seconds


def consumers_of(url: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return connection.channel().queue_declare(STREAM, passive=True).method.consumer_count
    finally:
        connection.close()


def read_with_spark(spark, url: str, messages: int, workdir: Path) -> tuple[float, int, int]:
    """(seconds, rows, most tasks reading at once) of an AvailableNow query over the stream."""
    counted = []
    frame = (spark.readStream.format("amqp").option("uri", url).option("stream", STREAM)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(messages // 4))
             .option("minPartitions", "4").load())
    most = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            most[0] = max(most[0], consumers_of(url) - 1)  # less the driver's tail follower
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    started = time.perf_counter()
    query = (frame.writeStream.foreachBatch(lambda batch, _: counted.append(batch.count()))
             .option("checkpointLocation", str(workdir / "checkpoint")).trigger(availableNow=True).start())
    watcher.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    return seconds, sum(counted), most[0]


def spark_session():
    """The replay example's session on four task slots; None without Java."""
    return stream_replay.session("local[4]") if shutil.which("java") is not None else None


def one_round(name: str, messages: int, spark) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"stream-bench-{name.lower()}-"))
    workdir.chmod(0o755)  # RabbitMQ runs as its own user and keeps its data dir in here
    broker: RunningBroker = start_warren(workdir) if name == "Warren" else start_rabbitmq(workdir)
    try:
        url = broker.url
        stream_replay.declare(url, STREAM)
        started = time.perf_counter()
        stream_replay.publish(url, STREAM, 0, messages)
        publish_seconds = time.perf_counter() - started
        rss_before = resident_kib(broker.pid)
        cpu_before = cpu_seconds(broker.pid)
        pika_seconds = read_with_pika(url, messages)
        pika_cpu = cpu_seconds(broker.pid) - cpu_before
        figures = {"publish": messages / publish_seconds, "pika": messages / pika_seconds,
                   "pika_cpu_us": pika_cpu / messages * 1e6,
                   "rss_growth_mib": (resident_kib(broker.pid) - rss_before) / 1024}
        if spark is not None:
            cpu_before = cpu_seconds(broker.pid)
            seconds, rows, tasks = read_with_spark(spark, url, messages, workdir)
            assert rows == messages, f"{name}: Spark read {rows} rows of {messages}"
            figures.update({"spark": rows / seconds, "spark_cpu_us": (cpu_seconds(broker.pid) - cpu_before)
                            / messages * 1e6, "tasks_at_once": tasks})
        return figures
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    args = parser.parse_args(argv)
    spark = spark_session()
    results: dict[str, list[dict]] = {"Warren": [], "RabbitMQ": []}
    for name in ("Warren", "RabbitMQ", "RabbitMQ", "Warren"):
        try:
            figures = one_round(name, args.messages, spark)
        except BrokerUnavailable as error:
            print(f"{name}: {error}")
            continue
        results[name].append(figures)
        print(name, " ".join(f"{key}={value:,.1f}" for key, value in figures.items()), flush=True)
    if results["Warren"] and results["RabbitMQ"]:
        def mean(name: str, key: str) -> float:
            return sum(figures[key] for figures in results[name]) / len(results[name])

        for key in ("publish", "pika", "spark"):
            if key in results["Warren"][0]:
                print(f"{key}: Warren {mean('Warren', key):,.0f} rows/s, RabbitMQ {mean('RabbitMQ', key):,.0f} "
                      f"rows/s, ratio {mean('Warren', key) / mean('RabbitMQ', key):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
