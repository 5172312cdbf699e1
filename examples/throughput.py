"""Throughput of the Spark connector next to plain pika, against one broker on this machine.

    .venv/bin/python examples/throughput.py --uri amqp://guest:guest@127.0.0.1:5672/%2F --rows 50000

Prints rows/s for: pika publishing (no confirms, and waiting for each confirm), pika consuming
(prefetch 1000, one ack per message), the connector reading a queue into a no-op sink, writing a
DataFrame to a queue, and the example pipeline (read, transform, write). Spark figures are given
for the whole run (query start-up included) and for the steady state (batches after the first).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import pika

PIPELINE = Path(__file__).resolve().parent / "pipeline.py"
BODY = b'{"id": 1, "customer": "customer-1", "amount": 12.5, "currency": "EUR"}'


def fresh_queue(channel, name: str) -> str:
    channel.queue_delete(name)
    return channel.queue_declare(name, durable=True).method.queue


def pika_publish(uri: str, queue: str, rows: int, confirm: bool) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    if confirm:
        channel.confirm_delivery()
    properties = pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(rows):
        channel.basic_publish("", queue, BODY, properties)
    if not confirm:
        connection.channel().queue_declare(queue, passive=True)  # a round trip after the last publish
    elapsed = time.perf_counter() - started
    connection.close()
    return rows / elapsed


def pika_consume(uri: str, queue: str, rows: int) -> float:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    received = 0
    started = time.perf_counter()
    for method, _, _ in channel.consume(queue):
        channel.basic_ack(method.delivery_tag)
        received += 1
        if received == rows:
            break
    elapsed = time.perf_counter() - started
    channel.cancel()
    connection.close()
    return rows / elapsed


def spark_rates(query, started: float, rows: int) -> tuple[float, float]:
    """(rows/s over the whole run, rows/s over the batches after the first)."""
    total = rows / (time.perf_counter() - started)
    later = [p for p in query.recentProgress if p["batchId"] > 0]
    later_rows = sum(p["numInputRows"] for p in later)
    later_ms = sum(p["durationMs"]["triggerExecution"] for p in later)
    return total, (later_rows / later_ms * 1000 if later_ms else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--rows", type=int, default=50000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector

    connection = pika.BlockingConnection(pika.URLParameters(args.uri))
    channel = connection.channel()
    queue = fresh_queue(channel, "throughput.pika")
    figures = {
        "pika publish, no confirms": pika_publish(args.uri, queue, args.rows, confirm=False),
        "pika consume, prefetch 1000, ack each": pika_consume(args.uri, queue, args.rows),
        "pika publish, wait for each confirm": pika_publish(args.uri, queue, args.rows, confirm=True),
    }
    channel.queue_purge(queue)

    spark = (
        SparkSession.builder.master("local[2]").appName("warren-throughput")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)

    target = fresh_queue(channel, "throughput.write")
    started = time.perf_counter()
    (spark.range(args.rows).select(F.lit(BODY).alias("body")).write.format("amqp")
     .option("uri", args.uri).option("routingKey", target).mode("append").save())
    figures["spark write (batch job, 2 tasks)"] = args.rows / (time.perf_counter() - started)

    started = time.perf_counter()
    query = (
        spark.readStream.format("amqp").option("uri", args.uri).option("queue", target).load()
        .writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    whole, steady = spark_rates(query, started, args.rows)
    figures["spark read into a no-op sink"] = whole
    figures["spark read into a no-op sink, steady state"] = steady

    spec = importlib.util.spec_from_file_location("example_pipeline", PIPELINE)
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    for name in ("throughput.orders", "throughput.enriched"):
        fresh_queue(channel, name)
    pipeline.declare_and_seed(args.uri, "throughput.orders", "throughput.enriched", args.rows)
    options = pipeline.parse_args(["--uri", args.uri, "--source", "throughput.orders", "--target",
                                   "throughput.enriched", "--checkpoint", tempfile.mkdtemp()])
    started = time.perf_counter()
    query = pipeline.start_pipeline(spark, options)
    query.awaitTermination()
    whole, steady = spark_rates(query, started, args.rows)
    figures["example pipeline, read + transform + write"] = whole
    figures["example pipeline, steady state"] = steady
    for name in ("throughput.pika", "throughput.write", "throughput.orders", "throughput.enriched"):
        channel.queue_delete(name)
    connection.close()
    spark.stop()

    print(f"\n{args.rows} rows of {len(BODY)} bytes against {args.uri}")
    for name, rate in figures.items():
        print(f"  {name:<48} {rate:>9.0f} rows/s")


if __name__ == "__main__":
    main()
