"""Example replay pipeline: a stream queue read exactly once into Parquet, one directory per micro-batch.

With a broker listening on 127.0.0.1:5672 (`make run`) and the connector's packages installed (`make spark`):

    .venv/bin/python examples/stream_replay.py --seed 100000

declares the stream queue `replay.events` (if needed), publishes that many events with publisher confirms, reads
the stream from its earliest offset until the tail seen at start (Trigger.AvailableNow) into
`warren-examples/replay/output/batch=<id>/` (under the current directory), and prints how many rows and distinct offsets the output holds. Each
micro-batch overwrites its own directory, so a batch replayed after a crash replaces what its first attempt left:
kill the script at any point (`--continuous` keeps it running) and run it again, and the output holds every
message exactly once. `--fresh` starts over (deletes the output and the checkpoint).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import pika

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from spark_connector.publisher import ConfirmedPublisher  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/%2F", help="broker to read from")
    parser.add_argument("--stream", default="replay.events", help="stream queue to read (declared if missing)")
    parser.add_argument("--output", default="warren-examples/replay/output", help="Parquet output directory")
    parser.add_argument("--checkpoint", default="warren-examples/replay/checkpoint",
                        help="Spark checkpoint directory")
    parser.add_argument("--seed", type=int, default=0, help="publish this many events before starting")
    parser.add_argument("--max-per-trigger", type=int, default=5000, help="maxOffsetsPerTrigger of the source")
    parser.add_argument("--min-partitions", type=int, default=4, help="minPartitions of the source")
    parser.add_argument("--continuous", action="store_true", help="keep running instead of stopping at the tail")
    parser.add_argument("--fresh", action="store_true", help="delete the output and the checkpoint first")
    parser.add_argument("--master", default="local[4]", help="Spark master (local[4,3]: 4 threads, a task tried 3 "
                                                               "times)")
    return parser.parse_args(argv)


def declare(uri: str, stream: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    connection.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    connection.close()


def publish(uri: str, stream: str, start: int, count: int) -> int:
    """Publish events start .. start+count-1 (body `event-<n>`) with confirms; returns how many were confirmed."""
    properties = pika.BasicProperties(content_type="text/plain", delivery_mode=2)
    messages = ((stream, f"event-{number}".encode(), properties) for number in range(start, start + count))
    return ConfirmedPublisher(uri, "", False, 1000).publish_all(messages)


def start_query(spark, args: argparse.Namespace):
    """The replay query: each batch written whole to output/batch=<id> (replayed batches overwrite theirs)."""
    output = args.output

    def write_batch(frame, batch_id: int) -> None:
        frame.write.mode("overwrite").parquet(os.path.join(output, f"batch={batch_id}"))

    events = (spark.readStream.format("amqp").option("uri", args.uri).option("stream", args.stream)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.max_per_trigger))
              .option("minPartitions", str(args.min_partitions)).load())
    writer = events.writeStream.foreachBatch(write_batch).option("checkpointLocation", args.checkpoint)
    writer = writer.trigger(processingTime="0 seconds") if args.continuous else writer.trigger(availableNow=True)
    return writer.start()


def session(master: str):
    """A SparkSession with the connector registered, whose Python workers import pika and the connector as this
    process does."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master(master).appName("warren-stream-replay")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


def main() -> None:
    args = parse_args()
    if args.fresh:
        for path in (args.output, args.checkpoint):
            shutil.rmtree(path, ignore_errors=True)
    declare(args.uri, args.stream)
    if args.seed:
        started = time.monotonic()
        published = publish(args.uri, args.stream, 0, args.seed)
        print(f"published {published} events in {time.monotonic() - started:.1f} s")
    spark = session(args.master)
    started = time.monotonic()
    query = start_query(spark, args)
    query.awaitTermination()
    seconds = time.monotonic() - started
    rows = spark.read.parquet(args.output)
    total, distinct = rows.count(), rows.select("stream", "offset").distinct().count()
    print(f"output: {total} rows, {distinct} distinct offsets; this run took {seconds:.1f} s")


if __name__ == "__main__":
    main()
