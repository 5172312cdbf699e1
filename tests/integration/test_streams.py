"""x-queue-type: stream: an append-only log read by offset over AMQP 0-9-1, as RabbitMQ's streams behave (the
reference is RabbitMQ 3.10.8; RabbitMQ 3.13 behaviour Warren follows is marked rabbitmq4, what Warren does beyond
RabbitMQ beyond_rabbitmq)."""

from __future__ import annotations

import datetime
import decimal
import time

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    beyond_rabbitmq, channel_error, connect, connection_error, declare_queue, rabbitmq4, reply_text,
    stay_quiet, wait_until,
)

STREAM = {"x-queue-type": "stream"}


def declare_stream(channel, name: str, **arguments) -> None:
    declare_queue(channel, name, durable=True, arguments={**STREAM, **arguments})


def append(conn, stream: str, bodies, **properties) -> None:
    """Publish with confirms on a channel of its own: the messages are in the stream when this returns."""
    channel = conn.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", stream, body, pika.BasicProperties(**properties))
    channel.close()


def numbered(count: int, start: int = 0) -> list[bytes]:
    return [f"m{n}".encode() for n in range(start, start + count)]


class Reader:
    """A consumer of a stream that records (offset, body, delivery) and acks each delivery unless told not to."""

    def __init__(self, conn, stream: str, offset=None, prefetch: int = 100, ack: bool = True, channel=None):
        self.conn = conn
        self.channel = channel or conn.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.ack = ack
        self.seen: list[tuple[int, bytes]] = []
        self.deliveries = []  # (method, properties, body)
        arguments = {} if offset is None else {"x-stream-offset": offset}
        self.tag = self.channel.basic_consume(stream, self._on_message, arguments=arguments)

    def _on_message(self, channel, method, properties, body) -> None:
        self.seen.append((properties.headers["x-stream-offset"], body))
        self.deliveries.append((method, properties, body))
        if self.ack:
            channel.basic_ack(method.delivery_tag)

    def wait_for(self, count: int) -> list[tuple[int, bytes]]:
        wait_until(self.conn, lambda: len(self.seen) >= count)
        return self.seen

    def offsets(self) -> list[int]:
        return [offset for offset, _ in self.seen]


# --- declaring ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, refused", [
    ({"durable": False}, "non-durable"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": True, "auto_delete": True}, "auto-delete"),
])
def test_a_stream_is_durable_and_neither_exclusive_nor_auto_delete(channel, unique, flags, refused):
    assert channel_error(lambda: channel.queue_declare(unique, arguments=STREAM, **flags)) == (
        406, reply_text(f"PRECONDITION_FAILED - invalid property '{refused}' for queue '{unique}' in vhost '/'"))


def test_a_stream_cannot_be_server_named(channel):
    assert channel_error(lambda: channel.queue_declare("", durable=True, arguments=STREAM)) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue")


@pytest.mark.parametrize("argument, value", [
    ("x-max-length", 10), ("x-message-ttl", 1000), ("x-dead-letter-exchange", "dlx"), ("x-max-priority", 5),
    ("x-expires", 1000), ("x-overflow", "drop-head"), ("x-single-active-consumer", True),
])
def test_arguments_of_other_queue_types_are_refused(channel, unique, argument, value):
    assert channel_error(lambda: declare_stream(channel, unique, **{argument: value})) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{unique}' in vhost '/' of queue type "
             "rabbit_stream_queue")


@pytest.mark.parametrize("value", ["0h", "10", "5x", pytest.param("abc", marks=beyond_rabbitmq)])
def test_a_max_age_needs_a_number_and_a_unit(channel, unique, value):
    """RabbitMQ 3.10 crashes the connection with 541 on an age without digits; Warren refuses it as the others."""
    assert channel_error(lambda: declare_stream(channel, unique, **{"x-max-age": value})) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-max-age' for queue '{unique}' in vhost '/': invalid_max_age")


def test_its_arguments_are_taken(channel, unique):
    declare_stream(channel, unique, **{"x-max-age": "7D", "x-max-length-bytes": 1_000_000,
                                       "x-stream-max-segment-size-bytes": 100_000})
    channel.queue_delete(unique)


