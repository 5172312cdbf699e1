"""The memory alarm: when the broker's resident memory passes its limit, publishing connections are blocked
(connection.blocked, and their sockets are not read) until it falls back, as RabbitMQ's memory alarm does."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from typing import Callable

CHECK_INTERVAL = 1.0  # seconds between two readings of the resident memory
CLEAR_RATIO = 0.9  # the alarm clears once memory is below this share of the limit (no flapping at the edge)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _trimmer() -> Callable[[], object]:
    """glibc's malloc_trim, which hands freed heap back to the system (else RSS stays high after queues drain and
    the alarm would never clear); a no-op where there is no glibc."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return lambda *args: None


_malloc_trim = _trimmer()


def release_freed_memory() -> None:
    """Hand the heap freed so far back to the system (after recovery, whose temporary objects would else keep the
    resident size up until the alarm's first check)."""
    _malloc_trim(0)


def resident_bytes() -> int:
    """This process's resident memory, from /proc (one small read, no subprocess)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


def machine_memory() -> int:
    return _PAGE_SIZE * os.sysconf("SC_PHYS_PAGES")


def memory_limit(high_watermark: float, absolute: int) -> int:
    """The limit in bytes: an absolute figure when configured, else a share of the machine's memory."""
    return absolute if absolute else int(machine_memory() * high_watermark)


class MemoryAlarm:
    def __init__(self, limit: int, on_change: Callable[[bool], None],
                 read_memory: Callable[[], int] = resident_bytes):
        self.limit = limit  # bytes of resident memory that raise the alarm
        self.on_change = on_change  # called with True when the alarm goes off, False when it clears
        self.read_memory = read_memory
        self.active = False
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.check()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def check(self) -> None:
        if self.active:
            _malloc_trim(0)
        used = self.read_memory()
        if not self.active and used > self.limit:
            self.active = True
            self.on_change(True)
        elif self.active and used < self.limit * CLEAR_RATIO:
            self.active = False
            self.on_change(False)
        self.timer = asyncio.get_running_loop().call_later(CHECK_INTERVAL, self.check)
