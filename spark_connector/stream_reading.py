"""Reading a stream queue over AMQP 0-9-1 with pika: the tail follower the driver keeps, the probes that turn
"earliest" or a timestamp into an offset, and the range read an executor task makes.

A stream is read with basic.consume and the argument x-stream-offset; every delivery carries its offset in the
header of that name. Reading never removes anything, so a range read twice yields the same messages in the same
order, as long as retention has not dropped them. Offsets may have gaps (RabbitMQ leaves some between segments):
they are bounds, never counts.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pyarrow as pa

from spark_connector.client import CONNECT_TIMEOUT_SECONDS
from spark_connector.schema import ARROW_BATCH_ROWS, OFFSET_HEADER, StreamRows

log = logging.getLogger(__name__)

FIRST_DELIVERY_SECONDS = 2.0  # how long a probe waits for a first delivery before it takes the stream as empty
READ_TIMEOUT_SECONDS = 60.0  # a task that receives nothing for this long fails (and Spark retries it)
POLL_SECONDS = 0.2  # the tail follower's turn on its connection
QUIET_SECONDS = 0.25  # deliveries paused this long: the tail follower has read the newest chunk
CATCH_UP_SECONDS = 5.0  # the most the tail follower waits for that at start


class StreamReadError(RuntimeError):
    """A stream cannot be read as asked: gone, unreachable, or its data lost to retention."""


def _parameters(uri: str, name: str) -> pika.URLParameters:
    """A connection's parameters, naming it (the management API shows it as the client-provided name)."""
    parameters = pika.URLParameters(uri)
    parameters.client_properties = {"connection_name": name}
    return parameters


def _close(connection: pika.BlockingConnection) -> None:
    """Close without caring how the broker takes it: pika rejects deliveries still in its buffer on the way out,
    which RabbitMQ 3.10 answers by closing the connection (540)."""
    try:
        if connection.is_open:
            connection.close()
    except Exception:  # the connection is going either way
        pass


def _offset_of(properties: pika.BasicProperties) -> int:
    headers = properties.headers or {}
    if OFFSET_HEADER not in headers:
        raise StreamReadError(f"a delivery carries no {OFFSET_HEADER} header: is the queue a stream?")
    return int(headers[OFFSET_HEADER])


def probe_offset(uri: str, stream: str, spec: Any, timeout: float = FIRST_DELIVERY_SECONDS) -> int | None:
    """The offset of the first message a consumer starting at spec ('first', a timestamp...) receives, or None if
    none arrives within timeout."""
    first: list[int] = []

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if not first:
            first.append(_offset_of(properties))

    consumer = _StreamConsumer(uri, f"spark amqp source: probe of stream {stream} at {spec}", stream, spec, 1,
                               on_message, lambda: bool(first))
    try:
        consumer.open()
        consumer.run(timeout)
        consumer.settle()  # RabbitMQ sends a whole chunk, prefetch 1 or not
        return first[0] if first else None
    finally:
        consumer.close()