# --- reading -----------------------------------------------------------------------------------------------------
def test_every_delivery_carries_its_offset_and_the_message_as_published(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    channel.exchange_declare(unique, "direct")
    channel.queue_bind(unique, unique, "key")
    publisher = conn.channel()
    publisher.confirm_delivery()
    for number in range(3):
        publisher.basic_publish(unique, "key", f"m{number}".encode(), pika.BasicProperties(
            content_type="text/plain", headers={"n": number}, message_id=f"id{number}", delivery_mode=1))
    reader = Reader(conn, unique, "first")
    reader.wait_for(3)
    for offset, (method, properties, body) in enumerate(reader.deliveries):
        assert (method.exchange, method.routing_key, method.redelivered, body) == (
            unique, "key", False, f"m{offset}".encode())
        assert (properties.content_type, properties.message_id, properties.delivery_mode) == (
            "text/plain", f"id{offset}", 1)
        assert properties.headers == {"n": offset, "x-stream-offset": offset}
    channel.queue_delete(unique)
    channel.exchange_delete(unique)


def test_reading_is_non_destructive_and_each_consumer_reads_on_its_own(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(5))
    first, second = Reader(conn, unique, "first"), Reader(conn, unique, "first")
    assert first.wait_for(5) == second.wait_for(5) == list(enumerate(numbered(5)))
    third = Reader(conn, unique, 2)
    assert third.wait_for(3) == list(enumerate(numbered(5)))[2:]
    channel.queue_delete(unique)


@pytest.mark.parametrize("spec, expected", [
    ("first", list(range(10))),
    (0, list(range(10))),
    (7, [7, 8, 9]),
    (-5, list(range(10))),  # a negative offset: from the first
    ("next", []),
])
def test_where_a_consumer_starts(conn, unique, spec, expected):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(10))
    reader = Reader(conn, unique, spec)
    if expected:
        reader.wait_for(len(expected))
    stay_quiet(conn)
    assert reader.offsets() == expected
    append(conn, unique, [b"later"])
    assert reader.wait_for(len(expected) + 1)[-1] == (10, b"later")
    channel.queue_delete(unique)


def test_last_starts_at_the_newest_chunk(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(5))
    stay_quiet(conn)  # written in a batch of their own, before the next one
    append(conn, unique, [b"newest"])
    reader = Reader(conn, unique, "last")
    assert reader.wait_for(1)[0] == (5, b"newest")
    stay_quiet(conn)
    assert reader.offsets() == [5]
    channel.queue_delete(unique)


def test_an_offset_past_the_end_waits_for_it(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(2))
    reader = Reader(conn, unique, 4)
    stay_quiet(conn)
    assert reader.seen == []
    append(conn, unique, numbered(4, 2))
    assert reader.wait_for(2) == [(4, b"m4"), (5, b"m5")]
    channel.queue_delete(unique)


def test_a_timestamp_or_an_interval_starts_at_what_was_written_since(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(3))
    since_the_future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    future, past, interval = (Reader(conn, unique, since_the_future), Reader(conn, unique, datetime.datetime(2000, 1, 1)),
                              Reader(conn, unique, "1h"))
    assert past.wait_for(3) == interval.wait_for(3) == list(enumerate(numbered(3)))
    stay_quiet(conn)
    assert future.seen == []
    channel.queue_delete(unique)


@pytest.mark.parametrize("spec, shown", [
    ("10x", '{longstr,<<"10x">>}'), ("0s", '{longstr,<<"0s">>}'), ("10", '{longstr,<<"10">>}'),
    pytest.param("foo", '{longstr,<<"foo">>}', marks=beyond_rabbitmq),
    pytest.param(decimal.Decimal("1.5"), "{decimal,{1,15}}", marks=beyond_rabbitmq),
    pytest.param(True, "{bool,true}", marks=beyond_rabbitmq),
])
def test_an_offset_that_is_none_of_those_is_refused(channel, unique, spec, shown):
    """RabbitMQ's text for a string that is no interval; RabbitMQ 3.10 crashes the connection with 541 on a string
    without a leading digit and on other types, where Warren gives the same 406."""
    declare_stream(channel, unique)
    channel.basic_qos(prefetch_count=10)
    assert channel_error(lambda: channel.basic_consume(unique, print, arguments={"x-stream-offset": spec})) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{unique}' in vhost '/': "
             f"{{invalid_stream_offset_arg,{shown}}}")
    with connect_again(channel) as other:
        other.channel().queue_delete(unique)


