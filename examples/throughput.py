"""Throughput of the Spark connector beside plain pika with the same number of connections, against one broker on
this machine, in one run.

    .venv/bin/python examples/throughput.py --uri amqp://guest:guest@127.0.0.1:5672/%2F

Prints, for each way in and out of Spark, the connector's rows/s (Spark on `local[2]`, so two tasks at a time) and
what plain pika does with the same connections at the same time (each connection in a process of its own, as a
Spark task is), then the ratio; and the fixed cost of a micro-batch. Bodies of 100 bytes, persistent messages,
durable queues, the connector's default options unless said.

- stream source: `--stream-rows` messages of a stream read in 4 batches, each cut into 4 offset ranges (4
  connections, 2 at a time); pika: 2 processes, each reading 2 ranges one after the other.
- queue source: `--queue-rows` messages of a queue, read by the driver's one consuming connection; pika: 1
  connection with the connector's window (its consumers on one channel, as the connector's), one multiple ack per
  batch's worth of deliveries.
- sink: `df.write` of `--sink-rows` rows in 2 tasks, publisher confirms with a window of 1000; pika: 2 processes
  publishing with confirms, the same window.
Spark figures count the batches after the first (the steady state), or for the sink a second write (the first one
starts Spark's Python workers). The fixed cost of a micro-batch is the median trigger time of batches of 100 rows,
beside a no-op Python streaming source's (what Spark itself needs for a batch of a Python source).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import pika
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, StructField, StructType

BODY = b"x" * 100
STREAM = "throughput.stream"
SMALL_STREAM = "throughput.small"  # 20 batches of SMALL_BATCH for the fixed cost
QUEUE = "throughput.queue"
TARGET = "throughput.target"
SMALL_BATCH = 100  # rows of the micro-batches whose fixed cost is measured
RANGES = 4  # offset ranges per stream batch
BATCHES = 4  # stream batches over --stream-rows


# --- plain pika, each connection in a process of its own ---------------------------------------------------------
def fill(uri: str, queue: str, count: int) -> None:
    """Publish count messages (no confirms: a round trip after the last one)."""
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        properties = pika.BasicProperties(delivery_mode=2)
        for _ in range(count):
            channel.basic_publish("", queue, BODY, properties)
        channel.queue_declare(queue, passive=True)


def read_stream_ranges(uri: str, ranges: list[tuple[int, int]], prefetch: int) -> None:
    """Read each [low, high) of the stream on a connection of its own, as a stream source task does."""
    for low, high in ranges:
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        state = {"unacked": 0, "done": False}

        def on_message(channel, method, properties, body, state=state, high=high):
            offset = properties.headers["x-stream-offset"]
            state["unacked"] += 1
            if offset >= high - 1:
                state["done"] = True
            elif state["unacked"] >= prefetch // 2:
                channel.basic_ack(method.delivery_tag, multiple=True)
                state["unacked"] = 0

        channel.basic_consume(STREAM, on_message, arguments={"x-stream-offset": low})
        while not state["done"]:
            connection.process_data_events(time_limit=0.2)
        connection.close()


def consume_queue(uri: str, count: int, prefetch: int, batch: int) -> None:
    """Consume count messages of the queue with the connector's window (one consumer per 65535 of it on one channel,
    as the connector does) and one multiple ack per batch of deliveries."""
    from spark_connector.options import consumer_windows

    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    consumers, per_consumer = consumer_windows(prefetch)
    channel.basic_qos(prefetch_count=per_consumer)
    state = {"received": 0}

    def on_message(channel, method, properties, body):
        state["received"] += 1
        if state["received"] % batch == 0 or state["received"] == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if state["received"] == count:
            channel.stop_consuming()

    for _ in range(consumers):
        channel.basic_consume(QUEUE, on_message)
    channel.start_consuming()
    connection.close()


def publish_confirmed(uri: str, count: int, window: int) -> None:
    """Publish count messages with confirms, at most window unconfirmed (pika's asynchronous connection)."""
    state = {"published": 0, "confirmed": 0}

    def publish_more(channel):
        while state["published"] < count and state["published"] - state["confirmed"] < window:
            state["published"] += 1
            channel.basic_publish("", TARGET, BODY, pika.BasicProperties(
                delivery_mode=2, message_id=f"pika-{os.getpid()}-{state['published']}"))

    def on_confirm(frame, channel):
        state["confirmed"] = frame.method.delivery_tag if frame.method.multiple else state["confirmed"] + 1
        if state["confirmed"] >= count:
            connection.close()
        else:
            publish_more(channel)

    def on_channel(channel):
        channel.confirm_delivery(lambda frame: on_confirm(frame, channel), callback=lambda _: publish_more(channel))

    connection = pika.SelectConnection(pika.URLParameters(uri),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, reason: c.ioloop.stop())
    connection.ioloop.start()


def _run_when_told(start, function, args) -> None:
    start.wait()
    function(*args)


def in_processes(jobs: list[tuple]) -> float:
    """Run each (function, args) in a process of its own, all started together; the seconds until all ended."""
    start = multiprocessing.Event()
    processes = [multiprocessing.Process(target=_run_when_told, args=(start, function, args))
                 for function, args in jobs]
    for process in processes:
        process.start()
    time.sleep(1.0)  # every process has imported pika and waits
    started = time.perf_counter()
    start.set()
    for process in processes:
        process.join()
        if process.exitcode:
            raise RuntimeError(f"a pika process failed ({process.exitcode})")
    return time.perf_counter() - started


# --- Spark ------------------------------------------------------------------------------------------------------
class NoopPartition(InputPartition):
    pass


class NoopReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets that count rows up to a total; each batch's rows are one Arrow batch of constant bodies."""

    def __init__(self, total: int) -> None:
        self.total = total

    def initialOffset(self) -> dict:
        return {"row": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(SMALL_BATCH)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"row": min(self.total, start["row"] + limit.max_rows)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [NoopPartition(end["row"] - start["row"])]

    def read(self, partition: InputPartition):
        yield pa.RecordBatch.from_arrays([pa.array([BODY] * partition.value, pa.binary())], names=["body"])

    def commit(self, end: dict) -> None:
        pass


class NoopSource(DataSource):
    """A Python streaming source that does nothing but count: what a micro-batch costs Spark itself."""

    @classmethod
    def name(cls) -> str:
        return "noop-source"

    def schema(self) -> StructType:
        return StructType([StructField("body", BinaryType())])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NoopReader(int(self.options["total"]))


def steady_rate(query) -> float:
    """Rows/s over the batches after the first."""
    later = [progress for progress in query.recentProgress if progress["batchId"] > 0 and progress["numInputRows"]]
    rows = sum(progress["numInputRows"] for progress in later)
    milliseconds = sum(progress["durationMs"]["triggerExecution"] for progress in later)
    return rows / milliseconds * 1000 if milliseconds else float("nan")


def median_batch_ms(query) -> float:
    times = [progress["durationMs"]["triggerExecution"] for progress in query.recentProgress
             if progress["batchId"] > 0 and progress["numInputRows"]]
    return statistics.median(times)


def run_query(reader):
    query = (reader.load().writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def declare(channel, queue: str, stream: bool = False) -> None:
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"} if stream else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/%2F", help="the broker to measure")
    parser.add_argument("--queue-rows", type=int, default=1_000_000, help="messages for the queue source")
    parser.add_argument("--sink-rows", type=int, default=200_000, help="rows for the sink")
    parser.add_argument("--stream-rows", type=int, default=1_000_000, help="messages for the stream source")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import spark_connector
    from spark_connector.options import DEFAULT_CONFIRM_WINDOW, DEFAULT_PREFETCH, DEFAULT_STREAM_PREFETCH

    uri, queue_rows, rows, stream_rows = args.uri, args.queue_rows, args.sink_rows, args.stream_rows
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    spark = (SparkSession.builder.master("local[2]").appName("warren-throughput")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    spark.dataSource.register(NoopSource)
    table: list[tuple[str, float, float]] = []  # (what, connector rows/s, pika msg/s)

    declare(channel, STREAM, stream=True)
    fill(uri, STREAM, stream_rows)
    ranges = [(stream_rows * index // (BATCHES * RANGES), stream_rows * (index + 1) // (BATCHES * RANGES))
              for index in range(BATCHES * RANGES)]
    pika_seconds = in_processes([(read_stream_ranges, (uri, ranges[0::2], DEFAULT_STREAM_PREFETCH)),
                                 (read_stream_ranges, (uri, ranges[1::2], DEFAULT_STREAM_PREFETCH))])
    stream_reader = (spark.readStream.format("amqp").option("uri", uri).option("stream", STREAM)
                     .option("startingOffsets", "earliest").option("minPartitions", str(RANGES)))
    query = run_query(stream_reader.option("maxOffsetsPerTrigger", str(stream_rows // BATCHES)))
    table.append((f"stream source, {RANGES} ranges per batch", steady_rate(query), stream_rows / pika_seconds))

    declare(channel, QUEUE)
    fill(uri, QUEUE, queue_rows)
    pika_seconds = in_processes([(consume_queue, (uri, queue_rows, DEFAULT_PREFETCH, DEFAULT_PREFETCH // 3))])
    fill(uri, QUEUE, queue_rows)
    query = run_query(spark.readStream.format("amqp").option("uri", uri).option("queue", QUEUE))
    table.append(("queue source, one consuming connection", steady_rate(query), queue_rows / pika_seconds))

    declare(channel, TARGET)
    pika_seconds = in_processes([(publish_confirmed, (uri, rows // 2, DEFAULT_CONFIRM_WINDOW))] * 2)
    frame = spark.range(0, rows, 1, 2).select(F.lit(BODY).alias("body"))  # two partitions, no shuffle
    for _ in range(2):  # the second write is timed: the first starts Spark's Python workers
        channel.queue_purge(TARGET)
        started = time.perf_counter()
        frame.write.format("amqp").option("uri", uri).option("routingKey", TARGET).mode("append").save()
        spark_seconds = time.perf_counter() - started
    table.append(("sink, df.write in 2 tasks, confirms", rows / spark_seconds, rows / pika_seconds))

    declare(channel, SMALL_STREAM, stream=True)
    fill(uri, SMALL_STREAM, SMALL_BATCH * 20)
    stream_batch = median_batch_ms(run_query(
        spark.readStream.format("amqp").option("uri", uri).option("stream", SMALL_STREAM)
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(SMALL_BATCH))))
    channel.queue_purge(QUEUE)
    fill(uri, QUEUE, SMALL_BATCH * 20)
    queue_batch = median_batch_ms(run_query(spark.readStream.format("amqp").option("uri", uri)
                                            .option("queue", QUEUE).option("maxMessagesPerBatch", str(SMALL_BATCH))))
    noop_batch = median_batch_ms(run_query(spark.readStream.format("noop-source").option("total", SMALL_BATCH * 20)))
    for queue in (STREAM, SMALL_STREAM, QUEUE, TARGET):
        channel.queue_delete(queue)
    connection.close()
    spark.stop()

    print(f"\n{len(BODY)}-byte bodies against {uri}: stream {stream_rows} messages, queue {queue_rows}, sink {rows}")
    print(f"  {'':<44} {'connector rows/s':>16} {'pika msg/s':>11} {'ratio':>6}")
    for what, connector, plain in table:
        print(f"  {what:<44} {connector:>16.0f} {plain:>11.0f} {connector / plain:>6.2f}")
    print(f"  fixed cost of a micro-batch of {SMALL_BATCH} rows (median): stream source {stream_batch:.0f} ms, "
          f"queue source {queue_batch:.0f} ms, a no-op Python source {noop_batch:.0f} ms")


if __name__ == "__main__":
    main()
