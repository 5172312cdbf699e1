"""The stream source: exactly-once, parallel reading of a stream queue (format "amqp" with option `stream`).

An offset is `{"<stream>": next_offset}`: the batch from start to end covers the offsets in [start, end). The
driver plans a batch from a tail follower (`stream_reading.TailFollower`) and splits it into offset ranges; each
executor task reads its range on a connection of its own, so a batch is read by several tasks at once, and a
replayed batch (after a driver, executor or broker failure) reads the same ranges again and yields the same rows.
Nothing is acknowledged to keep messages: reading a stream removes nothing, and the checkpoint alone says where
the query is. Combined with a sink that writes each batch idempotently (e.g. foreachBatch overwriting the output
of its batch id), every message reaches the output exactly once.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from spark_connector.options import AmqpOptionError, StreamSourceOptions
from spark_connector.stream_reading import TailFollower, probe_offset, read_range, timestamp_spec


class OffsetRange(InputPartition):
    """The offsets [low, high) of one stream, read by one task."""

    def __init__(self, stream: str, low: int, high: int) -> None:
        super().__init__((low, high))
        self.stream = stream
        self.low = low
        self.high = high


def split(low: int, high: int, min_partitions: int, max_per_partition: int | None) -> list[tuple[int, int]]:
    """[low, high) cut into max(min_partitions, ceil(n / max_per_partition)) ranges of near-equal size."""
    size = high - low
    if size <= 0:
        return []
    count = max(min_partitions, math.ceil(size / max_per_partition) if max_per_partition else 1)
    count = min(count, size)
    bounds = [low + size * index // count for index in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


class AmqpStreamOffsetsReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches of offset ranges; `read` runs on the executors."""

    def __init__(self, options: StreamSourceOptions) -> None:
        # Readers are pickled to the executors: the tail follower is made on the driver, at the first call there.
        self._options = options
        self._follower: TailFollower | None = None
        self._target: int | None = None  # under Trigger.AvailableNow, the tail when the query started
        self._waiting_since: float | None = None  # when a batch below minOffsetsPerTrigger was first put off

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_follower": None}

    def _tail(self) -> int:
        if self._follower is None:
            options = self._options
            follower = TailFollower(options.uri, options.stream, options.prefetch)
            follower.start()
            self._follower = follower
        return self._follower.next_offset()

    def initialOffset(self) -> dict:
        options = self._options
        stream = options.stream
        if options.starting_timestamp is not None:
            found = probe_offset(options.uri, stream, timestamp_spec(options.starting_timestamp))
            return {stream: self._tail() if found is None else found}
        if options.starting_offsets == "latest":
            return {stream: self._tail()}
        if options.starting_offsets == "earliest":
            found = probe_offset(options.uri, stream, "first")
            return {stream: 0 if found is None else found}
        return {stream: self._given_offset()}

    def _given_offset(self) -> int:
        stream = self._options.stream
        try:
            offsets = json.loads(self._options.starting_offsets)
            offset = offsets[stream]
        except (ValueError, KeyError, TypeError):
            raise AmqpOptionError(f"amqp source: option 'startingOffsets' must be a JSON object with the offset of "
                                  f"stream {stream!r}, got {self._options.starting_offsets!r}") from None
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise AmqpOptionError(f"amqp source: the starting offset of stream {stream!r} must be an integer, "
                                  f"got {offset!r}")
        if offset == -2:  # Kafka's "earliest" in JSON
            found = probe_offset(self._options.uri, stream, "first")
            return 0 if found is None else found
        return self._tail() if offset == -1 else offset  # -1: Kafka's "latest"

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self._options
        if options.max_offsets_per_trigger is not None:
            return ReadMaxRows(options.max_offsets_per_trigger)
        if options.min_offsets_per_trigger is not None:
            return ReadMinRows(options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._tail()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        stream = self._options.stream
        first = start[stream]
        end = self._tail()
        if self._target is not None:
            end = min(end, self._target)
        elif self._put_off(first, end, limit):
            return start
        if not isinstance(limit, ReadAllAvailable) and self._options.max_offsets_per_trigger is not None:
            end = min(end, first + self._options.max_offsets_per_trigger)
        return {stream: max(first, end)}

    def _put_off(self, first: int, end: int, limit: ReadLimit) -> bool:
        """minOffsetsPerTrigger: too few new offsets wait, until maxTriggerDelay has passed since the first wait."""
        minimum = self._options.min_offsets_per_trigger
        if isinstance(limit, ReadAllAvailable) or minimum is None or end - first >= minimum:
            self._waiting_since = None
            return False
        if end <= first:
            return True
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since < self._options.max_trigger_delay:
            return True
        self._waiting_since = None
        return False

    def reportLatestOffset(self) -> dict:
        return {self._options.stream: self._tail()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        options = self._options
        stream = options.stream
        return [OffsetRange(stream, low, high) for low, high in
                split(start[stream], end[stream], options.min_partitions, options.max_records_per_partition)]

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        options = self._options
        return read_range(options.uri, partition.stream, partition.low, partition.high, options.prefetch,
                          options.fail_on_data_loss)

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: the checkpoint is the only record of how far the query read."""

    def stop(self) -> None:
        if self._follower is not None:
            self._follower.close()
