"""The "amqp" Python data source: entry point that Spark instantiates from the format name."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from spark_connector.options import SinkOptions, SourceOptions, StreamSourceOptions, body_encoding
from spark_connector.schema import source_schema, stream_schema
from spark_connector.sink import AmqpStreamWriter, AmqpWriter
from spark_connector.source import AmqpStreamReader
from spark_connector.stream_source import AmqpStreamOffsetsReader


class AmqpDataSource(DataSource):
    """Reads a queue (option `queue` or `exchange`) or a stream queue (option `stream`) as a stream, writes rows as
    messages (streaming or batch)."""

    @classmethod
    def name(cls) -> str:
        return "amqp"

    def _reads_stream(self) -> bool:
        return bool(self.options.get("stream"))

    def schema(self) -> StructType:
        if self._reads_stream():
            return stream_schema()
        return source_schema(with_text=body_encoding(self.options) is not None)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self._reads_stream():
            return AmqpStreamOffsetsReader(StreamSourceOptions.parse(self.options))
        return AmqpStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        raise NotImplementedError(
            'amqp: a queue is read as a stream: use spark.readStream.format("amqp") '
            "(with Trigger.AvailableNow to drain it once)"
        )

    def writer(self, schema: StructType, overwrite: bool) -> AmqpWriter:
        return AmqpWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> AmqpStreamWriter:
        return AmqpStreamWriter(SinkOptions.parse(self.options), schema)
