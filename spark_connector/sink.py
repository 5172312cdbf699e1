"""The sink: every task publishes its rows with publisher confirms, for batch and streaming writes.

Each message gets a `message_id` that is the same on every attempt of the same rows, so consumers
can drop the duplicates that a retried task or batch publishes:
`<query id>-<batch id>-<partition>-<row>` for a streaming query (the query id survives restarts from
a checkpoint) and `<write id>-<partition>-<row>` for a batch write.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from spark_connector.options import AmqpOptionError, SinkOptions
from spark_connector.publisher import ConfirmedPublisher, OutgoingMessage
from spark_connector.schema import row_properties, sink_property_columns

# Local properties Spark sets on the tasks of a streaming micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class PublishedCount(WriterCommitMessage):
    """What one task reports back to the driver."""

    partition: int
    messages: int


class RowPublisher:
    """Turns Arrow record batches into confirmed publishes; shared by the batch and stream writers."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._options = options
        self._check_column(schema, options.body_column, (BinaryType, StringType), "bodyColumn")
        if options.routing_key_column is not None:
            self._check_column(schema, options.routing_key_column, (StringType,), "routingKeyColumn")
        self._property_columns = sink_property_columns(schema, options.body_column, options.routing_key_column)

    @staticmethod
    def _check_column(schema: StructType, name: str, types: tuple[type, ...], option: str) -> None:
        if name not in schema.fieldNames():
            raise AmqpOptionError(
                f"amqp sink: column {name!r} (option '{option}') is not among the columns {schema.fieldNames()}"
            )
        actual = schema[name].dataType
        if not isinstance(actual, types):
            expected = " or ".join(t.typeName() for t in types)
            raise AmqpOptionError(f"amqp sink: column {name!r} must be {expected}, not {actual.simpleString()}")

    def publish(self, batches: Iterator[pa.RecordBatch], id_prefix: str) -> PublishedCount:
        partition = TaskContext.get().partitionId()
        options = self._options
        publisher = ConfirmedPublisher(options.uri, options.exchange, options.mandatory, options.confirm_window)
        count = publisher.publish_all(self._messages(batches, f"{id_prefix}-{partition}"))
        return PublishedCount(partition=partition, messages=count)

    def _messages(self, batches: Iterator[pa.RecordBatch], id_prefix: str) -> Iterator[OutgoingMessage]:
        options = self._options
        row = 0
        for batch in batches:
            bodies = batch.column(options.body_column).to_pylist()
            if options.routing_key_column is None:
                routing_keys = [options.routing_key] * len(bodies)
            else:
                routing_keys = batch.column(options.routing_key_column).to_pylist()
            columns = {name: batch.column(name).to_pylist() for name in self._property_columns}
            for index, body in enumerate(bodies):
                if body is None:
                    raise ValueError(f"amqp sink: column {options.body_column!r} is null in row {row}")
                if isinstance(body, str):
                    body = body.encode("utf-8")
                values = {name: column[index] for name, column in columns.items()}
                properties = row_properties(values, f"{id_prefix}-{row}", options.persistent)
                yield routing_keys[index] or "", body, properties
                row += 1


class AmqpWriter(DataSourceArrowWriter):
    """`df.write.format("amqp")`: one confirmed publisher per task."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._rows = RowPublisher(options, schema)
        self._write_id = uuid.uuid4().hex  # made on the driver, so shared by all tasks of this write

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        return self._rows.publish(iterator, self._write_id)


class AmqpStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("amqp")`: each micro-batch's tasks publish with confirms."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self._rows = RowPublisher(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        context = TaskContext.get()
        prefix = f"{context.getLocalProperty(QUERY_ID_PROPERTY)}-{context.getLocalProperty(BATCH_ID_PROPERTY)}"
        return self._rows.publish(iterator, prefix)
