"""A tmpfs of the test's own (a read-only or a tiny file system), for the start-up, disk-full and disk-alarm
tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at mount_point for the block (the test is skipped where mounting is not allowed)."""
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=True)  # lazy: a broker may still hold a file


def fill(directory: Path) -> None:
    """Take every free byte of the file system under directory."""
    filler = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(filler, b"\0" * chunk)
    finally:
        os.close(filler)
