"""Stalls of the event loop: every client of a broker process waits while anything holds its loop, so a hold longer
than STALL_WARNING is logged, saying how long it lasted and where the loop's thread was when a watching thread found
it held (as RabbitMQ's system monitor reports a process scheduled too long, its long_schedule events).

The loop beats every CHECK_EVERY (a timer: nothing on the path of a message); a beat that comes late by more than
STALL_WARNING is a stall. A thread looks at the last beat as often, and when the loop is overdue it takes the
innermost frames of the loop's thread (the Python ones: a compiled function shows as the Python code it called, or
not at all; a C call that keeps the interpreter, as a collection of the garbage collector does, keeps the watching
thread out too, which then finds the loop wherever it went on). A loop found in no Python code of its own (its
thread in the loop's C code: waiting for the interpreter another thread keeps in a C call, as a copy of tens of MB
does) is found with where the process's other threads were, the one that let the interpreter go among them. At most
one warning every WARN_EVERY: the next one counts the stalls between. A hold that lasts STILL_HELD is also said by
the watching thread while it lasts, once, with where the loop is then (a loop that never turns again would say
nothing itself)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Final

log = logging.getLogger(__name__)

STALL_WARNING: Final = 0.25  # seconds the event loop may be held before a warning says so
CHECK_EVERY: Final = 0.1  # seconds between two beats of the loop, and between two looks of the watching thread
WARN_EVERY: Final = 10.0  # seconds between two warnings at least
FRAMES: Final = 6  # innermost frames of the loop's thread a warning names
OTHERS_FRAMES: Final = 3  # innermost frames of each other thread it names, where the loop's thread ran no Python
STILL_HELD: Final = 5.0  # seconds of one hold after which the watching thread says so itself


class StallWatch:
    """The beats of one event loop, and the thread that watches them."""

    def __init__(self, threshold: float = STALL_WARNING, check_every: float = CHECK_EVERY,
                 warn_every: float = WARN_EVERY, still_held: float = STILL_HELD) -> None:
        self.threshold = threshold
        self.check_every = check_every
        self.warn_every = warn_every
        self.still_held = still_held
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop watched (None: none yet)
        self.loop_thread = 0  # the thread id of the loop watched
        self.outside: FrameType | None = None  # the loop's thread's innermost frame while the loop runs C code alone
        self.timer: asyncio.TimerHandle | None = None  # the next beat
        self.due = time.monotonic()  # when the next beat is due (time.monotonic())
        # (due, where): the loop's thread as found past that beat's due (one of an earlier beat: stale, ignored)
        self.found: tuple[float, str] | None = None
        self.still_said = 0.0  # the due of the last beat whose hold the watching thread said while it lasted
        self.warned_at = -warn_every  # time.monotonic() of the last warning
        self.unsaid = 0  # stalls since the last warning, not warned of
        self.unsaid_longest = 0.0  # seconds the longest of them lasted

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch loop (from its own thread): its beats start now."""
        if self.timer is not None:
            self.timer.cancel()
        self.loop, self.loop_thread = loop, threading.get_ident()
        self.outside = _outside_coroutines(sys._getframe(1))
        self._next_beat()

    def _next_beat(self) -> None:
        assert self.loop is not None, "attached"
        self.due = time.monotonic() + self.check_every
        self.timer = self.loop.call_later(self.check_every, self._beat)

    def _beat(self) -> None:
        held = time.monotonic() - self.due
        if held > self.threshold:
            found = self.found
            self._held(held, found[1] if found is not None and found[0] == self.due else None)
        self._next_beat()

    def _held(self, held: float, where: str | None) -> None:
        now = time.monotonic()
        if now - self.warned_at < self.warn_every:
            self.unsaid += 1
            self.unsaid_longest = max(self.unsaid_longest, held)
            return
        more = "" if not self.unsaid else (f" ({self.unsaid} more held it since the last warning, the longest for "
                                           f"at least {self.unsaid_longest:.2f} s)")
        log.warning("the event loop was held for at least %.2f s%s%s", held, f", found at {where}" if where else "",
                    more)
        self.warned_at, self.unsaid, self.unsaid_longest = now, 0, 0.0

    def look(self) -> None:
        """From the watching thread: where the loop's thread is, if its beat is overdue and it was not found since;
        a hold of still_held or more is said now, once."""
        due = self.due
        overdue = time.monotonic() - due
        found = self.found
        finding = overdue > self.threshold and (found is None or found[0] != due)
        saying = overdue >= self.still_held and self.still_said != due
        frame = sys._current_frames().get(self.loop_thread) if (finding or saying) and self.loop is not None else None
        if frame is None:
            return
        place = where(frame)
        if frame is self.outside:
            place += f"; the other threads: {others(self.loop_thread)}"
        if finding:
            self.found = (due, place)
        if saying:
            self.still_said = due
            log.warning("the event loop has been held for %.0f s so far, found at %s", overdue, place)

    def watch(self) -> None:
        """The watching thread's life: a look every check_every, until the loop watched is closed."""
        while self.loop is None or not self.loop.is_closed():
            time.sleep(self.check_every)
            self.look()


def where(frame: FrameType, frames: int = FRAMES) -> str:
    """The innermost frames from frame out, innermost first: "directory/file.py:line function" each."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=frames, lookup_lines=False)
    return " < ".join(f"{os.path.basename(os.path.dirname(entry.filename))}/{os.path.basename(entry.filename)}:"
                      f"{entry.lineno} {entry.name}" for entry in stack)


def others(loop_thread: int) -> str:
    """Where each thread but this one and the loop's is (its innermost OTHERS_FRAMES frames), by name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return " / ".join(f"{names.get(ident, ident)} at {where(frame, OTHERS_FRAMES)}"
                      for ident, frame in sys._current_frames().items()
                      if ident not in (threading.get_ident(), loop_thread))


def _outside_coroutines(frame: FrameType | None) -> FrameType | None:
    """The frame that runs the event loop, seen from a frame of its thread within a coroutine the loop runs (None if
    frame is in none): the outermost coroutine's caller."""
    outermost = None
    while frame is not None:
        if frame.f_code.co_flags & inspect.CO_COROUTINE:
            outermost = frame
        frame = frame.f_back
    return outermost.f_back if outermost is not None else None


_watch: StallWatch | None = None  # the process's watch (and its thread's), once watch() has run


def watch() -> None:
    """Watch the running event loop for stalls (from it, at a broker process's start)."""
    global _watch
    if _watch is None or _watch.loop is None or _watch.loop.is_closed():
        _watch = StallWatch()
        threading.Thread(target=_watch.watch, name="stall watch", daemon=True).start()
    _watch.attach(asyncio.get_running_loop())
