"""The HTTP connections of the management API and of the Prometheus endpoint: aiohttp's protocol with the timeouts
RabbitMQ's web server (cowboy) keeps, and a cap on how many connections a listener holds, so that slow or idle
HTTP clients can hold neither the event loop nor the file descriptors AMQP clients and the store need."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.web_protocol import RequestHandler

REQUEST_TIMEOUT = 5.0  # seconds a request's headers may take to arrive whole (cowboy's request_timeout)
IDLE_TIMEOUT = 60.0  # seconds a kept-alive connection may wait for its next request (cowboy's idle_timeout)
LINGERING_TIME = 5.0  # seconds spent reading and dropping the rest of a body that a reply did not need
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"  # as cowboy's
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"  # to one past the cap


class ConnectionSlots:
    """How many connections one listener holds, and how many it may."""

    def __init__(self, limit: int):
        self.limit = limit  # connections held at most; one more is answered 503 and closed at once
        self.open = 0  # connections held now


class GuardedRequestHandler(RequestHandler):
    """One HTTP connection. Its request headers must arrive whole within REQUEST_TIMEOUT of the connection's
    opening, or of the first byte of a later request: otherwise it is answered 408 and closed (closed without a word
    when it sent nothing), as cowboy does. Idle between requests, it is closed after IDLE_TIMEOUT. One past its
    listener's ConnectionSlots is answered 503 and closed at once.

    It reads aiohttp 3.14's RequestHandler state: _request_count (requests whose headers were parsed), _waiter (set
    while the connection waits for its next request) and _messages (requests parsed but not yet handled)."""

    def __init__(self, manager: Any, slots: ConnectionSlots, **kwargs: Any):
        # A body is read as it was sent, whatever its Content-Encoding (as RabbitMQ's API reads it: a compressed body
        # is not JSON), and forwarded as it came
        super().__init__(manager, keepalive_timeout=IDLE_TIMEOUT, lingering_time=LINGERING_TIME, auto_decompress=False,
                         **kwargs)
        self.slots = slots  # the listener's count of connections
        # (another node's nonce, this node's) of the challenge it asked for on this connection, taken by the request
        # that follows (broker.management.forwarding)
        self.challenge: tuple[bytes, bytes] | None = None
        self.admitted = False  # it took a slot (False: refused, or not connected yet)
        self.headers_due: asyncio.TimerHandle | None = None  # fires when the awaited headers are late
        self.headers_started = False  # bytes of the awaited request's headers have arrived

    def connection_made(self, transport: Any) -> None:
        if self.slots.open >= self.slots.limit:
            transport.write(BUSY)
            transport.close()
            return
        self.slots.open += 1
        self.admitted = True
        super().connection_made(transport)
        self._await_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.slots.open -= 1
        self._headers_arrived()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.headers_due is None and self._between_requests():
            self._await_headers()
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._headers_arrived()
        elif self.headers_due is not None and data:
            self.headers_started = True

    def _between_requests(self) -> bool:
        """Whether the connection waits for its next request (so bytes now are that request's first)."""
        return self._waiter is not None and not self._waiter.done() and not self._messages

    def _await_headers(self) -> None:
        self.headers_started = False
        self.headers_due = self._loop.call_later(REQUEST_TIMEOUT, self._headers_late)

    def _headers_arrived(self) -> None:
        if self.headers_due is not None:
            self.headers_due.cancel()
            self.headers_due = None

    def _headers_late(self) -> None:
        self.headers_due = None
        if self.transport is None:
            return
        if self.headers_started:
            self.transport.write(TIMED_OUT)
        self.force_close()
