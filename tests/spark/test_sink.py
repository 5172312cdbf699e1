"""The amqp sink: exact counts, message contents and ids, and failures that fail the write."""

from __future__ import annotations

import datetime
import re

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from tests.spark.conftest import BOUNDED_WAIT_SECONDS, read_queue

pytestmark = pytest.mark.spark


def writer(frame, url, **options):
    write = frame.write.format("amqp").option("uri", url).mode("append")
    for key, value in options.items():
        write = write.option(key, str(value))
    return write


def test_batch_write_publishes_every_row_persistent_with_its_properties(spark, broker, amqp, unique):
    queue = amqp.declare(unique)
    schema = StructType(
        [
            StructField("body", StringType()),
            StructField("content_type", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("timestamp", TimestampType()),
            StructField("correlation_id", StringType()),
        ]
    )
    stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    rows = [(f"row-{i}", "text/plain", {"n": str(i)}, stamp, f"c{i}") for i in range(500)]
    writer(spark.createDataFrame(rows, schema).repartition(2), broker.url, routingKey=queue).save()

    messages = amqp.drain(queue)
    assert sorted(body for _, _, body in messages) == sorted(f"row-{i}".encode() for i in range(500))
    by_body = {body: properties for _, properties, body in messages}
    properties = by_body[b"row-7"]
    assert (properties.content_type, properties.headers, properties.correlation_id) == ("text/plain", {"n": "7"}, "c7")
    assert properties.timestamp == int(stamp.timestamp())
    assert all(p.delivery_mode == 2 for p in by_body.values())
    ids = [p.message_id for p in by_body.values()]
    assert len(set(ids)) == 500
    assert all(re.fullmatch(r"[0-9a-f]{32}-[01]-\d+", message_id) for message_id in ids)


def test_routing_key_column_and_transient_option(spark, broker, amqp, unique):
    queues = [amqp.declare(f"{unique}-{n}") for n in range(2)]
    frame = spark.createDataFrame([(queues[i % 2], bytearray(b"x%d" % i)) for i in range(10)], "target string, body binary")
    writer(frame, broker.url, routingKeyColumn="target", persistent="false").save()

    for queue in queues:
        messages = amqp.drain(queue)
        assert len(messages) == 5
        assert all(properties.delivery_mode == 1 for _, properties, _ in messages)


def test_streaming_pipeline_republishes_each_message_with_stable_ids(spark, broker, amqp, unique, tmp_path):
    source, target = amqp.declare(f"{unique}-in"), amqp.declare(f"{unique}-out")
    amqp.publish(source, [f"m{i}".encode() for i in range(300)])
    query = (
        read_queue(spark, broker.url, source, maxMessagesPerBatch=100, bodyEncoding="utf-8")
        .selectExpr("upper(text) AS body", "headers")
        .writeStream.format("amqp")
        .option("uri", broker.url)
        .option("routingKey", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS)

    messages = amqp.drain(target)
    assert sorted(body for _, _, body in messages) == sorted(f"M{i}".encode() for i in range(300))
    ids = [properties.message_id for _, properties, _ in messages]
    assert len(set(ids)) == 300
    assert {message_id.rsplit("-", 3)[0] for message_id in ids} == {query.id}
    assert {int(message_id.rsplit("-", 3)[1]) for message_id in ids} == {0, 1, 2}
    assert amqp.wait_for_no_consumer(source) == 0


def test_unroutable_rows_fail_the_write_when_mandatory(spark, broker, unique):
    frame = spark.createDataFrame([("lost",)], "body string")
    with pytest.raises(Exception, match="312 NO_ROUTE"):
        writer(frame, broker.url, exchange="amq.direct", routingKey=f"{unique}-nowhere", mandatory="true").save()


def test_a_nacked_publish_fails_the_write(spark, broker, amqp, unique):
    queue = amqp.declare(unique, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    frame = spark.createDataFrame([(str(i),) for i in range(20)], "body string").coalesce(1)
    with pytest.raises(Exception, match="nacked"):
        writer(frame, broker.url, routingKey=queue, confirmWindow=1).save()
    assert amqp.counts(queue)[0] == 5


def test_streaming_write_failure_fails_the_query(spark, broker, amqp, unique, tmp_path):
    source = amqp.declare(unique)
    amqp.publish(source, [b"x"])
    query = (
        read_queue(spark, broker.url, source)
        .select("body")
        .writeStream.format("amqp")
        .option("uri", broker.url)
        .option("exchange", "amq.direct")
        .option("routingKey", f"{unique}-nowhere")
        .option("mandatory", "true")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="NO_ROUTE"):
        query.awaitTermination(BOUNDED_WAIT_SECONDS)
    assert amqp.wait_for_no_consumer(source) == 1, "the message of the failed batch must go back to its queue"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'uri' is required"),
        ({"uri": "http://x"}, "must start with amqp://"),
        ({"uri": "amqp://x", "routingKey": "a", "routingKeyColumn": "b"}, "exclude each other"),
        ({"uri": "amqp://x", "bodyColumn": "missing"}, "column 'missing'"),
        ({"uri": "amqp://x", "confirmWindow": "0"}, "'confirmWindow' must be a positive integer"),
        ({"uri": "amqp://x", "mandatory": "yes"}, "'mandatory' must be 'true' or 'false'"),
    ],
)
def test_invalid_sink_options_are_reported_clearly(spark, options, message):
    frame = spark.createDataFrame([("x",)], "body string")
    write = frame.write.format("amqp").mode("append")
    for key, value in options.items():
        write = write.option(key, value)
    with pytest.raises(Exception, match=re.escape(message)):
        write.save()


def test_a_row_that_cannot_be_encoded_fails_the_write_naming_its_message(spark, broker, amqp, unique):
    queue = amqp.declare(unique)
    frame = spark.createDataFrame([("fine", 1), ("out of range", 300)], "body string, priority int").coalesce(1)
    with pytest.raises(Exception, match=r"message '[0-9a-f]{32}-0-1' cannot be published: error\('ubyte format"):
        writer(frame, broker.url, routingKey=queue).save()
