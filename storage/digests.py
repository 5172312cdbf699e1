"""What a join compares: each replicated file's size and SHA-256, kept up to date as the files are written.

A joining follower shows the leader what it holds (``file_digests``: each file's size and SHA-256), and the leader
keeps each file the follower holds as a prefix of its own (``cluster.replication``). Hashing every file at every
join costs both sides a second per 1.5 GB read, in the middle of a failover. ``RunningDigests`` instead follows the
ops that change the files (a follower's applied frames, a leader's tap) and hashes each write as it is made,
keeping the hash's state at every ``MARK`` bytes, so that the digest of a whole file costs nothing and the digest of
any prefix at most ``MARK`` bytes read. A kept digest is used only for the file it was made for (the same inode, the
same size, checked against the open file); any other file is hashed from disk, as is one a TRUNCATE cut back. What
changes the files without an op (recovery, as a follower becomes the leader) cuts them shorter or renames a new
file over them, so a digest kept for a file it no longer describes is never used.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Final, TypeAlias

from storage.replica import APPEND, DELETE, REPLACE, RESET, RMTREE, TRUNCATE, Op, ReplicaError, kept_files, \
    replicated_files

Digest: TypeAlias = tuple[str, int, str]  # (path relative to the data dir, size, sha256 of the content, hex)
MARK: Final = 1 << 20  # bytes between two kept states of a file's hash (and bytes read at once while hashing)


def file_digests(data_dir: Path, running: RunningDigests | None = None) -> list[Digest]:
    """What a follower already holds, for a join to send only what differs: each replicated file with its size and
    the SHA-256 of its content (from ``running`` where it has the file's, which then has every file's)."""
    digests = []
    for relative in replicated_files(data_dir):
        path = relative.as_posix()
        fd = os.open(data_dir / relative, os.O_RDONLY)
        try:
            status = os.fstat(fd)
            if running is None:
                digests.append((path, status.st_size, prefix_digest(fd, status.st_size)))
            else:
                digests.append((path, status.st_size, running.whole_digest(path, fd, status)))
        finally:
            os.close(fd)
    return digests


def prefix_digest(fd: int, size: int) -> str:
    """The SHA-256 (hex) of the first ``size`` bytes of the file open as ``fd`` (ReplicaError if it is shorter)."""
    return _hash_from(hashlib.sha256(), fd, 0, size).hexdigest()


def _hash_from(digest: hashlib._Hash, fd: int, offset: int, size: int, marks: list | None = None) -> hashlib._Hash:
    """``digest`` updated with the file's bytes from ``offset`` (a multiple of MARK) to ``size``; ``marks`` gets the
    state at each MARK boundary passed."""
    while offset < size:
        data = os.pread(fd, min(MARK, size - offset), offset)
        if not data:
            raise ReplicaError(f"a file shrank below {size} bytes while it was hashed")
        digest.update(data)
        offset += len(data)
        if marks is not None and offset % MARK == 0:
            marks.append(digest.copy())
    return digest


class RunningFile:
    """One file's SHA-256 as written so far, and its state at every MARK bytes."""

    __slots__ = ("inode", "size", "digest", "marks")

    def __init__(self, inode: int) -> None:
        self.inode = inode  # the file it follows (a file renamed over it is another)
        self.size = 0  # bytes hashed
        self.digest = hashlib.sha256()  # of those bytes
        self.marks = [self.digest.copy()]  # marks[k]: the state after k * MARK bytes (only ever appended to)

    def add(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            piece = view[:MARK - self.size % MARK]
            self.digest.update(piece)
            self.size += len(piece)
            view = view[len(piece):]
            if self.size % MARK == 0:
                self.marks.append(self.digest.copy())

    def follows(self, status: os.stat_result) -> bool:
        """Whether this is the digest of the file ``status`` describes."""
        return self.inode == status.st_ino and self.size == status.st_size

    def prefix_digest(self, fd: int, size: int) -> str:
        """The SHA-256 (hex) of the first ``size`` bytes (no more than were hashed) of the file open as ``fd``."""
        start = size // MARK
        return _hash_from(self.marks[start].copy(), fd, start * MARK, size).hexdigest()


class RunningDigests:
    """The digests of a data dir's replicated files, followed through the ops that change them (``follow``, on one
    thread at a time: a follower's stream, then the leader's writer)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = Path(data_dir)
        self._files: dict[str, RunningFile | None] = {}  # relative path -> its digest (None: cut back, not followed)

    def follow(self, ops: list[Op]) -> None:
        """Take in the ops, once they are applied to the files."""
        for kind, path, data in ops:
            if kind == APPEND:
                if path not in self._files:
                    self._files[path] = self._started(path)
                running = self._files[path]
                if running is not None:
                    running.add(data)
            elif kind == REPLACE:
                running = self._files[path] = self._started(path)
                if running is not None:
                    running.add(data)
            elif kind == DELETE:
                self._files.pop(path, None)
            elif kind == RMTREE:
                for inside in [known for known in self._files if known.startswith(path + "/")]:
                    del self._files[inside]
            elif kind == TRUNCATE:
                self._files[path] = None
            elif kind == RESET:
                kept = kept_files((kind, path, data))
                self._files = {known: running for known, running in self._files.items() if known in kept}

    def forget(self) -> None:
        """Follow nothing more: the files changed in ways not told (an op half applied)."""
        self._files.clear()

    def whole_digest(self, path: str, fd: int, status: os.stat_result) -> str:
        """The SHA-256 (hex) of the file open as ``fd``: the one followed, else hashed from disk and followed from
        now on."""
        running = self._files.get(path)
        if running is None or not running.follows(status):
            running = RunningFile(status.st_ino)
            _hash_from(running.digest, fd, 0, status.st_size, running.marks)
            running.size = status.st_size
            self._files[path] = running
        return running.digest.copy().hexdigest()

    def at_cut(self, files: list[tuple[str, int, int]]) -> dict[str, RunningFile]:
        """Of a cut's files (path, fd, size), those whose digest is followed, on the thread that follows them: their
        prefixes' digests can be had later (``RunningFile.prefix_digest``) while the files grow."""
        followed = {}
        for path, fd, size in files:
            running = self._files.get(path)
            if running is not None and running.follows(os.fstat(fd)):
                followed[path] = running
        return followed

    def _started(self, path: str) -> RunningFile | None:
        try:
            return RunningFile(os.stat(self._data_dir / path).st_ino)
        except OSError:  # gone already (a later op removes it): nothing to follow
            return None
