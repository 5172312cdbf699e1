"""The streaming source: at-least-once delivery of a queue's messages into micro-batches.

Spark runs `initialOffset`, `latestOffset`, `partitions` and `commit` of one reader instance in a
long-lived process on the driver, and `read` in executor workers on other instances. So the driver
instance owns the consuming connection (delivery tags are channel-scoped), ships each batch's rows
inside its partitions, and acknowledges a batch's messages only in `commit`, which Spark calls once
the batch is committed to the checkpoint.

An offset is `{"run": id, "seq": n, "flush": f}`: `run` names one consuming connection, `seq` counts
its deliveries, `flush` is bumped to plan an empty batch (see `latestOffset`). Offsets of another
run (read back from a checkpoint after a restart) cover messages that were never acknowledged: the
broker requeued them when that run's connection closed and redelivers them (flagged redelivered)
to this run, so their batches are replayed empty and their commits ignored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from spark_connector.client import BackgroundConsumer
from spark_connector.options import SourceOptions
from spark_connector.schema import read_arrow_stream

# How long an AvailableNow batch waits for the deliveries it expects before planning what it has.
AVAILABLE_NOW_WAIT_SECONDS = 2.0


class MessagesPartition(InputPartition):
    """The rows of one batch, shipped from the driver to the executor that hands them to Spark."""

    def __init__(self, count: int, rows: bytes) -> None:
        super().__init__(count)  # the batch's row count
        self.rows = rows  # an Arrow IPC stream of the source's schema

    def __repr__(self) -> str:
        return f"MessagesPartition({self.value} rows)"


class AmqpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from the deliveries buffered by a `BackgroundConsumer`."""

    def __init__(self, options: SourceOptions) -> None:
        # Readers are constructed and pickled several times: connect lazily, on the driver only.
        self._options = options
        self._run = uuid.uuid4().hex  # identifies this reader's consuming connection in offsets
        self._consumer: BackgroundConsumer | None = None  # started by the first offset request
        self._acked = 0  # highest sequence number acknowledged to the broker
        self._target: int | None = None  # under Trigger.AvailableNow, the last sequence to plan
        self._initial_ready = 0  # messages ready in the queue when consuming started

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_consumer": None}

    def _connected(self) -> BackgroundConsumer:
        if self._consumer is None:
            consumer = BackgroundConsumer(self._options)
            self._initial_ready = consumer.start()
            self._consumer = consumer
        return self._consumer

    def _start_sequence(self, offset: dict) -> int:
        """Sequence number an offset stands for in this run (0 for another run's offset)."""
        return offset["seq"] if offset.get("run") == self._run else 0

    def initialOffset(self) -> dict:
        return {"run": self._run, "seq": 0, "flush": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self._options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        # Consuming starts here, right after the queue's ready count was taken: that count is exactly
        # what is available now.
        self._connected()
        self._target = self._initial_ready

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        consumer = self._connected()
        first = self._start_sequence(start)
        cap = first + limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._target is not None:
            cap = self._target if cap is None else min(cap, self._target)
            self._await_available_now(consumer, first, cap)
        end = consumer.received if cap is None else min(cap, consumer.received)
        if end > first:
            return {"run": self._run, "seq": end, "flush": 0}
        if start.get("run") == self._run and self._acked < first:
            # Spark commits batch N only when it plans batch N+1, and plans only when the offset
            # moves. Nothing new arrived, so an empty batch is planned to get the last one committed
            # (and acknowledged): otherwise it would stay unacked, and a full prefetch window would
            # stall the queue for good.
            return {"run": self._run, "seq": first, "flush": start["flush"] + 1}
        return start

    def _await_available_now(self, consumer: BackgroundConsumer, first: int, cap: int) -> None:
        """Wait for a full batch; give up on messages that other consumers took meanwhile."""
        wanted = min(cap, self._acked + self._options.prefetch)
        if wanted <= first or consumer.wait_for(wanted, AVAILABLE_NOW_WAIT_SECONDS):
            return
        if consumer.ready_count() == 0 and not consumer.wait_for(wanted, AVAILABLE_NOW_WAIT_SECONDS):
            self._target = consumer.received

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if end.get("run") != self._run:
            return []
        first, last = self._start_sequence(start), end["seq"]
        if last <= first:
            return []
        return [MessagesPartition(last - first, self._connected().rows(first, last, self._options.body_encoding))]

    def read(self, partition: MessagesPartition) -> Iterator[pa.RecordBatch]:
        return read_arrow_stream(partition.rows)

    def commit(self, end: dict) -> None:
        if end.get("run") != self._run or end["seq"] <= self._acked:
            return
        self._connected().ack_through(end["seq"])
        self._acked = end["seq"]

    def stop(self) -> None:
        # Not called when a query stops normally (Spark ends the worker process that runs this reader);
        # the broker requeues the unacknowledged messages when the connection drops either way.
        if self._consumer is not None:
            self._consumer.close()
