"""Publishing with publisher confirms and a window of outstanding confirms.

A blocking pika channel in confirm mode waits for each confirm before the next publish, so this
drives an asynchronous `SelectConnection` instead: up to `window` messages are in flight, and every
confirm lets more out. A nack, a returned message (with mandatory), a message that cannot be
encoded or a lost connection ends the publishing with `PublishFailed` (the connection closed), which
fails the Spark task so Spark retries it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

import pika
from pika.spec import Basic

OutgoingMessage = tuple[str, bytes, pika.BasicProperties]  # routing key, body, properties


class PublishFailed(RuntimeError):
    """The broker did not take responsibility for every message of a task."""


class ConfirmedPublisher:
    """Publishes an iterator of messages to one exchange, returning once the broker confirmed all."""

    def __init__(self, uri: str, exchange: str, mandatory: bool, window: int) -> None:
        self._parameters = pika.URLParameters(uri)
        self._exchange = exchange
        self._mandatory = mandatory
        self._window = window
        self._connection: pika.SelectConnection | None = None
        self._channel: Any = None  # the async pika Channel, in confirm mode
        self._messages: Iterator[OutgoingMessage] = iter(())
        self._exhausted = False  # the iterator has no more messages
        self._published = 0  # messages published so far (= delivery tag of the latest)
        self._unconfirmed: deque[int] = deque()  # delivery tags awaiting a confirm, in order
        self._confirmed_singly: set[int] = set()  # tags acked one by one ahead of older tags
        self._error: str | None = None  # why publishing failed
        self._upstream_error: BaseException | None = None  # an error raised by the message iterator

    def publish_all(self, messages: Iterator[OutgoingMessage]) -> int:
        """Publish every message and wait for all confirms; return how many were published."""
        self._messages = messages
        self._connection = pika.SelectConnection(
            self._parameters,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
        )
        self._connection.ioloop.start()
        if self._upstream_error is not None:
            raise self._upstream_error
        if self._error is not None:
            raise PublishFailed(f"amqp sink: {self._error}")
        return self._published

    # -- connection and channel set-up ---------------------------------------------------------

    def _on_connection_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: pika.SelectConnection, error: BaseException) -> None:
        self._error = f"cannot connect to the broker: {error!r}"
        connection.ioloop.stop()

    def _on_connection_closed(self, connection: pika.SelectConnection, reason: BaseException) -> None:
        if self._error is None and not self._done():
            self._error = f"connection to the broker lost with {len(self._unconfirmed)} publishes unconfirmed: {reason!r}"
        connection.ioloop.stop()

    def _on_channel_open(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._publish_more())

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        if self._error is None and not self._done():
            self._error = f"channel closed by the broker: {reason!r}"
        if self._connection.is_open:
            self._connection.close()

    # -- the publishing loop -------------------------------------------------------------------

    def _done(self) -> bool:
        return self._exhausted and not self._unconfirmed

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._error = error
        if self._connection.is_open:
            self._connection.close()

    def _publish_more(self) -> None:
        """Fill the window of unconfirmed publishes; close the connection once all are confirmed."""
        if self._error is not None:
            return
        publish = self._channel.basic_publish
        while not self._exhausted and len(self._unconfirmed) - len(self._confirmed_singly) < self._window:
            try:
                routing_key, body, properties = next(self._messages)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as error:  # an upstream failure of the Spark task, re-raised as is
                self._upstream_error = error
                self._fail(f"reading the rows to publish failed: {error!r}")
                return
            try:
                publish(self._exchange, routing_key, body, properties, mandatory=self._mandatory)
            except Exception as error:  # nothing was sent (e.g. a property out of range): fail the task
                self._fail(f"message {properties.message_id!r} cannot be published: {error!r}")
                return
            self._published += 1
            self._unconfirmed.append(self._published)
        if self._done() and self._connection.is_open:
            self._connection.close()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            self._fail(f"the broker nacked publish #{method.delivery_tag} (multiple={method.multiple})")
            return
        tag = method.delivery_tag
        unconfirmed = self._unconfirmed
        if method.multiple:
            while unconfirmed and unconfirmed[0] <= tag:
                self._confirmed_singly.discard(unconfirmed.popleft())
        elif unconfirmed and unconfirmed[0] == tag:
            unconfirmed.popleft()
        else:
            self._confirmed_singly.add(tag)
        while unconfirmed and unconfirmed[0] in self._confirmed_singly:
            self._confirmed_singly.remove(unconfirmed.popleft())
        self._publish_more()

    def _on_return(self, channel: Any, method: Basic.Return, properties: Any, body: bytes) -> None:
        self._fail(
            f"message returned by the broker: {method.reply_code} {method.reply_text} "
            f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
        )
