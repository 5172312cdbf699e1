"""One store per data dir: an exclusive ``flock`` on ``data_dir/.lock``, held from recovery until the store closes.

The lock belongs to the open file, so the kernel drops it when the process exits, however it exits: a stale
``.lock`` file left by a crash never blocks the next start. The file holds the owner's pid, for the message the
next contender gets.

Taking the lock is the first thing done in a data dir, by a store and by a follower alike, so it also makes the data
dir durable: the directories it makes, and, at the data dir's first use (no ``.lock`` yet, whoever made the dir),
the data dir's own entry in its parent, so that a power cut soon after cannot take the new dir with everything
later confirmed in it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from storage.segments import fsync_directories, make_directories

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class DataDirLocked(Exception):
    """Another store (in this process or another one) holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: Path, name: str = LOCK_FILE) -> None:
        self._data_dir = data_dir
        self._name = name  # the lock file's name in the data dir (another one for another kind of holder)
        self._fd = -1  # the open lock file while we hold the lock

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> None:
        """Take the lock or raise DataDirLocked naming the holder; OSError if the dir cannot be used at all."""
        self._make_durable()
        fd = os.open(self._data_dir / self._name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(f"data dir {self._data_dir} is in use by another Warren ({holder})") from None
        except OSError:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        except OSError:
            pass  # a full disk must not stop the start: the pid is only for the message above
        self._fd = fd

    def _make_durable(self) -> None:
        """Make the data dir (and its missing parents) and fsync the directories that gained an entry; at the data
        dir's first use, its parent too."""
        changed: set[Path] = set()
        make_directories(self._data_dir, changed)
        if not (self._data_dir / self._name).exists():
            changed.add(self._data_dir.parent)
        try:
            fsync_directories(changed)
        except PermissionError as error:  # a parent we may enter but not read: nothing more can be done from here
            log.warning("cannot make the entry of data dir %s durable (%s): a power cut soon after its first use "
                        "may lose it", self._data_dir, error)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the lock; the file stays (unlinking it would race with a new owner)
            self._fd = -1


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"
