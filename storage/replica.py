"""Replication of the store's files: the ops a leader's writer hands to its tap, and the writer that applies them.

The leader's writer thread (``storage.writer``) reports every change it makes to the data dir as a frame: a
sequence number and a list of ops. A follower applies the frames in order with ``ReplicaWriter`` and ends up with a
data dir byte-identical to the leader's (as listed by ``replicated_files``), so that promotion is today's recovery.

An op is ``(kind, path, data)``: ``path`` is relative to the data dir (POSIX, never absolute, no ``..``, never the
node's own ``.lock``, ``cluster-state`` or ``quarantine/``):

- ``APPEND``: ``data`` goes at the end of the file, made (with its directories) if missing;
- ``REPLACE``: ``data`` is the file's whole new content (written aside, fdatasynced, renamed over);
- ``DELETE``: the file goes (missing ok); ``RMTREE``: the directory tree goes (missing ok);
- ``TRUNCATE``: the file is cut back to the size ``data`` holds (8 bytes big-endian, ``truncate_op``), made empty
  if missing and the size is 0 (a leader's write that failed may have made a file it then cut back to nothing);
- ``RESET`` (path ``""``): everything in the data dir but the node's own goes, before a join's copy, except the
  files ``data`` names (``reset_op``: those the follower showed it holds as a prefix of the leader's, with the same
  SHA-256, ``storage.digests``), to which the copy appends only what they lack.

``encode_ops``/``decode_ops`` turn a frame's ops into bytes and back: ``[op count u32]`` then per op ``[kind
u8][path length u16][data length u32][path UTF-8][data]`` (``ops_parts``: the same bytes in parts, the data not
copied). Decoding checks every op and raises ``ReplicaError`` for anything malformed, never returning part of a
frame.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Final, TypeAlias

from storage.lock import LOCK_FILE
from storage.salvage import QUARANTINE_DIRECTORY
from storage.segments import (
    CLEAN_MARKER, SEGMENT_SUFFIX, fsync_directories, make_directories, open_appending, write_synced,
)

APPEND: Final = 1
REPLACE: Final = 2
DELETE: Final = 3
RMTREE: Final = 4
TRUNCATE: Final = 5
RESET: Final = 6
KIND_NAMES: Final = {APPEND: "APPEND", REPLACE: "REPLACE", DELETE: "DELETE", RMTREE: "RMTREE",
                     TRUNCATE: "TRUNCATE", RESET: "RESET"}

Op: TypeAlias = tuple[int, str, bytes]  # (kind, path relative to the data dir, data)

CLUSTER_STATE: Final = "cluster-state"  # the node's own cluster bookkeeping (the epoch it follows), never replicated
# The stores of a node's other worker processes, each replicated in a group of its own (cluster.worker), and the
# lock their supervisor holds: the node's own too
WORKERS_DIRECTORY: Final = "workers"
WORKERS_LOCK: Final = ".workers.lock"
KEPT_BY_RESET: Final = frozenset({LOCK_FILE, CLUSTER_STATE, QUARANTINE_DIRECTORY, WORKERS_DIRECTORY,
                                  WORKERS_LOCK})  # the node's own, never in an op
PAGES_DIRECTORY: Final = "pages"  # deep queues' page files: their own thread's, emptied at every start
NOT_REPLICATED: Final = KEPT_BY_RESET | {CLEAN_MARKER, PAGES_DIRECTORY}  # top-level names a full copy leaves out
TEMPORARY_SUFFIXES: Final = (".compacting", ".snapshot")  # rewrites in progress (recovery removes leftovers)

COUNT: Final = struct.Struct(">I")
HEAD: Final = struct.Struct(">BHI")  # kind, path length, data length
SIZE: Final = struct.Struct(">Q")  # a TRUNCATE op's size
MAX_PATH_BYTES: Final = 0xFFFF
MAX_DATA_BYTES: Final = 0xFFFFFFFF


class ReplicaError(ValueError):
    """A frame's ops are malformed, or an op cannot be applied as asked; the text says which and why."""


def reset_op(kept: list[str]) -> Op:
    """A RESET that keeps these files."""
    return (RESET, "", "\0".join(kept).encode())


def kept_files(op: Op) -> set[str]:
    """The files a RESET keeps (ReplicaError for a path that is not a plain relative one inside the data dir)."""
    if not op[2]:
        return set()
    try:
        paths = op[2].decode().split("\0")
    except UnicodeDecodeError:
        raise ReplicaError("a RESET keeps a path that is not UTF-8") from None
    for path in paths:
        check_path(path, "RESET")
    return set(paths)


def truncate_op(path: str, size: int) -> Op:
    return (TRUNCATE, path, SIZE.pack(size))


def truncated_size(op: Op) -> int:
    """The size a TRUNCATE op cuts its file back to."""
    (size,) = SIZE.unpack(op[2])
    return size


