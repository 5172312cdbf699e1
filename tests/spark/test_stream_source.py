"""The stream source (option `stream`): where a query starts (earliest, JSON offsets, a timestamp), offset ranges,
read limits (maxOffsetsPerTrigger, minOffsetsPerTrigger with maxTriggerDelay), Trigger.AvailableNow stopping at the
tail recorded at start, retention found out as data loss, a deleted stream, bad options."""

from __future__ import annotations

import datetime
import json
import re
import threading
import time

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from spark_connector.options import AmqpOptionError, StreamSourceOptions
from spark_connector.stream_source import AmqpStreamOffsetsReader, split
from tests.spark.conftest import BOUNDED_WAIT_SECONDS, Collector, collect, replay_module

pytestmark = pytest.mark.spark

STREAM = {"x-queue-type": "stream"}


def read_stream(spark, url: str, stream: str, **options):
    reader = spark.readStream.format("amqp").option("uri", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def bodies(start: int, stop: int) -> list[bytes]:
    return [f"m{n}".encode() for n in range(start, stop)]


def events(start: int, stop: int) -> list[bytes]:
    """The bodies examples/stream_replay.py publishes."""
    return [f"event-{n}".encode() for n in range(start, stop)]


def test_available_now_reads_from_the_earliest_offset_in_ranges_and_stops_at_the_tail(
        spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM)
    amqp.publish(unique, bodies(0, 2000))
    collector = Collector()
    frame = read_stream(spark, broker.url, unique, startingOffsets="earliest", maxOffsetsPerTrigger=500,
                        minPartitions=4)
    query = collect(frame, collector, tmp_path / "checkpoint", availableNow=True)
    amqp.publish(unique, bodies(2000, 2100))  # after the query started: not for it (unless the tail moved first)
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)
    rows = collector.rows
    offsets = [row.offset for row in rows]
    assert sorted(offsets) == list(range(len(offsets))) and len(offsets) >= 2000
    assert [row.body for row in sorted(rows, key=lambda row: row.offset)] == bodies(0, len(offsets))
    assert {row.stream for row in rows} == {unique}
    assert all(len(batch) <= 500 for _, batch in collector.batches)


def test_a_row_carries_the_message_s_properties_headers_and_timestamp(spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM)
    amqp.publish(unique, [b"with all"], content_type="text/plain", content_encoding="utf-8", delivery_mode=2,
                 priority=7, correlation_id="c-1", message_id="m-1", app_id="shop", timestamp=1_700_000_000,
                 headers={"tenant": "acme", "attempt": 3, "raw": b"bytes", "ok": True})
    amqp.publish(unique, [b"bare"])
    amqp.publish(unique, [b"bare again", b"with a header"], headers={"tenant": "acme"})
    amqp.publish(unique, [b"with a type"], type="order")
    collector = Collector()
    query = collect(read_stream(spark, broker.url, unique, startingOffsets="earliest"), collector,
                    tmp_path / "checkpoint", availableNow=True)
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)
    full, bare, *others = sorted(collector.rows, key=lambda row: row.offset)
    # rows that follow one another with the same properties, or other ones, each have their own
    assert [(row.body, row.properties, row.headers) for row in others] == [
        (b"bare again", {}, {"tenant": "acme"}), (b"with a header", {}, {"tenant": "acme"}),
        (b"with a type", {"type": "order"}, {})]
    assert (full.stream, full.offset, full.body, full.routing_key, full.exchange) == (unique, 0, b"with all", unique, "")
    assert full.properties == {"content_type": "text/plain", "content_encoding": "utf-8", "delivery_mode": "2",
                               "priority": "7", "correlation_id": "c-1", "message_id": "m-1", "app_id": "shop"}
    assert full.headers == {"tenant": "acme", "attempt": "3", "raw": "bytes", "ok": "true"}  # no x-stream-offset
    assert full.timestamp.astimezone(datetime.timezone.utc) == datetime.datetime(2023, 11, 14, 22, 13, 20,
                                                                                  tzinfo=datetime.timezone.utc)
    assert (bare.offset, bare.body, bare.properties, bare.headers, bare.timestamp) == (1, b"bare", {}, {}, None)


def test_available_now_stops_at_the_tail_recorded_at_start_while_a_publisher_keeps_appending(
        spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM)
    stream_replay = replay_module()
    assert stream_replay.publish(broker.url, unique, 0, 50_000) == 50_000
    stop = threading.Event()
    appended = []

    def keep_appending() -> None:
        start = 50_000
        while not stop.is_set():
            appended.append(stream_replay.publish(broker.url, unique, start, 500))
            start += 500

    publisher = threading.Thread(target=keep_appending)
    publisher.start()
    try:
        collector = Collector()
        frame = read_stream(spark, broker.url, unique, startingOffsets="earliest", maxOffsetsPerTrigger=10_000,
                            minPartitions=2)
        query = collect(frame, collector, tmp_path / "checkpoint", availableNow=True)
        assert query.awaitTermination(BOUNDED_WAIT_SECONDS)  # it ends though the stream keeps growing
    finally:
        stop.set()
        publisher.join(BOUNDED_WAIT_SECONDS)
    offsets = sorted(row.offset for row in collector.rows)
    assert offsets == list(range(len(offsets))) and len(offsets) >= 50_000
    assert len(offsets) < 50_000 + sum(appended)  # what came after the start was left for later


