"""Refused AMQP logins counted for the whole node: the kernel gives an address's connections to any worker, so each
worker asks the supervisor, which keeps the one count (broker.connection.login_throttle), how long to wait.

A socket pair of its own per worker carries JSON lines: worker -> supervisor ``{"refused": address, "delay": s}``,
answered ``{"wait": s}`` in order, and ``{"accepted": address}``, not answered. Only a refusal waits for the
supervisor, and only on its own connection; a worker whose supervisor does not answer counts by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import deque
from functools import partial
from typing import Callable

from broker.connection.login_throttle import LoginThrottle

log = logging.getLogger(__name__)

LINE_LIMIT = 64 * 1024  # the longest line either side reads: an address and a number
MAX_UNSENT = 1024 * 1024  # bytes a worker leaves unsent to a supervisor slow to read before it counts by itself


class NodeLoginThrottle(LoginThrottle):
    """A worker's throttle: the supervisor's count, asked over sock; this object's own count while it cannot be."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.writer: asyncio.StreamWriter | None = None  # None: not connected yet, or the supervisor is gone
        # the refusals asked and not answered yet, in order: (address, delay, then)
        self.asked: deque[tuple[str, float, Callable[[float], None]]] = deque()
        self.reading: asyncio.Task | None = None  # reads the supervisor's answers until it goes

    async def start(self) -> None:
        reader, self.writer = await asyncio.open_connection(sock=self.sock, limit=LINE_LIMIT)
        self.reading = asyncio.get_running_loop().create_task(self._read_answers(reader))

    def count_refused(self, address: str, delay: float, then: Callable[[float], None]) -> None:
        if not delay or not self._can_send():
            super().count_refused(address, delay, then)
            return
        self.asked.append((address, delay, then))
        self._send({"refused": address, "delay": delay})

    def accepted(self, address: str) -> None:
        super().accepted(address)
        if self._can_send():
            self._send({"accepted": address})

    def _can_send(self) -> bool:
        return self.writer is not None and self.writer.transport.get_write_buffer_size() < MAX_UNSENT

    def _send(self, message: dict) -> None:
        assert self.writer is not None
        self.writer.write(json.dumps(message).encode() + b"\n")

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                wait = float(json.loads(line)["wait"])
                _answer(self.asked.popleft()[2], wait)
        except (OSError, ValueError, TypeError, KeyError, IndexError) as error:
            log.warning("the supervisor's count of refused logins is unreadable, counting here: %s", error)
        finally:  # the supervisor is gone, or unreadable: what it was asked, and what follows, is counted here
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            while self.asked:
                address, delay, then = self.asked.popleft()
                super().count_refused(address, delay, partial(_answer, then))


def _answer(then: Callable[[float], None], wait: float) -> None:
    """Hand a refused login its wait; a failure there is the connection's alone, not the reading's."""
    try:
        then(wait)
    except Exception:
        log.exception("answering a refused login failed")


async def serve_logins(sock: socket.socket, throttle: LoginThrottle) -> None:
    """The supervisor's side, for one worker until it ends: count its refusals in throttle and say how long each
    waits."""
    reader, writer = await asyncio.open_connection(sock=sock, limit=LINE_LIMIT)
    try:
        while line := await reader.readline():
            message = json.loads(line)
            if "refused" in message:
                writer.write(json.dumps({"wait": throttle.refused(str(message["refused"]),
                                                                  float(message["delay"]))}).encode() + b"\n")
            else:
                throttle.accepted(str(message["accepted"]))
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as error:  # (a worker killed mid-line)
        log.warning("stopped counting a worker's refused logins: %s", error)
    finally:
        writer.close()
