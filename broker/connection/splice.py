"""Two transports joined: what one reads, the other writes, each read paused while the other cannot keep up.

An amqps connection cannot be handed to another worker process as its socket: the TLS session lives in the worker
that accepted it. That worker keeps the TLS end and joins it to one end of a socket pair whose other end it hands
over, so the worker that leads the vhost serves the connection as a plain one, its bytes passing through here.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any


class SpliceEnd(asyncio.Protocol):
    """One end of a splice."""

    def __init__(self) -> None:
        self.transport: Any = None  # this end's transport
        self.other: SpliceEnd | None = None  # the end its bytes go to
        self.waiting: list[bytes] = []  # read before the other end was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            self.waiting.append(data)
        elif not other.transport.is_closing():
            other.transport.write(data)

    def eof_received(self) -> bool:
        other = self.other.transport if self.other is not None else None
        if other is not None and not other.is_closing() and other.can_write_eof():
            other.write_eof()
            return True  # half-closed: the other direction may still carry the peer's close-ok
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


async def splice(client: Any, inner: socket.socket) -> None:
    """Join client's transport (reading paused) with the socket inner, then let client's bytes flow."""
    loop = asyncio.get_running_loop()
    outer_end = SpliceEnd()
    outer_end.transport = client
    client.set_protocol(outer_end)
    _, inner_end = await loop.connect_accepted_socket(SpliceEnd, inner)
    join(outer_end, inner_end)


def join(client: SpliceEnd, other: SpliceEnd) -> None:
    """Join the client's end (its reading paused) with the other: each gets what the other read before, then the
    client's bytes flow (or, the client gone meanwhile, the other end closes)."""
    client.other, other.other = other, client
    for end, to in ((client, other), (other, client)):
        for data in end.waiting:
            to.transport.write(data)
        end.waiting.clear()
    if client.transport.is_closing():
        other.transport.close()
    else:
        client.transport.resume_reading()
