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
