"""Work done a slice a loop turn (a channel's settlement, a lower length limit's trim, a prune of expiry times, the
freeing of what a purge or a deletion dropped) waits for its next slice in one line per event loop, and each loop
turn runs the slices waiting in it until TURN_SECONDS are spent: when each scheduled its own next slice, 2,000
channels closing with deliveries to requeue ran 2,000 slices of up to 5 ms in one loop turn, and no socket was
read meanwhile. What a turn leaves goes on after the replies the next turn's reads make (go_on_after_replies),
as the rest of a long read does."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Final, Generator, Iterable, NamedTuple, cast

if TYPE_CHECKING:
    from broker.model.exchange import Exchange
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost

log = logging.getLogger(__name__)

# Slices one loop turn runs, at least one, until this long has been spent (a slice itself stops after about as long:
# broker.model.queue.SLICE_SECONDS)
TURN_SECONDS: Final = 0.005


def go_on_after_replies(loop: asyncio.AbstractEventLoop, go_on: Callable[[], object]) -> None:
    """Call ``go_on`` (the rest of a read whose READ_SECONDS are spent, the slices a turn left) two loop turns from
    now rather than at the next: the replies to other clients' frames read meanwhile, whose flushes are queued behind
    it, are written before it takes a slice more. (At the next turn, another client's round trip waited for the rest
    of one slice and then a whole one.)"""
    loop.call_soon(loop.call_soon, go_on)


class _Line:
    """The slices waiting for a loop turn of one event loop, first come first served."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: deque[Callable[[], None]] = deque()
        self.scheduled = False  # a run of the line is queued on the loop, or running

    def add(self, slice_: Callable[[], None]) -> None:
        self.waiting.append(slice_)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._run)

    def _run(self) -> None:
        waiting = self.waiting
        ends = time.perf_counter() + TURN_SECONDS
        try:
            for _ in range(len(waiting)):  # (those waiting as the turn began: a slice's next one waits for another)
                try:
                    waiting.popleft()()
                except Exception:  # (a bug: the other slices go on)
                    log.exception("a slice of work done over loop turns failed")
                if time.perf_counter() >= ends:
                    break
        finally:
            if waiting:
                go_on_after_replies(self.loop, self._run)
            else:
                self.scheduled = False


class OffLoop(NamedTuple):
    """What work done in steps (a generator its caller drives, in_slices) yields for a call
    its caller may run on a worker thread, away from the event loop (matching a policy's pattern against every name
    of a big vhost): the caller sends the call's result back into the generator."""

    call: Callable[[], Any]


Steps = Generator["OffLoop | None", Any, None]  # work done in steps: None after each, OffLoop for a call off the loop


async def in_slices(steps: Iterable[OffLoop | None]) -> None:
    """Run work that yields between its small changes (an import of definitions, a policy applied to every queue of
    a vhost), letting the event loop turn every TURN_SECONDS; a call it yields as OffLoop runs on a worker thread,
    its result sent back. Each slice's young objects are collected at its end: left to the collector's own schedule,
    the objects of ten of its first collections (50,000 allocations each, most of them kept: an import's new queues)
    were walked in one go, 70 to 110 ms of the loop at once for 30,000 queues."""
    slice_ends = time.monotonic() + TURN_SECONDS
    for step in steps:
        while isinstance(step, OffLoop):  # (yielded by a generator, which takes the call's result back)
            try:
                step = cast(Steps, steps).send(await asyncio.to_thread(step.call))
            except StopIteration:
                return
        if time.monotonic() >= slice_ends:
            gc.collect(1)  # (the young generations: a slice's objects, a few ms at most)
            await asyncio.sleep(0)
            slice_ends = time.monotonic() + TURN_SECONDS


async def reapply_policies(vhost: "VirtualHost") -> None:
    """Apply a policy change to the vhost's queues and exchanges (through the API, or copied from the vhost's home:
    broker.crossing.copies), their names matched on a worker thread (with the costliest pattern RE2 takes, a
    millisecond each, a vhost of 10,000 queues would hold the event loop 10 s), the choices applied in slices
    (100,000 queues held it about 1 s in one piece), those of an older change skipped."""
    await in_slices(vhost.applying_policy_choices(await asyncio.to_thread(vhost.policy_snapshot().choose)))


async def deleted_in_slices(vhost: "VirtualHost", subject: "Queue | Exchange") -> None:
    """A queue or exchange deleted once its bindings are few enough to go with it, the others removed first, a slice
    a loop turn (VirtualHost.unbind_all); unless another client deleted it meanwhile."""
    done = asyncio.get_running_loop().create_future()

    def delete() -> None:
        vhost.delete(subject)
        if not done.done():  # (the request gone meanwhile)
            done.set_result(None)

    vhost.unbind_all(subject, delete)
    await done


_line: _Line | None = None  # the running event loop's line (a process runs one loop; a test may run several)


def next_turn(slice_: Callable[[], None]) -> None:
    """Run slice_ in a coming loop turn, in its place in the line of slices waiting."""
    global _line
    loop = asyncio.get_running_loop()
    if _line is None or _line.loop is not loop:
        _line = _Line(loop)
    _line.add(slice_)