def test_the_offset_argument_is_checked_before_the_prefetch_count(channel, unique):
    declare_stream(channel, unique)
    assert channel_error(lambda: channel.basic_consume(unique, print, arguments={"x-stream-offset": "5x"}))[0] == 406
    fresh_delete(channel, unique)


@pytest.mark.parametrize("argument, value", [
    ("x-priority", 5),
    pytest.param("x-consumer-timeout", 1000, marks=beyond_rabbitmq),  # RabbitMQ 3.10 has no such consume argument
])
def test_consume_arguments_of_other_queue_types_are_refused(channel, unique, argument, value):
    declare_stream(channel, unique)
    channel.basic_qos(prefetch_count=10)
    assert channel_error(lambda: channel.basic_consume(unique, print, arguments={argument: value})) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{unique}' in vhost '/' of queue type "
             "rabbit_stream_queue")
    fresh_delete(channel, unique)


def test_a_classic_queue_refuses_an_offset_to_consume_from(channel, unique):
    declare_queue(channel, unique, exclusive=True)
    assert channel_error(lambda: channel.basic_consume(unique, print, arguments={"x-stream-offset": "first"})) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{unique}' in vhost '/' of queue type "
             "rabbit_classic_queue")


def test_an_offset_header_the_publisher_set_is_replaced(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, [b"m"], headers={"x-stream-offset": 99, "kept": "yes"})
    reader = Reader(conn, unique, "first")
    reader.wait_for(1)
    assert reader.deliveries[0][1].headers == {"kept": "yes", "x-stream-offset": 0}
    channel.queue_delete(unique)


def test_redeclaring_a_stream_with_other_arguments_is_refused(channel, unique):
    declare_stream(channel, unique, **{"x-max-age": "1h"})
    assert channel_error(lambda: declare_stream(channel, unique, **{"x-max-age": "2h"})) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue '{unique}' in vhost '/': received '2h' "
             "but current is '1h'")
    fresh_delete(channel, unique)


def test_delete_ok_counts_no_message_of_a_stream(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(3))
    assert channel.queue_delete(unique).method.message_count == 0


def connect_again(channel):
    return pika.BlockingConnection(channel.connection._impl.params)


def test_a_message_ttl_does_not_apply(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, [b"short-lived"], expiration="1")
    time.sleep(0.05)  # past its TTL: a classic queue would have dropped it
    assert Reader(conn, unique, "first").wait_for(1) == [(0, b"short-lived")]
    channel.queue_delete(unique)


# --- what consuming needs, and what a stream refuses -------------------------------------------------------------
def test_consuming_needs_a_prefetch_count(channel, unique):
    declare_stream(channel, unique)
    assert channel_error(lambda: channel.basic_consume(unique, print)) == (
        406, f"PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '{unique}' in vhost '/''")
    fresh_delete(channel, unique)


def test_consuming_needs_manual_acks(broker, unique):
    with connect(broker) as conn:
        channel = conn.channel()
        declare_stream(channel, unique)
        channel.basic_qos(prefetch_count=10)
        assert connection_error(lambda: channel.basic_consume(unique, print, auto_ack=True), conn) == (
            540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue '{unique}' in vhost "
                 "'/'")
    with connect(broker) as conn:
        conn.channel().queue_delete(unique)


def test_consuming_under_a_global_prefetch_is_refused(broker, unique):
    with connect(broker) as conn:
        channel = conn.channel()
        declare_stream(channel, unique)
        channel.basic_qos(prefetch_count=10)
        channel.basic_qos(prefetch_count=10, global_qos=True)
        assert connection_error(lambda: channel.basic_consume(unique, print), conn) == (
            540, f"NOT_IMPLEMENTED - queue '{unique}' in vhost '/' does not support global qos")
    with connect(broker) as conn:
        conn.channel().queue_delete(unique)


