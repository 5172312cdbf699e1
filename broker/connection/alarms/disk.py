"""The disk alarm: raised when the store's durable writes fail (a full disk, an I/O error, a writer that died), and
cleared once they work again and the data dir's file system has room. At the edge of a full disk a small write may
fit where the next message does not: the room asked for keeps the alarm from flapping on and off there."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable

CHECK_INTERVAL = 1.0  # seconds between two looks at the free space while the alarm is on
CLEAR_FREE_BYTES = 1 << 20  # free bytes on the data dir's file system before the alarm may clear


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on path's file system; None if that cannot be told."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


class DiskAlarm:
    def __init__(self, data_dir: Path, on_change: Callable[[bool], None],
                 read_free: Callable[[Path], int | None] = free_bytes):
        self.data_dir = data_dir
        self.on_change = on_change  # called with True when the alarm goes off, False when it clears
        self.read_free = read_free
        self.active = False
        self.store_healthy = True  # the store's last word on its writes
        self.timer: asyncio.TimerHandle | None = None  # the next look at the free space, while the alarm is on

    def store_health_changed(self, healthy: bool) -> None:
        """The store's on_health callback."""
        self.store_healthy = healthy
        if not healthy and not self.active:
            self.active = True
            self.on_change(True)
        self.check()

    def check(self) -> None:
        self.stop()
        if not self.active:
            return
        free = self.read_free(self.data_dir)
        if self.store_healthy and (free is None or free >= CLEAR_FREE_BYTES):
            self.active = False
            self.on_change(False)
        else:
            self.timer = asyncio.get_running_loop().call_later(CHECK_INTERVAL, self.check)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
