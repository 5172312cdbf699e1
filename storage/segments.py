"""Where the store's files live: numbered segment files and the definitions log."""

from __future__ import annotations

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
