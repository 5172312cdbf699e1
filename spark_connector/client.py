"""The consuming connection of the source: one pika connection owned by a background thread.

A blocking pika connection only services heartbeats while some thread is inside it, so a daemon
thread stays in `start_consuming()` for the connection's whole life. Every other thread talks to it
through `add_callback_threadsafe`. Deliveries are buffered in arrival order and numbered from 1
(their sequence number); delivery tags stay inside this module because they only mean something on
this connection's channel.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any, TypeVar

import pika
import pika.exceptions

from spark_connector.options import SourceOptions
from spark_connector.schema import delivery_to_row

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 30.0
CLOSE_TIMEOUT_SECONDS = 5.0


class AmqpConnectionLost(RuntimeError):
    """The consuming connection failed; its unacknowledged messages go back to the queue."""


class BackgroundConsumer:
    """Consumes one queue on a thread of its own and acknowledges on request, cumulatively."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._lock = threading.Lock()  # guards the buffer, counters and waiter below
        self._buffer: deque[tuple[int, tuple]] = deque()  # (delivery tag, row) of unacked deliveries
        self._first_buffered = 1  # sequence number of the buffer's first entry
        self._received = 0  # deliveries received so far (= sequence number of the latest)
        self._wanted: int | None = None  # `_received` value a waiter is blocked for
        self._arrived = threading.Event()  # set when `_received` reaches `_wanted`
        self._started = threading.Event()  # set once consuming began or the start failed
        self._error: BaseException | None = None  # why the connection ended, when it did
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None  # the consuming BlockingChannel
        self._queue: str | None = None  # name of the consumed queue (server-named for a private one)
        self._initial_ready = 0  # ready messages in the queue just before consuming began
        self._thread = threading.Thread(target=self._run, name="amqp-source-consumer", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        """Connect and start consuming; return how many messages were ready in the queue just before."""
        self._thread.start()
        if not self._started.wait(CONNECT_TIMEOUT_SECONDS):
            raise AmqpConnectionLost(f"amqp source: no connection to the broker after {CONNECT_TIMEOUT_SECONDS}s")
        if self._error is not None:
            raise AmqpConnectionLost(f"amqp source: cannot start consuming: {self._error!r}") from self._error
        return self._initial_ready

    def close(self) -> None:
        """Close the connection (unacknowledged messages are requeued by the broker) and end the thread."""
        connection = self._connection
        if connection is not None and self._thread.is_alive():
            try:
                connection.add_callback_threadsafe(self._channel.stop_consuming)
            except Exception:  # the connection is already gone: nothing left to close
                pass
        if self._thread.is_alive():
            self._thread.join(CLOSE_TIMEOUT_SECONDS)

    def _run(self) -> None:
        try:
            self._connection = pika.BlockingConnection(pika.URLParameters(self._options.uri))
            self._channel = self._connection.channel()
            self._queue, self._initial_ready = self._declare()
            self._channel.basic_qos(prefetch_count=self._options.prefetch)
            self._channel.basic_consume(self._queue, self._on_message)
            self._started.set()
            self._channel.start_consuming()
        except BaseException as error:  # recorded and re-raised on the caller's thread
            self._error = error
        finally:
            self._started.set()
            self._arrived.set()
            if self._connection is not None and self._connection.is_open:
                try:
                    self._connection.close()
                except Exception:  # closing a broken connection: nothing more to do
                    pass
            if self._error is None:
                self._error = AmqpConnectionLost("amqp source: the consumer was closed")

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
        row = delivery_to_row(method, properties, body, self._options.body_encoding)
        with self._lock:
            self._buffer.append((method.delivery_tag, row))
            self._received += 1
            if self._wanted is not None and self._received >= self._wanted:
                self._wanted = None
                self._arrived.set()

    # -- queries from the driver thread ------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise AmqpConnectionLost(f"amqp source: connection to the broker lost: {self._error!r}") from self._error

    @property
    def received(self) -> int:
        """Sequence number of the latest delivery (0 before the first)."""
        self._raise_if_failed()
        return self._received

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until `count` deliveries were received in all; False on timeout."""
        with self._lock:
            if self._received >= count:
                return True
            self._wanted = count
            self._arrived.clear()
        self._arrived.wait(timeout)
        self._raise_if_failed()
        with self._lock:
            self._wanted = None
            return self._received >= count

    def rows(self, after: int, through: int) -> list[tuple]:
        """Rows of the deliveries numbered after+1 .. through (all must still be unacknowledged)."""
        with self._lock:
            start = after + 1 - self._first_buffered
            if start < 0:
                raise AssertionError(f"deliveries after {after} were already acknowledged")
            return [row for _, row in islice(self._buffer, start, start + through - after)]

    def ready_count(self) -> int:
        """Messages ready in the consumed queue now (asked on the consuming channel)."""
        return self._call(lambda: self._channel.queue_declare(self._queue, passive=True).method.message_count)

    def ack_through(self, sequence: int) -> None:
        """Acknowledge every delivery up to and including `sequence` with one multiple ack."""
        with self._lock:
            count = sequence - self._first_buffered + 1
            if count <= 0:
                return
            tag = self._buffer[count - 1][0]
        self._call(lambda: self._channel.basic_ack(tag, multiple=True))
        with self._lock:
            for _ in range(count):
                self._buffer.popleft()
            self._first_buffered += count

    def _call(self, function: Callable[[], T]) -> T:
        """Run `function` on the consuming thread and return its result (or raise its error)."""
        self._raise_if_failed()
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = function()
            except BaseException as error:  # handed back to the calling thread
                outcome["error"] = error
            done.set()

        try:
            self._connection.add_callback_threadsafe(run)
        except pika.exceptions.ConnectionWrongStateError:
            self._raise_if_failed()
            raise
        deadline = time.monotonic() + CALL_TIMEOUT_SECONDS
        while not done.wait(0.1):  # wakes up to notice a consuming thread that died meanwhile
            if not self._thread.is_alive():
                self._raise_if_failed()
            if time.monotonic() > deadline:
                raise AmqpConnectionLost(f"amqp source: broker call unanswered after {CALL_TIMEOUT_SECONDS}s")
        if "error" in outcome:
            raise AmqpConnectionLost(f"amqp source: broker call failed: {outcome['error']!r}") from outcome["error"]
        return outcome["result"]
