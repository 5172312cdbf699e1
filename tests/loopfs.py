"""An ext4 file system of the test's own on a loop device, which a test can freeze (a disk that hangs: every write
blocks until it is thawed) or shut down (a disk that fails: every read and write gets EIO from then on). tmpfs
(tests/tmpfs.py) can do neither."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32): the file system's "going down" ioctl
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # down at once, the journal not flushed: as a disk that stops answering


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def ext4(mount_point: Path, size: int = 256 << 20) -> Iterator[Path]:
    """A fresh ext4 of ``size`` bytes (a sparse image beside the mount point) mounted at mount_point for the block;
    the test is skipped where loop devices or mkfs.ext4 cannot be used."""
    image = mount_point.with_name(mount_point.name + ".ext4")
    with open(image, "wb") as file:
        file.truncate(size)
    mount_point.mkdir()
    try:
        made = _run("mkfs.ext4", "-q", "-F", str(image))
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 here: {made.stderr.strip()}")
        mounted = _run("mount", "-o", "loop", str(image), str(mount_point))  # the loop device goes with the mount
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a loop device here (needs root): {mounted.stderr.strip()}")
        try:
            yield mount_point
        finally:
            thaw(mount_point)  # a test that failed while it was frozen must not leave it so
            subprocess.run(["umount", "--lazy", str(mount_point)], check=True)  # lazy: a killed node may hold a file
    finally:
        image.unlink()


def freeze(mount_point: Path) -> None:
    """Freeze the file system: every write to it, and every process writing, waits until thaw() (a disk that
    hangs). Whoever freezes one thaws it, whatever happens, before stopping the processes that use it."""
    if shutil.which("fsfreeze") is None:
        pytest.skip("no fsfreeze (util-linux) to make a disk hang")
    subprocess.run(["fsfreeze", "-f", str(mount_point)], check=True, timeout=60)


def thaw(mount_point: Path) -> bool:
    """Thaw the file system; False when it was not frozen."""
    return _run("fsfreeze", "-u", str(mount_point)).returncode == 0


def shut_down(mount_point: Path) -> None:
    """Every read and write on the file system fails with EIO from now on, until it is unmounted."""
    directory = os.open(mount_point, os.O_RDONLY)
    try:
        fcntl.ioctl(directory, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(directory)
