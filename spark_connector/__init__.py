"""A PySpark Structured Streaming source and sink for AMQP 0-9-1 brokers, registered as format "amqp".

    import spark_connector
    spark_connector.register(spark)   # same as spark.dataSource.register(AmqpDataSource)
    stream = spark.readStream.format("amqp").option("uri", uri).option("queue", "in").load()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_connector.datasource import AmqpDataSource
from spark_connector.options import AmqpOptionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["AmqpDataSource", "AmqpOptionError", "register"]


def register(spark: SparkSession) -> None:
    """Make `format("amqp")` available in `spark`."""
    spark.dataSource.register(AmqpDataSource)