def timestamp_spec(milliseconds: int) -> datetime.datetime:
    """An AMQP timestamp for x-stream-offset (seconds: a start time is rounded down to the second)."""
    return datetime.datetime.fromtimestamp(milliseconds // 1000, datetime.timezone.utc)


class TailFollower:
    """Follows the end of a stream on a thread of its own, to know the offset after the newest message (what a
    micro-batch may read up to). It consumes from the newest chunk on, acknowledging as it goes."""

    def __init__(self, uri: str, stream: str, prefetch: int) -> None:
        self._uri = uri
        self.stream = stream
        self._prefetch = prefetch
        self._changed = threading.Condition()  # guards the fields below
        self._next_offset = 0  # one past the newest offset seen
        self._seen = False  # a delivery arrived
        self._started = False
        self._failure: str | None = None  # why following stopped
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="amqp-stream-tail", daemon=True)

    def start(self) -> None:
        """Connect and follow; returns once the newest chunk was read (deliveries paused for QUIET_SECONDS, or
        CATCH_UP_SECONDS passed while a publisher keeps appending), or the stream was found empty."""
        self._thread.start()
        with self._changed:
            if not self._changed.wait_for(lambda: self._started or self._failure, CONNECT_TIMEOUT_SECONDS):
                self._closing = True
                raise StreamReadError(f"amqp source: not following stream {self.stream!r} after "
                                      f"{CONNECT_TIMEOUT_SECONDS}s")
            if self._changed.wait_for(lambda: self._seen or self._failure, FIRST_DELIVERY_SECONDS):
                deadline = time.monotonic() + CATCH_UP_SECONDS
                while self._failure is None and time.monotonic() < deadline:
                    seen = self._next_offset
                    self._changed.wait(QUIET_SECONDS)
                    if self._next_offset == seen:
                        break
        self._raise_if_failed()

    def next_offset(self) -> int:
        """One past the newest offset the stream holds (as far as seen)."""
        self._raise_if_failed()
        with self._changed:
            return self._next_offset

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise StreamReadError(f"amqp source: {self._failure}")

    def close(self) -> None:
        self._closing = True
        if self._thread.is_alive():
            self._thread.join(CONNECT_TIMEOUT_SECONDS)

    def _run(self) -> None:
        connection = None
        failure = "the tail follower was closed"
        try:
            connection = pika.BlockingConnection(
                _parameters(self._uri, f"spark amqp source: tail of stream {self.stream}"))
            channel = connection.channel()
            channel.queue_declare(self.stream, passive=True)
            channel.basic_qos(prefetch_count=self._prefetch)
            channel.add_on_cancel_callback(lambda _frame: self._fail(
                f"the broker cancelled the consumer of stream {self.stream!r} (was it deleted?)"))
            channel.basic_consume(self.stream, self._on_message, arguments={"x-stream-offset": "last"})
            with self._changed:
                self._started = True
                self._changed.notify_all()
            while not self._closing and self._failure is None:
                connection.process_data_events(time_limit=POLL_SECONDS)
        except pika.exceptions.ChannelClosedByBroker as error:
            failure = f"cannot follow stream {self.stream!r}: {error.reply_text}"
        except BaseException as error:  # reported to the driver at its next call
            failure = f"following stream {self.stream!r} failed: {error!r}"
        finally:
            if connection is not None:
                _close(connection)
            if not self._closing:
                self._fail(failure)

    def _on_message(self, channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        offset = _offset_of(properties)
        with self._changed:
            self._next_offset = max(self._next_offset, offset + 1)
            self._seen = True
            self._changed.notify_all()
        if method.delivery_tag % max(1, self._prefetch // 2) == 0:  # credit back for the next deliveries
            channel.basic_ack(method.delivery_tag, multiple=True)

    def _fail(self, reason: str) -> None:
        with self._changed:
            if self._failure is None:
                self._failure = reason
            self._changed.notify_all()


def read_range(uri: str, stream: str, low: int, high: int, prefetch: int, fail_on_data_loss: bool,
               deadline_seconds: float = READ_TIMEOUT_SECONDS) -> Iterator[pa.RecordBatch]:
    """Rows of the messages with offsets in [low, high), in offset order, ARROW_BATCH_ROWS at a time. The range was
    planned below the tail, so a message at or past high - 1 exists (or retention dropped it): reading stops there.
    A first message above low is a loss when retention dropped low (the stream's first offset is above it); else a
    gap.

    Credit is given back so that the broker sends little past high - 1: the window is at most the range, and an
    ack through offset o is sent only while o + window stays below high. What still comes (RabbitMQ sends whole
    chunks, and its offsets have gaps) is taken without an ack before the task leaves, so closing rejects nothing
    (RabbitMQ 3.10 answers a basic.reject on a stream with 540)."""
    window = max(1, min(prefetch, high - low))
    reading = _RangeReading(uri, stream, low, high, window, fail_on_data_loss)
    consumer = _StreamConsumer(uri, f"spark amqp source: stream {stream} offsets [{low}, {high})", stream, low,
                               window, reading.on_message,
                               lambda: reading.done or len(reading.rows) >= ARROW_BATCH_ROWS)
    try:
        consumer.open()  # (deliveries may come with the consumer's start)
        heard_at, received = time.monotonic(), 0
        while True:
            if reading.failure is not None:
                raise reading.failure
            if len(reading.rows) >= ARROW_BATCH_ROWS:
                yield reading.rows.take()
            if reading.done:
                break
            if reading.received != received:
                heard_at, received = time.monotonic(), reading.received
            elif time.monotonic() - heard_at > deadline_seconds:
                raise StreamReadError(f"stream {stream!r}: nothing received for {deadline_seconds:.0f}s while "
                                      f"reading offsets {low} to {high - 1}")
            consumer.run(POLL_SECONDS)  # (returns once a batch of rows is read, or the range)
        consumer.settle()
        if reading.rows:
            yield reading.rows.take()
    except StreamReadError:
        try:  # leaving on data loss (or a stall): no reject either
            consumer.settle()
        except (pika.exceptions.AMQPError, StreamReadError):  # the connection went meanwhile: nothing to reject
            pass
        raise
    finally:
        consumer.close()


class _StreamConsumer:
    """A consumer of a stream from an offset spec, on pika's SelectConnection (whose callbacks cost a delivery less
    than the blocking adapter's event queue), its I/O loop run in turns by the caller: between turns a task hands
    Spark its rows. The broker closing the channel (a stream that does not exist, say) is a StreamReadError."""

    def __init__(self, uri: str, name: str, stream: str, spec: Any, window: int,
                 on_message: Callable[[Any, Any, Any, bytes], None], enough: Callable[[], bool]) -> None:
        self.stream = stream
        self.spec = spec  # x-stream-offset: where consuming starts
        self.window = window  # basic.qos prefetch count
        self.on_message = on_message
        self.enough = enough  # after a delivery: whether a turn of run() may end
        self.delivered = 0  # deliveries so far
        self.answered = False  # the latest basic.consume or basic.qos was answered
        self.failure: BaseException | None = None  # what closed the channel or the connection, if not this end
        self.until: Callable[[], bool] = lambda: False  # when the current turn of the loop ends
        self.channel: Any = None
        self.connection = pika.SelectConnection(_parameters(uri, name), on_open_callback=self._opened,
                                                on_open_error_callback=self._ended, on_close_callback=self._ended)

    def open(self) -> None:
        """Connect and consume."""
        self._turn(CONNECT_TIMEOUT_SECONDS, lambda: self.answered)
        self._raise_if_failed()
        if not self.answered:
            raise StreamReadError(f"stream {self.stream!r}: not consuming after {CONNECT_TIMEOUT_SECONDS:.0f}s")

    def run(self, seconds: float) -> None:
        """Take deliveries for at most `seconds`, or until `enough` holds."""
        self._turn(seconds, self.enough)
        self._raise_if_failed()

    def settle(self) -> None:
        """Take the deliveries still on their way (their credit was given before the caller was done), so that none
        is left for pika to reject when the channel closes. A basic.qos round trip is the barrier: the broker
        answers it after every delivery it sent before (RabbitMQ sends a chunk whole, at once), and the credit
        given ends with what was asked for, so nothing more is sent. Asking again for the same prefetch changes
        nothing of the consumer's."""
        while True:
            delivered, self.answered = self.delivered, False
            self.channel.basic_qos(prefetch_count=self.window, callback=self._answer)
            self._turn(CONNECT_TIMEOUT_SECONDS, lambda: self.answered)
            self._raise_if_failed()
            if not self.answered:
                raise StreamReadError(f"stream {self.stream!r}: basic.qos unanswered after "
                                      f"{CONNECT_TIMEOUT_SECONDS:.0f}s")
            if self.delivered == delivered:
                return

    def close(self) -> None:
        """Close the connection and its I/O loop (pika rejects nothing: settle took what had come)."""
        connection = self.connection
        if not (connection.is_closing or connection.is_closed):
            connection.close()
        self._turn(CONNECT_TIMEOUT_SECONDS, lambda: connection.is_closed)
        connection.ioloop.close()

    def _turn(self, seconds: float, until: Callable[[], bool]) -> None:
        """Run the I/O loop until `until` holds after a callback, the connection ended, or `seconds` passed."""
        if until() or self.connection.is_closed:
            return
        self.until = until
        loop = self.connection.ioloop
        timer = loop.call_later(seconds, loop.stop)
        try:
            loop.start()
        finally:
            loop.remove_timeout(timer)

    def _raise_if_failed(self) -> None:
        if isinstance(self.failure, pika.exceptions.ChannelClosedByBroker):
            raise StreamReadError(f"cannot read stream {self.stream!r}: {self.failure.reply_text}") from self.failure
        if self.failure is not None:
            raise self.failure

    # -- callbacks, on the I/O loop ------------------------------------------------------------------

    def _opened(self, connection: Any) -> None:
        connection.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._ended)
        channel.basic_qos(prefetch_count=self.window, callback=lambda _: channel.basic_consume(
            self.stream, self._delivery, arguments={"x-stream-offset": self.spec}, callback=self._answer))

    def _answer(self, _frame: Any) -> None:
        self.answered = True
        self._stop_if_done()

    def _delivery(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self.delivered += 1
        self.on_message(channel, method, properties, body)
        self._stop_if_done()

    def _stop_if_done(self) -> None:
        if self.until():
            self.connection.ioloop.stop()

    def _ended(self, _source: Any, reason: BaseException) -> None:
        """The channel or the connection closed (or the connection could not open)."""
        by_this_end = (pika.exceptions.ConnectionClosedByClient, pika.exceptions.ChannelClosedByClient)
        if self.failure is None and not isinstance(reason, by_this_end):
            self.failure = reason
        if self.connection.is_open:
            self.connection.close()
        if self.connection.is_closed:
            self.connection.ioloop.stop()


class _RangeReading:
    """What read_range's consumer callback keeps: the rows read, the credit owed, and whether the range is done."""

    def __init__(self, uri: str, stream: str, low: int, high: int, window: int, fail_on_data_loss: bool) -> None:
        self.uri = uri
        self.stream = stream
        self.low = low
        self.high = high
        self.window = window
        self.fail_on_data_loss = fail_on_data_loss
        self.rows = StreamRows(stream)
        self.received = 0  # deliveries so far, those past the range included
        self.unacked = 0  # deliveries since the last ack
        self.done = False  # the range is read (what comes after is taken and dropped)
        self.failure: StreamReadError | None = None  # raised by read_range once the callback returns

    def on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self.received += 1
        if self.done:
            return
        try:
            offset = _offset_of(properties)
            if self.received == 1 and offset > self.low:
                _check_loss(self.uri, self.stream, self.low, offset, self.fail_on_data_loss)
        except StreamReadError as error:
            self.failure = error
            self.done = True
            return
        high, window = self.high, self.window
        if offset >= high:
            self.done = True
            return
        if offset >= self.low:
            self.rows.add(offset, method, properties, body)
        if offset >= high - 1:
            self.done = True
            return
        self.unacked += 1
        # near the end, credit goes back message by message: the last ack allowed must not be skipped
        if offset + window < high and (self.unacked >= window // 2 or offset + window + window // 2 >= high):
            channel.basic_ack(method.delivery_tag, multiple=True)
            self.unacked = 0


def _check_loss(uri: str, stream: str, low: int, delivered: int, fail_on_data_loss: bool) -> None:
    available = probe_offset(uri, stream, "first")
    if available is None or available <= low:
        return  # the offsets between low and what came first do not exist (a gap), nothing was lost
    lost = min(available, delivered) - low
    message = (f"stream {stream!r}: offsets {low} to {min(available, delivered) - 1} are gone (retention dropped "
               f"them before they were read): expected offset {low}, the first available is {available}")
    if fail_on_data_loss:
        raise StreamReadError(message + " (set failOnDataLoss to false to go on without them)")
    log.warning("%s: %d offsets lost, going on (failOnDataLoss is false)", message, lost)