def test_basic_get_and_purge_are_refused(broker, unique):
    with connect(broker) as conn:
        declare_stream(conn.channel(), unique)
        assert connection_error(lambda: conn.channel().basic_get(unique), conn) == (
            540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{unique}' in vhost '/'")
    with connect(broker) as conn:
        assert connection_error(lambda: conn.channel().queue_purge(unique), conn) == (
            540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{unique}' in vhost '/'")
    with connect(broker) as conn:
        conn.channel().queue_delete(unique)


def fresh_delete(channel, stream: str) -> None:
    with connect_again(channel) as other:
        other.channel().queue_delete(stream)


def test_acks_only_give_prefetch_credit_back(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(5))
    reader = Reader(conn, unique, "first", prefetch=2, ack=False)
    reader.wait_for(2)
    stay_quiet(conn)
    assert reader.offsets() == [0, 1]
    reader.channel.basic_ack(reader.deliveries[1][0].delivery_tag, multiple=True)
    reader.wait_for(4)
    stay_quiet(conn)
    assert reader.offsets() == [0, 1, 2, 3]
    assert Reader(conn, unique, "first").wait_for(5) == list(enumerate(numbered(5)))  # nothing left the stream
    channel.queue_delete(unique)


@rabbitmq4
def test_nack_and_reject_settle_like_an_ack(conn, unique):
    """RabbitMQ 3.13+: pika rejects deliveries still in flight when it cancels, so 3.10's 540 would close a
    stopping consumer's connection."""
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(4))
    reader = Reader(conn, unique, "first", prefetch=1, ack=False)
    reader.wait_for(1)
    reader.channel.basic_nack(reader.deliveries[0][0].delivery_tag, requeue=True)
    reader.wait_for(2)
    reader.channel.basic_reject(reader.deliveries[1][0].delivery_tag, requeue=False)
    reader.wait_for(3)
    reader.channel.basic_nack(reader.deliveries[2][0].delivery_tag, requeue=False)
    reader.wait_for(4)
    stay_quiet(conn)
    assert reader.offsets() == [0, 1, 2, 3]
    assert not any(method.redelivered for method, _, _ in reader.deliveries)
    channel.queue_delete(unique)


def test_deleting_a_stream_cancels_its_consumers(conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    reader_channel = conn.channel()
    reader_channel.basic_qos(prefetch_count=10)
    cancelled = []
    reader_channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = reader_channel.basic_consume(unique, print)
    channel.queue_delete(unique)
    wait_until(conn, lambda: cancelled == [tag])


@beyond_rabbitmq
def test_deleting_a_stream_in_use_with_if_unused_is_refused(conn, unique):
    """RabbitMQ 3.10 deletes a stream whatever if-unused says; Warren honours it as for any queue."""
    channel = conn.channel()
    declare_stream(channel, unique)
    Reader(conn, unique)
    assert channel_error(lambda: channel.queue_delete(unique, if_unused=True)) == (
        406, f"PRECONDITION_FAILED - queue '{unique}' in vhost '/' in use")
    conn.channel().queue_delete(unique)


# --- retention and durability ------------------------------------------------------------------------------------
def read_after_retention(conn, stream: str) -> Reader:
    """200 messages appended 20 at a time to a stream of 1,000-byte segments limited to 5,000 bytes, then read from
    offset 0 up to the last one."""
    declare_stream(conn.channel(), stream, **{"x-max-length-bytes": 5000, "x-stream-max-segment-size-bytes": 1000})
    for start in range(0, 200, 20):
        append(conn, stream, numbered(20, start))
    reader = Reader(conn, stream, 0)
    wait_until(conn, lambda: reader.seen and reader.seen[-1][1] == b"m199")
    return reader


def test_retention_drops_the_oldest_segments_and_readers_start_at_the_first_kept(conn, unique):
    reader = read_after_retention(conn, unique)
    offsets = reader.offsets()
    kept = [body for _, body in reader.seen]
    assert offsets[0] > 0 and len(kept) < 200  # the head went
    assert kept == numbered(len(kept), 200 - len(kept))  # the newest ones are kept, in order
    assert offsets == sorted(set(offsets))  # offsets only grow (RabbitMQ leaves gaps between segments)
    conn.channel().queue_delete(unique)


@beyond_rabbitmq
def test_retention_keeps_offsets_without_gaps(conn, unique):
    reader = read_after_retention(conn, unique)
    offsets = reader.offsets()
    assert offsets == list(range(offsets[0], 200))
    assert [body for _, body in reader.seen] == numbered(200 - offsets[0], offsets[0])  # never renumbered
    conn.channel().queue_delete(unique)


@beyond_rabbitmq
def test_a_stream_and_its_offsets_survive_a_restart_and_a_crash(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        declare_stream(conn.channel(), "events")
        append(conn, "events", numbered(100))
    broker.restart()
    with connect(broker) as conn:
        append(conn, "events", numbered(50, 100))
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        reader = Reader(conn, "events", "first")
        assert reader.wait_for(150) == list(enumerate(numbered(150)))
        assert conn.channel().queue_declare("events", passive=True).method.message_count == 150


@beyond_rabbitmq
def test_a_declared_stream_exists_after_a_crash_right_after_declare_ok(own_broker):
    """RabbitMQ 3.10 has a window after declare-ok in which a crash loses the stream; Warren writes it first."""
    broker = own_broker()
    with connect(broker) as conn:
        declare_stream(conn.channel(), "fresh")
    broker.kill()
    broker.start()
    with connect(broker) as conn:
        assert conn.channel().queue_declare("fresh", passive=True).method.message_count == 0
    shown = management.request(broker, "GET", "/api/queues/%2F/fresh").body
    assert shown["type"] == "stream"


def test_the_management_api_shows_a_stream(broker, conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(3))
    shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
    assert (shown["type"], shown["durable"], shown["arguments"]) == ("stream", True, STREAM)
    channel.queue_delete(unique)


@beyond_rabbitmq
def test_the_management_api_counts_a_streams_messages_at_once(broker, conn, unique):
    """RabbitMQ shows them once its metrics are next collected (seconds later); Warren at once."""
    channel = conn.channel()
    declare_stream(channel, unique)
    append(conn, unique, numbered(3))
    shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
    assert (shown["messages"], shown["committed_offset"], shown["first_offset"]) == (3, 2, 0)
    assert channel.queue_declare(unique, passive=True).method.message_count == 3


@beyond_rabbitmq
def test_the_management_api_shows_the_first_offset_retention_kept(broker, conn, unique):
    channel = conn.channel()
    declare_stream(channel, unique, **{"x-max-length-bytes": 2000, "x-stream-max-segment-size-bytes": 500})
    for start in range(0, 100, 10):
        append(conn, unique, numbered(10, start))
    shown = management.request(broker, "GET", f"/api/queues/%2F/{unique}").body
    assert 0 < shown["first_offset"] <= shown["committed_offset"] == 99
    assert shown["messages"] == 100 - shown["first_offset"]
    channel.queue_delete(unique)


def test_a_segment_size_above_three_gigabytes_is_refused(channel, unique):
    assert channel_error(lambda: declare_stream(channel, unique, **{"x-stream-max-segment-size-bytes": 3_000_000_001})) == (
        406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes")


@beyond_rabbitmq
def test_reading_a_large_stream_from_the_start_does_not_load_it_into_memory(own_broker):
    """200,000 messages of 1 KiB (200 MB), the broker restarted so none is in memory, read from `first` with
    prefetch 1000: the broker's resident memory grows by less than 50 MB (it reads a chunk at a time and keeps at
    most 8 MiB of them decoded)."""
    from warrenperf.process_memory import resident_kib

    broker = own_broker()
    count, body = 200_000, b"x" * 1024
    with connect(broker) as conn:
        channel = conn.channel()
        declare_stream(channel, "big")
        for _ in range(count):
            channel.basic_publish("", "big", body)
        wait_until(conn, lambda: channel.queue_declare("big", passive=True).method.message_count == count, 60)
    broker.restart()
    with connect(broker) as conn:
        channel = conn.channel()
        before = resident_kib(broker.process.pid)
        received = 0

        def on_message(ch, method, properties, _body):
            nonlocal received
            received += 1
            if received % 500 == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)

        channel.basic_qos(prefetch_count=1000)
        channel.basic_consume("big", on_message, arguments={"x-stream-offset": "first"})
        wait_until(conn, lambda: received == count, 120)
        growth_mib = (resident_kib(broker.process.pid) - before) / 1024
    assert growth_mib < 50, f"resident memory grew by {growth_mib:.0f} MiB"
