"""A PySpark Structured Streaming source and sink for AMQP 0-9-1 brokers."""
