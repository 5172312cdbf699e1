"""The amqp streaming source: exact counts, row contents, acknowledgement after commit, restarts."""

from __future__ import annotations

import datetime
import re
from collections import Counter

import pika
import pika.exceptions
import pytest
from pyspark.errors import StreamingQueryException

from spark_connector import AmqpOptionError
from spark_connector.options import SourceOptions
from tests.spark.conftest import BOUNDED_WAIT_SECONDS, Collector, collect, read_queue

pytestmark = pytest.mark.spark


def run_available_now(spark, url, queue, checkpoint, collector, **options):
    query = collect(read_queue(spark, url, queue, **options), collector, checkpoint, availableNow=True)
    assert query.awaitTermination(BOUNDED_WAIT_SECONDS), "AvailableNow query did not finish"
    return query


def test_available_now_reads_each_message_once_and_acks_them_all(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    bodies = [f"m{i}".encode() for i in range(250)]
    amqp.publish(queue, bodies)

    collector = Collector()
    # Batches as large as the prefetch window: each fills it and must be acked for the next to come.
    run_available_now(spark, broker.url, queue, tmp_path / "checkpoint", collector, prefetch=100, maxMessagesPerBatch=100)

    assert sorted(row.body for row in collector.rows) == sorted(bodies)
    assert not any(row.redelivered for row in collector.rows)
    assert amqp.wait_for_no_consumer(queue) == 0, "messages were requeued: not all were acked"


def test_a_window_beyond_sixteen_bits_is_several_consumers_on_one_channel(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    bodies = [f"m{i}".encode() for i in range(300)]
    amqp.publish(queue, bodies)
    collector = Collector()
    # basic.qos's prefetch count is 16 bits: 140,000 is three consumers of 46,667
    query = collect(read_queue(spark, broker.url, queue, prefetch=140_000), collector, tmp_path / "checkpoint",
                    processingTime="100 milliseconds")
    try:
        collector.wait_for_rows(len(bodies))
        assert amqp.channel.queue_declare(queue, passive=True).method.consumer_count == 3
    finally:
        query.stop()
    assert sorted(row.body for row in collector.rows) == sorted(bodies)


def test_rows_carry_the_message_properties(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    amqp.publish(
        queue,
        ["héllo".encode()],
        content_type="text/plain",
        content_encoding="utf-8",
        headers={"tenant": "acme", "attempt": 3, "raw": b"bytes"},
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="greeting",
        app_id="tests",
    )
    collector = Collector()
    run_available_now(spark, broker.url, queue, tmp_path / "checkpoint", collector, bodyEncoding="utf-8")

    [row] = collector.rows
    assert row.body == "héllo".encode()
    assert row.text == "héllo"
    assert (row.exchange, row.routing_key, row.redelivered) == ("", queue, False)
    assert row.headers == {"tenant": "acme", "attempt": "3", "raw": "bytes"}
    assert (row.content_type, row.content_encoding, row.delivery_mode, row.priority) == ("text/plain", "utf-8", 2, 7)
    assert (row.correlation_id, row.reply_to, row.expiration, row.message_id) == ("corr-1", "replies", "60000", "msg-1")
    assert row.timestamp.astimezone(datetime.timezone.utc) == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc)
    assert (row.type, row.user_id, row.app_id) == ("greeting", None, "tests")


def test_max_messages_per_batch_bounds_every_batch(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    amqp.publish(queue, [str(i).encode() for i in range(95)])
    collector = Collector()
    run_available_now(spark, broker.url, queue, tmp_path / "checkpoint", collector, maxMessagesPerBatch=30)

    sizes = [len(rows) for _, rows in collector.batches if rows]
    assert sizes == [30, 30, 30, 5]
    assert amqp.wait_for_no_consumer(queue) == 0


def test_streaming_query_acks_its_last_batch_once_the_queue_is_idle(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    collector = Collector()
    query = collect(read_queue(spark, broker.url, queue), collector, tmp_path / "checkpoint", processingTime="100 milliseconds")
    try:
        amqp.publish(queue, [b"a", b"b", b"c"])
        collector.wait_for_rows(3)
        amqp.publish(queue, [b"d", b"e"])
        collector.wait_for_rows(5)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(row.body for row in collector.rows) == [b"a", b"b", b"c", b"d", b"e"]
    assert amqp.wait_for_no_consumer(queue) == 0, "the last batch was never acknowledged"


def test_restart_after_a_failed_batch_loses_nothing_and_flags_the_duplicates(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    bodies = [str(i).encode() for i in range(100)]
    amqp.publish(queue, bodies)
    checkpoint = tmp_path / "checkpoint"

    failing = Collector(fail_batch=1)
    with pytest.raises(StreamingQueryException, match="fails on purpose"):
        run_available_now(spark, broker.url, queue, checkpoint, failing, maxMessagesPerBatch=30)
    committed = [row.body for batch_id, rows in failing.batches if batch_id == 0 for row in rows]
    uncommitted = [row.body for batch_id, rows in failing.batches if batch_id == 1 for row in rows]
    assert len(committed) == len(uncommitted) == 30
    assert amqp.wait_for_no_consumer(queue) == 70, "only the committed batch may be acknowledged"

    resumed = Collector()
    run_available_now(spark, broker.url, queue, checkpoint, resumed, maxMessagesPerBatch=30)

    second_run = {row.body: row for row in resumed.rows}
    assert len(second_run) == len(resumed.rows) == 70
    assert sorted(committed + list(second_run)) == sorted(bodies), "a message was lost or read twice after commit"
    seen = Counter(committed + uncommitted + list(second_run))
    duplicates = sorted(body for body, count in seen.items() if count > 1)
    assert duplicates == sorted(uncommitted)
    assert all(second_run[body].redelivered for body in duplicates)
    assert amqp.wait_for_no_consumer(queue) == 0


def test_stopping_mid_stream_and_restarting_loses_nothing(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    bodies = [str(i).encode() for i in range(200)]
    amqp.publish(queue, bodies)
    checkpoint = tmp_path / "checkpoint"

    first = Collector()
    query = collect(read_queue(spark, broker.url, queue, maxMessagesPerBatch=20), first, checkpoint, processingTime="0 seconds")
    try:
        first.wait_for_rows(40)
    finally:
        query.stop()
    assert 40 <= len(first.rows) < len(bodies), "the query was meant to stop mid-stream"
    amqp.wait_for_no_consumer(queue)

    second = Collector()
    run_available_now(spark, broker.url, queue, checkpoint, second, maxMessagesPerBatch=20)

    assert {row.body for row in first.rows + second.rows} == set(bodies)
    first_bodies = {row.body for row in first.rows}
    assert all(row.redelivered for row in second.rows if row.body in first_bodies)
    assert amqp.wait_for_no_consumer(queue) == 0


def test_exchange_and_binding_key_consume_a_private_queue(spark, broker, amqp, unique, tmp_path):
    exchange = f"{unique}-x"
    amqp.channel.exchange_declare(exchange, "topic", auto_delete=True)
    collector = Collector()
    stream = spark.readStream.format("amqp").option("uri", broker.url).option("exchange", exchange).option("bindingKey", "orders.*")
    query = collect(stream.load(), collector, tmp_path / "checkpoint", processingTime="100 milliseconds")

    def routable(key: str) -> bool:
        try:
            amqp.channel.basic_publish(exchange, key, key.encode(), mandatory=True)
        except pika.exceptions.UnroutableError:
            return False
        return True

    try:
        amqp.wait_until(lambda: routable("orders.new"))  # the private queue is bound once the query consumes
        for key in ("orders.paid", "invoices.paid", "orders.shipped"):
            amqp.channel.basic_publish(exchange, key, key.encode())
        collector.wait_for_rows(3)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(row.routing_key for row in collector.rows) == ["orders.new", "orders.paid", "orders.shipped"]
    assert all(row.exchange == exchange for row in collector.rows)


def test_a_missing_queue_fails_the_query_with_the_brokers_reason(spark, broker, unique, tmp_path):
    query = collect(read_queue(spark, broker.url, f"{unique}-missing"), Collector(), tmp_path / "checkpoint", availableNow=True)
    with pytest.raises(StreamingQueryException, match=f"NOT_FOUND - no queue '{unique}-missing' in vhost '/'"):
        query.awaitTermination(BOUNDED_WAIT_SECONDS)


def test_a_lost_broker_connection_fails_the_query(spark, own_broker, unique, tmp_path):
    broker = own_broker()
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(unique, durable=True)
        channel.basic_publish("", unique, b"a")
    collector = Collector()
    query = collect(read_queue(spark, broker.url, unique), collector, tmp_path / "checkpoint", processingTime="100 milliseconds")
    try:
        collector.wait_for_rows(1)
        broker.kill()
        with pytest.raises(StreamingQueryException, match=f"consuming from queue '{unique}' failed: StreamLostError"):
            query.awaitTermination(BOUNDED_WAIT_SECONDS)
    finally:
        query.stop()


def test_deleting_the_consumed_queue_fails_the_query(spark, broker, amqp, unique, tmp_path):
    queue = amqp.declare(unique)
    amqp.publish(queue, [b"a"])
    collector = Collector()
    query = collect(read_queue(spark, broker.url, queue), collector, tmp_path / "checkpoint", processingTime="100 milliseconds")
    try:
        collector.wait_for_rows(1)
        amqp.channel.queue_delete(queue)
        with pytest.raises(StreamingQueryException, match=f"the broker cancelled the consumer of queue '{queue}'"):
            query.awaitTermination(BOUNDED_WAIT_SECONDS)
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'queue' or 'exchange' is required"),
        ({"queue": "q", "prefetch": "many"}, "'prefetch' must be a positive integer, got 'many'"),
        ({"queue": "q", "maxmessagesperbatch": "0"}, "'maxMessagesPerBatch' must be a positive integer, got '0'"),
        ({"queue": "q", "bindingkey": "a.*"}, "'bindingKey' needs option 'exchange'"),
        ({"queue": "q", "bodyencoding": "klingon"}, "'bodyEncoding' names no known text codec: 'klingon'"),
        ({"queue": "q", "bodyencoding": "hex"}, "'bodyEncoding' names no known text codec: 'hex'"),
    ],
)
def test_invalid_source_options_are_reported_clearly(options, message):
    with pytest.raises(AmqpOptionError, match=re.escape(message)):
        SourceOptions.parse({"uri": "amqp://x", **options})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("bodyEncoding", "zlib", "'bodyEncoding' names no known text codec"), ("prefetch", "0", "'prefetch' must be a positive integer")],
)
def test_a_bad_source_option_fails_the_query_naming_it(spark, broker, unique, tmp_path, option, value, message):
    with pytest.raises(Exception, match=message):
        query = collect(read_queue(spark, broker.url, unique, **{option: value}), Collector(), tmp_path / "checkpoint", availableNow=True)
        query.awaitTermination(BOUNDED_WAIT_SECONDS)
