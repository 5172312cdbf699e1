"""The stream source (option `stream`): offset ranges read by several tasks at once, the same rows for a replayed
range, Trigger.AvailableNow stopping at the tail recorded at start, and retention found out as data loss."""

from __future__ import annotations

import pytest

from tests.spark.conftest import BOUNDED_WAIT_SECONDS, Collector, collect

pytestmark = pytest.mark.spark

STREAM = {"x-queue-type": "stream"}


def read_stream(spark, url: str, stream: str, **options):
    reader = spark.readStream.format("amqp").option("uri", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def bodies(start: int, stop: int) -> list[bytes]:
    return [f"m{n}".encode() for n in range(start, stop)]


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
