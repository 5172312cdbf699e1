"""The consuming connection of the source: one pika connection owned by a background thread.

A blocking pika connection only services heartbeats while some thread is inside it, so a daemon
thread stays in `start_consuming()` for the connection's whole life. Every other thread talks to it
through `add_callback_threadsafe` and waits on one condition variable, which the consuming thread
notifies when it has something to report (the consumer started, a call finished, awaited deliveries
arrived, or the connection ended), so no wait outlives the connection. Deliveries are buffered in
arrival order and numbered from 1 (their sequence number); delivery tags stay inside this module
because they only mean something on this connection's channel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions

from spark_connector.options import SourceOptions
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
        self._consuming = False  # basic.consume succeeded
        self._closing = False  # the owner gave up on this consumer: the thread must leave
        self._ended = False  # the thread left the connection; `_failure` says why
        self._failure: str | None = None  # why the connection ended, in words
        self._cause: BaseException | None = None  # the exception that ended it, if any
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None  # the consuming BlockingChannel
        self._queue: str | None = None  # name of the consumed queue (server-named for a private one)
        self._initial_ready = 0  # ready messages in the queue just before consuming began
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
            consuming = self._consuming and not self._ended
        if consuming:
            try:
                self._connection.add_callback_threadsafe(self._channel.stop_consuming)
            except pika.exceptions.ConnectionWrongStateError:  # the connection is already gone
                pass
        if self._thread.is_alive():
            self._thread.join(CLOSE_TIMEOUT_SECONDS)

    def _run(self) -> None:
        failure, cause = None, None
        try:
            self._connection = pika.BlockingConnection(pika.URLParameters(self._options.uri))
            self._channel = self._connection.channel()
            self._queue, self._initial_ready = self._declare()
            self._channel.basic_qos(prefetch_count=self._options.prefetch)
            self._channel.basic_consume(self._queue, self._on_message)
            with self._changed:
                if self._closing:
                    return
                self._consuming = True
                self._changed.notify_all()
            self._channel.start_consuming()
            # start_consuming returns once no consumer is left: stopped by `close`, or cancelled by the broker.
            if self._closing:
                failure = "the consumer was closed"
            else:
                failure = f"the broker cancelled the consumer of {self._source_name()} (was it deleted?)"
        except BaseException as error:  # reported on the caller's thread
            cause = error
            if self._consuming:
                failure = f"consuming from {self._source_name()} failed: {error!r}"
            else:
                failure = f"cannot consume from {self._source_name()}: {error!r}"
        finally:
            if self._connection is not None and self._connection.is_open:
                try:
                    self._connection.close()
                except Exception:  # closing a broken connection: nothing more to do
                    pass
            with self._changed:
                self._failure = failure or "the consumer was closed"
                self._cause = cause
                self._ended = True
                self._changed.notify_all()

    def _source_name(self) -> str:
        queue = self._queue or self._options.queue
        return f"queue {queue!r}" if queue else f"a private queue bound to exchange {self._options.exchange!r}"

    def _declare(self) -> tuple[str, int]:
        options = self._options
        channel = self._channel
        if options.exchange is None:
            ok = channel.queue_declare(options.queue, passive=True)
            return options.queue, ok.method.message_count
        if options.queue is None:
            ok = channel.queue_declare("", exclusive=True, auto_delete=True)
        else:
            ok = channel.queue_declare(options.queue, durable=True)
        queue = ok.method.queue
        channel.queue_bind(queue, options.exchange, routing_key=options.binding_key)
        return queue, ok.method.message_count

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
        return self._call(lambda: self._channel.queue_declare(self._queue, passive=True).method.message_count)

    def ack_through(self, sequence: int) -> None:
        """Acknowledge every delivery up to and including `sequence` with one multiple ack."""
        with self._changed:
            count = sequence - self._first_buffered + 1
            if count <= 0:
                return
            tag = self._tags[count - 1]
        self._call(lambda: self._channel.basic_ack(tag, multiple=True))
        with self._changed:
            self._rows.drop(count)
            del self._tags[:count]
            self._first_buffered += count

    def _call(self, function: Callable[[], T]) -> T:
        """Run `function` on the consuming thread and return its result (or raise its error)."""
        self._raise_if_failed()
        outcome: dict[str, Any] = {}  # "result" or "error", then "done"

        def run() -> None:
            try:
                outcome["result"] = function()
            except BaseException as error:  # handed back to the calling thread
                outcome["error"] = error
            with self._changed:
                outcome["done"] = True
                self._changed.notify_all()

        try:
            self._connection.add_callback_threadsafe(run)
        except pika.exceptions.ConnectionWrongStateError:
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