# --- the codec ------------------------------------------------------------------------------------------------
def encode_ops(ops: list[Op]) -> bytes:
    """The ops as bytes (ReplicaError for an op that is not well formed)."""
    return b"".join(ops_parts(ops))


def ops_parts(ops: list[Op]) -> list[bytes]:
    """What encode_ops joins: the ops' data among the parts as they are, not copied (ReplicaError for an op that is
    not well formed)."""
    parts = [COUNT.pack(len(ops))]
    for kind, path, data in ops:
        check_op(kind, path, len(data))
        encoded = path.encode()
        if len(encoded) > MAX_PATH_BYTES or len(data) > MAX_DATA_BYTES:
            raise ReplicaError(f"{KIND_NAMES[kind]} of {path[:80]!r}: path or data too long to encode")
        parts += (HEAD.pack(kind, len(encoded), len(data)), encoded, data)
    return parts


def decode_ops(data: bytes | memoryview) -> list[Op]:
    """The ops ``encode_ops`` made; ReplicaError (naming the op and what is wrong) for anything else."""
    view = memoryview(data)
    if len(view) < COUNT.size:
        raise ReplicaError(f"ops truncated: {len(view)} bytes cannot hold the op count")
    (count,) = COUNT.unpack_from(view)
    position = COUNT.size
    ops: list[Op] = []
    for number in range(count):
        if len(view) - position < HEAD.size:
            raise ReplicaError(f"ops truncated: op {number} of {count} has no complete head")
        kind, path_length, data_length = HEAD.unpack_from(view, position)
        position += HEAD.size
        end = position + path_length + data_length
        if end > len(view):
            raise ReplicaError(f"ops truncated: op {number} of {count} needs {end - position} bytes, "
                               f"{len(view) - position} are left")
        try:
            path = str(view[position:position + path_length], "utf-8")
        except UnicodeDecodeError:
            raise ReplicaError(f"op {number} of {count}: its path is not UTF-8") from None
        try:
            check_op(kind, path, data_length)
        except ReplicaError as error:
            raise ReplicaError(f"op {number} of {count}: {error}") from None
        op = (kind, path, bytes(view[position + path_length:end]))
        if kind == RESET:
            try:
                kept_files(op)
            except ReplicaError as error:
                raise ReplicaError(f"op {number} of {count}: {error}") from None
        ops.append(op)
        position = end
    if position != len(view):
        raise ReplicaError(f"{len(view) - position} bytes follow the last of {count} ops")
    return ops


def check_op(kind: int, path: str, data_length: int) -> None:
    """ReplicaError unless (kind, path, data of that length) is an op a follower may apply."""
    name = KIND_NAMES.get(kind)
    if name is None:
        raise ReplicaError(f"unknown op kind {kind}")
    if kind == RESET:
        if path:
            raise ReplicaError("a RESET op takes no path")
        return
    check_path(path, name)
    if kind == TRUNCATE and data_length != SIZE.size:
        raise ReplicaError(f"TRUNCATE of {path!r} carries {data_length} bytes instead of an 8-byte size")
    if kind in (DELETE, RMTREE) and data_length:
        raise ReplicaError(f"{name} of {path!r} carries {data_length} bytes of data")


def check_path(path: str, name: str) -> None:
    if not path:
        raise ReplicaError(f"{name} without a path")
    parts = path.split("/")
    if path.startswith("/") or "\0" in path or any(part in ("", ".", "..") for part in parts):
        raise ReplicaError(f"{name} of {path[:200]!r}: not a plain relative path inside the data dir")
    if parts[0] in KEPT_BY_RESET:
        raise ReplicaError(f"{name} of {path[:200]!r}: that is the node's own, never replicated")


# --- what a full copy holds -----------------------------------------------------------------------------------
def replicated_files(data_dir: Path) -> list[Path]:
    """The regular files a full copy of ``data_dir`` includes (paths relative to it, sorted): everything but the
    node's own (``.lock``, ``cluster-state``, ``quarantine/``), the clean-shutdown marker and rewrites in progress."""
    found: list[Path] = []
    _gather(Path(data_dir), Path(), found)
    return sorted(found)


def _gather(directory: Path, relative: Path, found: list[Path]) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            if not relative.parts and entry.name in NOT_REPLICATED:
                continue
            if entry.is_dir(follow_symlinks=False):
                _gather(directory / entry.name, relative / entry.name, found)
            elif entry.is_file(follow_symlinks=False) and not entry.name.endswith(TEMPORARY_SUFFIXES):
                found.append(relative / entry.name)


# --- the follower's writer ------------------------------------------------------------------------------------
Frame: TypeAlias = tuple[int, list[Op]]  # (sequence, ops)


