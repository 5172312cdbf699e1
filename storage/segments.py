"""Where the store's files live: numbered segment files and the definitions log."""

from __future__ import annotations

import errno
import os
from pathlib import Path

SEGMENT_SUFFIX = ".seg"
DEFINITIONS_LOG = "definitions.log"
CLEAN_MARKER = "clean-shutdown"  # present only between a graceful close and the next start


def messages_directory(data_dir: Path) -> Path:
    return data_dir / "messages"


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{number:010d}{SEGMENT_SUFFIX}"


def segment_numbers(directory: Path) -> list[int]:
    return sorted(int(path.stem) for path in directory.glob(f"*{SEGMENT_SUFFIX}") if path.stem.isdigit())


def fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directories(directories: set[Path]) -> int:
    """fsync each of ``directories`` that still exists (one removed since has no entries left to keep), then empty
    the set; return how many were fsynced. Should one fail, the set is left whole, to be tried again."""
    count = 0
    for directory in directories:
        try:
            fsync_directory(directory)
        except FileNotFoundError:
            continue
        count += 1
    directories.clear()
    return count


def write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably (a temporary file beside it, fsynced, renamed over it)."""
    temporary = path.with_suffix(".snapshot")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def make_directories(directory: Path, changed: set[Path]) -> None:
    """Make ``directory`` and whichever of its parents are missing; the parent of each one made joins ``changed``
    (its entries changed): fsync them (``fsync_directories``) before anything inside is relied on."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    if not directory.is_dir():  # a file where a directory should be (or above it)
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
        changed.add(made.parent)


def open_appending(path: Path, changed: set[Path]) -> int:
    """``path`` open for appending; made if missing (its directories too, see ``make_directories``), and then its
    directory joins ``changed``."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        make_directories(path.parent, changed)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    changed.add(path.parent)
    return fd


def write_synced(path: Path, data: bytes) -> None:
    """Create (or empty) ``path`` and write ``data`` to it, fdatasync'd: a rewrite's copy, renamed into place next."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
    finally:
        os.close(fd)
