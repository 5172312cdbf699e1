"""The consuming connection of the source: one pika connection owned by a background thread.

A daemon thread runs the connection's I/O loop (pika's SelectConnection, whose callbacks cost a delivery less than
the blocking adapter's event queue) for the connection's whole life: it connects, declares, consumes and keeps
heartbeats going. Every other thread hands it work through `add_callback_threadsafe` and waits on one condition
variable, which the consuming thread notifies when it has something to report (the consumer started, a call
finished, awaited deliveries arrived, or the connection ended), so no wait outlives the connection. Deliveries are
buffered in arrival order and numbered from 1 (their sequence number); delivery tags stay inside this module because
they only mean something on this connection's channel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions

from spark_connector.options import SourceOptions, consumer_windows
from spark_connector.schema import QueueRows

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 30.0
CLOSE_TIMEOUT_SECONDS = 5.0


class ConsumerFailed(RuntimeError):
    """The consuming connection ended; the broker requeues its unacknowledged messages."""


class BackgroundConsumer:
    """Consumes one queue on a thread of its own and acknowledges on request, cumulatively."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._changed = threading.Condition()  # guards every field below; notified when the thread reports
        self._rows = QueueRows()  # the unacknowledged deliveries, in arrival order
        self._tags: list[int] = []  # their delivery tags, in the same order
        self._first_buffered = 1  # sequence number of the first unacknowledged delivery
        self._received = 0  # deliveries received so far (= sequence number of the latest)
        self._wanted: int | None = None  # `_received` value a waiter is blocked for (deliveries notify only then)
        self._consuming = False  # every basic.consume succeeded
        self._closing = False  # the owner gave up on this consumer: the thread must leave
        self._ended = False  # the thread left the connection; `_failure` says why
        self._failure: str | None = None  # why the connection ended, in words (the first reason wins)
        self._cause: BaseException | None = None  # the exception that ended it, if any
        self._connection: pika.SelectConnection | None = None
        self._channel: Any = None  # the consuming channel
        self._queue: str | None = None  # name of the consumed queue (server-named for a private one)
        self._initial_ready = 0  # ready messages in the queue just before consuming began
        self._consumers, self._per_consumer = consumer_windows(options.prefetch)  # consumers, the prefetch of each
        self._thread = threading.Thread(target=self._run, name="amqp-source-consumer", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        """Connect and start consuming; return how many messages were ready in the queue just before."""
        self._thread.start()
        with self._changed:
            if not self._changed.wait_for(lambda: self._consuming or self._ended, CONNECT_TIMEOUT_SECONDS):
                self._closing = True  # should the connection come up later, the thread closes it at once
                raise ConsumerFailed(f"amqp source: not consuming after {CONNECT_TIMEOUT_SECONDS}s")
        self._raise_if_failed()
        return self._initial_ready

    def close(self) -> None:
        """Close the connection (unacknowledged messages are requeued by the broker) and end the thread."""
        with self._changed:
            self._closing = True
            running = self._connection is not None and not self._ended
        if running:
            try:
                self._connection.ioloop.add_callback_threadsafe(self._close_connection)
            except Exception:  # the loop is already gone: the thread is leaving by itself
                pass
        if self._thread.is_alive():
            self._thread.join(CLOSE_TIMEOUT_SECONDS)

    def _run(self) -> None:
        try:
            self._connection = pika.SelectConnection(
                pika.URLParameters(self._options.uri), on_open_callback=self._on_open,
                on_open_error_callback=self._on_open_error, on_close_callback=self._on_connection_closed)
            self._connection.ioloop.start()  # until _on_connection_closed stops it
        except BaseException as error:  # reported on the caller's thread
            self._fail(error)
        finally:
            if self._connection is not None:
                self._connection.ioloop.close()  # (its poller's and wake-up's file descriptors)
            with self._changed:
                self._failure = self._failure or "the consumer was closed"
                self._ended = True
                self._changed.notify_all()

    def _fail(self, error: BaseException | None, failure: str | None = None) -> None:
        """Record why the connection ends (the first reason stands) and close it."""
        with self._changed:
            if self._failure is None:
                if failure is None and self._closing:
                    failure = "the consumer was closed"
                elif failure is None:
                    what = f"consuming from {self._source_name()} failed" if self._consuming else \
                        f"cannot consume from {self._source_name()}"
                    failure = f"{what}: {error!r}"
                self._failure, self._cause = failure, error
        self._close_connection()

    def _close_connection(self) -> None:
        connection = self._connection
        if connection is not None and not (connection.is_closing or connection.is_closed):
            connection.close()

    # -- the consuming thread's callbacks, in the order they come --------------------------------

    def _on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: pika.SelectConnection, error: BaseException) -> None:
        self._fail(error)
        connection.ioloop.stop()

    def _on_connection_closed(self, connection: pika.SelectConnection, reason: BaseException) -> None:
        self._fail(reason)
        connection.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(lambda _, reason: self._fail(reason))
        channel.add_on_cancel_callback(lambda _: self._fail(None, f"the broker cancelled the consumer of "
                                                                  f"{self._source_name()} (was it deleted?)"))
        options = self._options
        if options.exchange is None:
            channel.queue_declare(options.queue, passive=True,
                                  callback=lambda ok: self._on_declared(options.queue, ok.method.message_count))
        elif options.queue is None:
            channel.queue_declare("", exclusive=True, auto_delete=True, callback=self._on_declared_to_bind)
        else:
            channel.queue_declare(options.queue, durable=True, callback=self._on_declared_to_bind)

    def _on_declared_to_bind(self, ok: Any) -> None:
        queue, ready = ok.method.queue, ok.method.message_count
        self._channel.queue_bind(queue, self._options.exchange, routing_key=self._options.binding_key,
                                 callback=lambda _: self._on_declared(queue, ready))

    def _on_declared(self, queue: str, ready: int) -> None:
        self._queue, self._initial_ready = queue, ready
        self._channel.basic_qos(prefetch_count=self._per_consumer, callback=lambda _: self._consume())

    def _consume(self) -> None:
        started = []

        def on_consume_ok(_: Any) -> None:
            started.append(True)
            if len(started) < self._consumers:
                return
            with self._changed:
                self._consuming = True
                self._changed.notify_all()
                closing = self._closing
            if closing:
                self._close_connection()

        for _ in range(self._consumers):
            self._channel.basic_consume(self._queue, self._on_message, callback=on_consume_ok)

    def _source_name(self) -> str:
        queue = self._queue or self._options.queue
        return f"queue {queue!r}" if queue else f"a private queue bound to exchange {self._options.exchange!r}"

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        with self._changed:
            self._rows.add(method, properties, body)
            self._tags.append(method.delivery_tag)
            self._received += 1
            if self._wanted is not None and self._received >= self._wanted:
                self._changed.notify_all()

    # -- queries from the driver thread ------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._ended:
            raise ConsumerFailed(f"amqp source: {self._failure}") from self._cause

    @property
    def received(self) -> int:
        """Sequence number of the latest delivery (0 before the first)."""
        self._raise_if_failed()
        return self._received

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until `count` deliveries were received in all; False on timeout."""
        with self._changed:
            self._wanted = count
            self._changed.wait_for(lambda: self._received >= count or self._ended, timeout)
            self._wanted = None
        self._raise_if_failed()
        return self._received >= count

    def rows(self, after: int, through: int, encoding: str | None) -> bytes:
        """The deliveries numbered after+1 .. through (all must still be unacknowledged) as an Arrow IPC stream of
        the source's rows (QueueRows.arrow_stream)."""
        with self._changed:
            start = after + 1 - self._first_buffered
            if start < 0:
                raise AssertionError(f"deliveries after {after} were already acknowledged")
            taken = self._rows.copy(start, start + through - after)
        return taken.arrow_stream(encoding)

    def ready_count(self) -> int:
        """Messages ready in the consumed queue now (asked on the consuming channel)."""
        return self._call(lambda done: self._channel.queue_declare(
            self._queue, passive=True, callback=lambda ok: done(ok.method.message_count)))

    def ack_through(self, sequence: int) -> None:
        """Acknowledge every delivery up to and including `sequence` with one multiple ack."""
        with self._changed:
            count = sequence - self._first_buffered + 1
            if count <= 0:
                return
            tag = self._tags[count - 1]
        self._call(lambda done: done(self._channel.basic_ack(tag, multiple=True)))
        with self._changed:
            self._rows.drop(count)
            del self._tags[:count]
            self._first_buffered += count

    def _call(self, start: Callable[[Callable[[T], None]], None]) -> T:
        """Run `start` on the consuming thread, which calls the `done` it is given with the result; return that
        result (or raise the error `start` raised, or the connection's end)."""
        self._raise_if_failed()
        outcome: dict[str, Any] = {}  # "result" or "error", then "done"

        def done(result: T) -> None:
            with self._changed:
                outcome["result"] = result
                outcome["done"] = True
                self._changed.notify_all()

        def run() -> None:
            try:
                start(done)
            except BaseException as error:  # handed back to the calling thread
                with self._changed:
                    outcome["error"] = error
                    outcome["done"] = True
                    self._changed.notify_all()

        try:
            self._connection.ioloop.add_callback_threadsafe(run)
        except Exception:  # the loop is gone: the connection ended
            self._raise_if_failed()
            raise
        with self._changed:
            answered = self._changed.wait_for(lambda: "done" in outcome or self._ended, CALL_TIMEOUT_SECONDS)
        if not answered:
            raise ConsumerFailed(f"amqp source: broker call unanswered after {CALL_TIMEOUT_SECONDS}s")
        if "done" not in outcome:
            self._raise_if_failed()
        if "error" in outcome:
            raise ConsumerFailed(f"amqp source: broker call failed: {outcome['error']!r}") from outcome["error"]
        return outcome["result"]
