"""Example pipeline: orders from one queue -> Spark transformation -> enriched orders on another queue.

With a broker listening on 127.0.0.1:5672 (`make run`) and the connector's packages installed (`make spark`):

    .venv/bin/python examples/pipeline.py --seed 10000

publishes 10000 sample orders (JSON) to the queue `orders`, runs the pipeline until that queue is
drained (Trigger.AvailableNow), and prints how many enriched orders reached `orders.enriched` and
how fast. With `--continuous` the query keeps running until Ctrl-C; a rerun resumes from the
checkpoint without losing a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pika

ORDER_SCHEMA = "id INT, customer STRING, amount DOUBLE, currency STRING"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/%2F", help="broker to read from and write to")
    parser.add_argument("--source", default="orders", help="queue the orders are read from")
    parser.add_argument("--target", default="orders.enriched", help="queue the enriched orders are published to")
    parser.add_argument("--checkpoint", default="warren-examples/pipeline/checkpoint",
                        help="Spark checkpoint directory (default under the current directory)")
    parser.add_argument("--seed", type=int, default=0, help="publish this many sample orders before starting")
    parser.add_argument("--max-per-batch", type=int, default=None, help="maxMessagesPerBatch of the source")
    parser.add_argument("--continuous", action="store_true", help="keep running instead of draining once")
    return parser.parse_args(argv)


def declare_and_seed(uri: str, source: str, target: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    for queue in (source, target):
        channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for number in range(count):
        order = {"id": number, "customer": f"customer-{number % 97}", "amount": round(10 + number % 500 * 0.37, 2), "currency": "EUR"}
        channel.basic_publish("", source, json.dumps(order).encode(), pika.BasicProperties(content_type="application/json", delivery_mode=2))
    connection.close()


def start_pipeline(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    reader = spark.readStream.format("amqp").option("uri", args.uri).option("queue", args.source).option("bodyEncoding", "utf-8")
    if args.max_per_batch:
        reader = reader.option("maxMessagesPerBatch", str(args.max_per_batch))
    orders = reader.load().select(F.from_json("text", ORDER_SCHEMA).alias("order"), "redelivered")
    enriched = orders.where(F.col("order.id").isNotNull()).select(
        F.to_json(
            F.struct(
                F.col("order.id").alias("id"),
                F.upper("order.customer").alias("customer"),
                F.round(F.col("order.amount") * 1.2, 2).alias("amount_with_vat"),
                F.col("order.currency").alias("currency"),
            )
        ).alias("body"),
        F.lit("application/json").alias("content_type"),
        F.create_map(F.lit("redelivered"), F.col("redelivered").cast("string")).alias("headers"),
    )
    writer = (
        enriched.writeStream.format("amqp")
        .option("uri", args.uri)
        .option("routingKey", args.target)
        .option("checkpointLocation", args.checkpoint)
    )
    writer = writer.trigger(processingTime="0 seconds") if args.continuous else writer.trigger(availableNow=True)
    return writer.start()


def queue_depth(uri: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    depth = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.close()
    return depth


def main() -> None:
    args = parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers need pika and the connector
    from pyspark.sql import SparkSession

    import spark_connector

    declare_and_seed(args.uri, args.source, args.target, args.seed)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("warren-example-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)

    before = queue_depth(args.uri, args.target)
    started = time.monotonic()
    query = start_pipeline(spark, args)
    query.awaitTermination()
    elapsed = time.monotonic() - started
    published = queue_depth(args.uri, args.target) - before
    print(f"{published} enriched orders published to {args.target!r} in {elapsed:.1f}s "
          f"({published / elapsed:.0f} rows/s read and written, Spark start-up of the query included)")
    spark.stop()


if __name__ == "__main__":
    main()