class ReplicaWriter:
    """Applies frames to a follower's data dir, on the caller's thread (the follower's stream), a group at a time.

    ``apply`` takes every frame that has arrived, applies them in order, fdatasyncs each file written once and fsyncs
    each directory whose entries changed once (group commit), and returns the highest sequence, now durable. Before
    it removes or replaces anything it first syncs what the group wrote so far, as the leader's writer does. The
    first error (OSError, a malformed op, an op that does not fit the files) raises ReplicaError; every later call
    is refused. Files appended to stay open for the next group.
    """

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = Path(data_dir)
        self._files: dict[str, int] = {}  # relative path -> fd open for appending (those the last group touched)
        self._unsynced: dict[str, int] = {}  # relative path -> its fd, written since the last fdatasync
        self._directories: set[Path] = set()  # directories whose entries changed since the last sync
        self.broken = False  # a frame failed: everything after it is refused
        self.groups = 0  # groups applied and synced
        self.fsyncs = 0  # fdatasync/fsync calls made

    def apply(self, frames: list[Frame]) -> int:
        """Apply the frames (sequences never decrease) and make them durable; the highest sequence."""
        if self.broken:
            raise ReplicaError("an earlier frame could not be applied: nothing more is")
        sequence = frames[0][0]
        appended: set[str] = set()
        try:
            for sequence, ops in frames:
                for op in ops:
                    self._apply(op, appended)
            self._sync()
            self._close_all_but(appended)
        except Exception as error:
            self.broken = True
            self.close()
            raise ReplicaError(f"replica could not apply frame {sequence}: {error}") from error
        self.groups += 1
        return sequence

    def _apply(self, op: Op, appended: set[str]) -> None:
        kind, path, data = op
        check_op(kind, path, len(data))
        if kind == APPEND:
            fd = self._open(path)
            self._write_all(fd, data)
            self._unsynced[path] = fd
            appended.add(path)
        elif kind == TRUNCATE:
            self._truncate(path, truncated_size(op))
        else:
            self._sync()  # what came before is on disk before anything is removed or replaced, as on the leader
            if kind == REPLACE:
                self._replace(path, data)
            elif kind == DELETE:
                self._delete(path)
            elif kind == RMTREE:
                self._remove_tree(path)
            else:
                self._reset(kept_files(op))

    def _open(self, path: str) -> int:
        """The file open for appending (kept open), made with its directories if missing."""
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = open_appending(self._data_dir / path, self._directories)
        return fd

    def _truncate(self, path: str, size: int) -> None:
        fd = self._open(path)
        held = os.fstat(fd).st_size
        if held < size:
            raise ReplicaError(f"TRUNCATE of {path!r} to {size} bytes, but it holds only {held}")
        os.ftruncate(fd, size)
        self._unsynced[path] = fd

    def _replace(self, path: str, data: bytes) -> None:
        """Written aside under the name the store's own rewrites use (recovery removes a leftover), then renamed."""
        self._close(path)
        target = self._data_dir / path
        make_directories(target.parent, self._directories)
        temporary = target.with_suffix(".compacting" if target.suffix == SEGMENT_SUFFIX else ".snapshot")
        write_synced(temporary, data)
        self.fsyncs += 1
        os.replace(temporary, target)
        self._directories.add(target.parent)

    def _delete(self, path: str) -> None:
        self._close(path)
        target = self._data_dir / path
        target.unlink(missing_ok=True)
        self._directories.add(target.parent)

    def _remove_tree(self, path: str) -> None:
        for open_path in [open_path for open_path in self._files if open_path.startswith(path + "/")]:
            self._close(open_path)
        target = self._data_dir / path
        if target.is_dir():
            shutil.rmtree(target)
            self._directories.add(target.parent)

    def _reset(self, kept: set[str]) -> None:
        self.close()
        make_directories(self._data_dir, self._directories)
        self._remove_all_but(self._data_dir, "", kept)

    def _remove_all_but(self, directory: Path, prefix: str, kept: set[str]) -> None:
        """Remove what ``directory`` (``prefix`` relative to the data dir) holds but the kept files and the node's
        own top-level names."""
        with os.scandir(directory) as entries:
            for entry in list(entries):
                relative = prefix + entry.name
                if not prefix and entry.name in KEPT_BY_RESET:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if any(path.startswith(relative + "/") for path in kept):
                        self._remove_all_but(Path(entry.path), relative + "/", kept)
                        continue
                    shutil.rmtree(entry.path)
                elif relative in kept:
                    continue
                else:
                    os.unlink(entry.path)
                self._directories.add(directory)

    def _sync(self) -> None:
        """fdatasync every file written, then fsync every directory changed (those removed since need none)."""
        for fd in self._unsynced.values():
            os.fdatasync(fd)
            self.fsyncs += 1
        self._unsynced.clear()
        self.fsyncs += fsync_directories(self._directories)

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def _close(self, path: str) -> None:
        fd = self._files.pop(path, None)
        if fd is not None:
            self._unsynced.pop(path, None)
            os.close(fd)

    def _close_all_but(self, kept: set[str]) -> None:
        for path in [path for path in self._files if path not in kept]:
            self._close(path)

    def close(self) -> None:
        """Close every file (on failure or stop: errors closing are of no use to anyone then)."""
        for fd in self._files.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._files.clear()
        self._unsynced.clear()
