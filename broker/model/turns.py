"""Work done a slice a loop turn (a channel's settlement, a lower length limit's trim, a prune of expiry times, the
freeing of what a purge or a deletion dropped) waits for its next slice in one line per event loop, and each loop
turn runs the slices waiting in it until TURN_SECONDS are spent: when each scheduled its own next slice, 2,000
channels closing with deliveries to requeue ran 2,000 slices of up to 5 ms in one loop turn, and no socket was
read meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable, Final, Generator, NamedTuple

# Slices one loop turn runs, at least one, until this long has been spent (a slice itself stops after about as long:
# broker.model.queue.SLICE_SECONDS)
TURN_SECONDS: Final = 0.005


class _Line:
    """The slices waiting for a loop turn of one event loop, first come first served."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: deque[Callable[[], None]] = deque()
        self.scheduled = False  # a turn's run is queued on the loop

    def add(self, slice_: Callable[[], None]) -> None:
        self.waiting.append(slice_)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        self.scheduled = False
        waiting = self.waiting
        ends = time.perf_counter() + TURN_SECONDS
        for _ in range(len(waiting)):  # (those waiting as the turn began: a slice's next one waits for another)
            waiting.popleft()()
            if time.perf_counter() >= ends:
                break
        if waiting and not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._run)


class OffLoop(NamedTuple):
    """What work done in steps (a generator its caller drives, broker.management.http.in_slices) yields for a call
    its caller may run on a worker thread, away from the event loop (matching a policy's pattern against every name
    of a big vhost): the caller sends the call's result back into the generator."""

    call: Callable[[], Any]


Steps = Generator["OffLoop | None", Any, None]  # work done in steps: None after each, OffLoop for a call off the loop


_line: _Line | None = None  # the running event loop's line (a process runs one loop; a test may run several)


def next_turn(slice_: Callable[[], None]) -> None:
    """Run slice_ in a coming loop turn, in its place in the line of slices waiting."""
    global _line
    loop = asyncio.get_running_loop()
    if _line is None or _line.loop is not loop:
        _line = _Line(loop)
    _line.add(slice_)