def test_retention_during_a_pause_fails_the_restarted_query_naming_the_lost_offsets_unless_told_to_go_on(
        spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM, **{"x-max-length-bytes": 60_000, "x-stream-max-segment-size-bytes": 10_000})
    stream_replay = replay_module()
    stream_replay.publish(broker.url, unique, 0, 1000)
    checkpoint = tmp_path / "checkpoint"
    first = Collector()
    query = collect(read_stream(spark, broker.url, unique, startingOffsets="latest"), first, checkpoint,
                    availableNow=True)
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)  # starts at the tail: nothing read, offset 1000 kept
    stream_replay.publish(broker.url, unique, 1000, 5000)  # the query is stopped; retention drops the head
    with pytest.raises(StreamingQueryException, match=f"stream '{unique}': offsets ([0-9]+) to [0-9]+ are gone "
                                                      r".*expected offset \1, the first available is [0-9]+"):
        collect(read_stream(spark, broker.url, unique), Collector(), checkpoint,
                availableNow=True).awaitTermination(BOUNDED_WAIT_SECONDS)
    going_on = Collector()
    query = collect(read_stream(spark, broker.url, unique, failOnDataLoss="false"), going_on, checkpoint,
                    availableNow=True)
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)
    kept = [row.body for row in sorted(going_on.rows, key=lambda row: row.offset)]
    assert 0 < len(kept) < 5000 and kept == events(6000 - len(kept), 6000)  # the newest ones, in order


def test_a_deleted_stream_fails_the_query(spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM)
    amqp.publish(unique, bodies(0, 10))
    collector = Collector()
    query = collect(read_stream(spark, broker.url, unique, startingOffsets="earliest"), collector,
                    tmp_path / "checkpoint", processingTime="100 milliseconds")
    collector.wait_for_rows(10)
    amqp.channel.queue_delete(unique)
    with pytest.raises(StreamingQueryException, match=f"stream '{unique}'"):
        query.awaitTermination(BOUNDED_WAIT_SECONDS)


@pytest.mark.parametrize("options, message", [
    ({"stream": "s", "queue": "q"}, "option 'stream' excludes options 'queue' and 'exchange'"),
    ({"stream": "s", "startingOffsets": "sometime"}, "option 'startingOffsets' must be 'earliest', 'latest' or a JSON"),
    ({"stream": "s", "startingOffsets": "earliest", "startingTimestamp": "0"},
     "options 'startingOffsets' and 'startingTimestamp' exclude each other"),
    ({"stream": "s", "maxOffsetsPerTrigger": "0"}, "option 'maxOffsetsPerTrigger' must be a positive integer"),
    ({"stream": "s", "prefetch": "70000"}, "option 'prefetch' must be at most 65535"),
    ({"stream": "s", "maxTriggerDelay": "soon"}, "option 'maxTriggerDelay' must be a duration"),
    ({"stream": "s", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be 'true' or 'false'"),
])
def test_invalid_stream_options_are_reported_clearly(options, message):
    with pytest.raises(AmqpOptionError, match=re.escape(message)):
        StreamSourceOptions.parse({key.lower(): value for key, value in {"uri": "amqp://h/", **options}.items()})


def test_ranges_split_a_batch_evenly_and_never_exceed_the_records_per_partition():
    assert split(0, 10, 4, None) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert split(100, 103, 4, None) == [(100, 101), (101, 102), (102, 103)]  # never an empty range
    assert split(0, 10, 1, 3) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert split(5, 5, 4, None) == []


def test_starting_offsets_as_json_and_a_starting_timestamp_pick_where_a_new_query_starts(
        spark, broker, amqp, unique, tmp_path):
    amqp.declare(unique, **STREAM)
    amqp.publish(unique, bodies(0, 5))
    time.sleep(1.05 - time.time() % 1)  # a new second: startingTimestamp is rounded down to the second
    since = int(time.time() * 1000)
    amqp.publish(unique, bodies(5, 10))
    from_json, from_time = Collector(), Collector()
    for collector, options, checkpoint in (
            (from_json, {"startingOffsets": json.dumps({unique: 3})}, "json"),
            (from_time, {"startingTimestamp": since}, "time")):
        query = collect(read_stream(spark, broker.url, unique, **options), collector, tmp_path / checkpoint,
                        availableNow=True)
        assert query.awaitTermination(BOUNDED_WAIT_SECONDS)
    assert sorted(row.body for row in from_json.rows) == bodies(3, 10)
    assert sorted(row.body for row in from_time.rows) == bodies(5, 10)


class FixedTail:
    """A tail follower that says the stream ends at a given offset."""

    def __init__(self, end: int) -> None:
        self.end = end

    def next_offset(self) -> int:
        return self.end


def test_min_offsets_per_trigger_waits_for_enough_new_offsets_or_for_max_trigger_delay():
    options = StreamSourceOptions.parse({"uri": "amqp://h/", "stream": "s", "minoffsetspertrigger": "50",
                                         "maxtriggerdelay": "200ms", "maxoffsetspertrigger": "80"})
    reader = AmqpStreamOffsetsReader(options)
    reader._follower = tail = FixedTail(10)
    start = {"s": 0}
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start  # 10 new offsets: too few, wait
    assert reader.latestOffset(start, ReadMinRows(50)) == start
    time.sleep(0.25)  # maxTriggerDelay has passed since the batch was first put off
    assert reader.latestOffset(start, ReadMinRows(50)) == {"s": 10}
    tail.end = 200
    assert reader.latestOffset({"s": 10}, ReadMaxRows(80)) == {"s": 90}  # enough at once, up to the maximum
    assert reader.latestOffset({"s": 90}, ReadAllAvailable()) == {"s": 200}  # no limit: to the tail
