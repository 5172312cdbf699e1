"""One end of a link between two processes of a node: frames out, gathered over a loop turn and written once at its
end (no task or future per message); frames in, cut from the stream and handed to the end's handler."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol

from broker.crossing.frames import FrameError, Reader, frame
from broker.model.turns import TURN_SECONDS

log = logging.getLogger(__name__)


class Handler(Protocol):
    """What one end does with its link."""

    def received(self, kind: int, payload: bytes) -> None:
        """A frame came; FrameError for one that makes no sense (the link is then closed)."""

    def flushing(self) -> None:
        """The turn's frames are about to be written: add what was gathered over the turn."""

    def lost(self) -> None:
        """The link is closed (the other process ended, or this one closed it)."""


class Link(asyncio.Protocol):
    def __init__(self, handler: Handler, peer: str):
        self.handler = handler
        self.peer = peer  # who is at the other end, for the log ("worker 2")
        self.transport: asyncio.Transport | None = None
        self.reader = Reader()
        self.unhandled: deque[tuple[int, bytes]] = deque()  # frames read, not handled yet (TURN_SECONDS spent)
        self.paused = False  # reading paused until those are handled
        self.frames: list[bytes] = []  # frames to write at the end of the turn
        self.batch_kind = 0  # the kind of the batch being gathered (0: none)
        self.batch: list[bytes] = []  # its records
        self.sent = 0  # frames made so far (the open batch not counted): the other end numbers them the same way
        self.flush_scheduled = False
        self.open = False  # connected and not lost

    # --- asyncio.Protocol -----------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.open = True

    def data_received(self, data: bytes) -> None:
        try:
            self.unhandled.extend(self.reader.feed(data))
        except FrameError as error:
            log.error("closing the link with %s: %s", self.peer, error)
            self.close()
            return
        if not self.paused:
            self._handle()

    def _handle(self) -> None:
        """The frames read, in order, until TURN_SECONDS are spent; the others in a later loop turn, reading paused
        meanwhile (a vhost's home deleting 100,000 queues sent its copies their deletions faster than one loop turn
        applied them: 50 to 70 ms at once)."""
        ends = time.perf_counter() + TURN_SECONDS
        unhandled = self.unhandled
        try:
            while unhandled and self.open:
                kind, payload = unhandled.popleft()
                self.handler.received(kind, payload)
                if unhandled and time.perf_counter() >= ends:
                    if not self.paused and self.transport is not None:
                        self.paused = True
                        self.transport.pause_reading()
                    asyncio.get_running_loop().call_soon(self._handle)
                    return
        except FrameError as error:
            log.error("closing the link with %s: %s", self.peer, error)
            self.close()
            return
        except (KeyError, TypeError, ValueError) as error:  # (an operation without a key it needs, of a wrong type)
            log.error("closing the link with %s: a malformed operation (%r)", self.peer, error)
            self.close()
            return
        if self.paused and self.open and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.unhandled.clear()
        if self.open:
            self.open = False
            self.handler.lost()

    # --- sending --------------------------------------------------------------------------------------------
    def add(self, kind: int, record: bytes) -> None:
        """A record for the batch of that kind: it goes out at the end of the turn, in one frame with the others."""
        if self.batch_kind != kind:
            self._close_batch()
            self.batch_kind = kind
        self.batch.append(record)
        if not self.flush_scheduled:
            self._schedule()

    def send(self, kind: int, payload: bytes) -> None:
        """A frame of its own, after everything added or sent before it."""
        self._close_batch()
        self.frames.append(frame(kind, payload))
        self.sent += 1
        if not self.flush_scheduled:
            self._schedule()

    def wake(self) -> None:
        """Have this turn's flush run, for what the handler adds as it flushes."""
        if not self.flush_scheduled:
            self._schedule()

    def last_number(self) -> int:
        """The number the last frame made so far will have, the batch being gathered included."""
        return self.sent + 1 if self.batch else self.sent

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    def cut(self) -> None:
        """The batch being gathered is closed: what is added next goes in another frame."""
        self._close_batch()

    def _close_batch(self) -> None:
        if self.batch:
            self.frames.append(frame(self.batch_kind, b"".join(self.batch)))
            self.sent += 1
            self.batch = []
        self.batch_kind = 0

    def _schedule(self) -> None:
        self.flush_scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if not self.open:
            self.flush_scheduled = False
            return
        self.handler.flushing()  # (what it adds goes with this flush)
        self.flush_scheduled = False
        self._close_batch()
        frames, self.frames = self.frames, []
        if frames and self.transport is not None:
            self.transport.write(b"".join(frames))
