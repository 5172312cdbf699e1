"""Page files: where deep queues set aside the tail of their ready messages, so that a backlog is bounded by the
disk instead of the broker's memory.

Pages are opaque blobs to this module (the broker encodes them): a page is written once, read back once, then
released. They need no durability (after a crash or restart the message store is the truth, and every page file
is deleted at start), so nothing is fsynced. Writes and reads run on one background thread, in submission order,
and report back on the event loop; the loop itself only assigns file offsets. Each queue's pages go to numbered
chunk files of its own, and a chunk is deleted once every page in it has been released, so a queue that keeps
flowing through its page file does not grow it without end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 20  # a chunk file takes no further page once this full


class PageLocation(NamedTuple):
    chunk: int  # the chunk file's number within its page file
    offset: int  # where the page starts in it
    length: int


class _Chunk:
    __slots__ = ("fd", "path", "size", "pages")

    def __init__(self, fd: int, path: Path):
        self.fd = fd
        self.path = path
        self.size = 0  # bytes assigned to pages so far (written or being written)
        self.pages = 0  # pages in it not released yet


class PageStore:
    """The page files of one broker, under one directory that belongs to it alone (emptied at start), and the
    thread that writes and reads them."""

    def __init__(self, directory: Path, chunk_bytes: int = CHUNK_BYTES):
        self.directory = Path(directory)
        self.chunk_bytes = chunk_bytes
        self._executor: ThreadPoolExecutor | None = None  # made on first use
        self._loop: asyncio.AbstractEventLoop | None = None  # where completions are reported
        self._next_file = 0  # number of the next page file opened
        self._write_failing = False  # the last write failed (logged once per run of failures)
        self.pages_written = 0
        self.pages_read = 0

    def start(self) -> None:
        """Delete what an earlier run left (pages are never read across restarts) and make the directory."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)

    def open(self) -> "PageFile":
        self._next_file += 1
        return PageFile(self, self._next_file)

    def close(self) -> None:
        """Wait for the thread to finish what it was given, then delete every page file."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def submit(self, work: Callable, *args, done: Callable[[object, OSError | None], None]) -> None:
        """Run work(*args) on the thread; done(result, error) follows on the loop (error: the OSError it raised)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-pages")
            self._loop = asyncio.get_running_loop()
        loop = self._loop

        def report(future: Future) -> None:
            error = future.exception()
            if error is not None and not isinstance(error, OSError):
                log.error("page file work failed: %s: %s", type(error).__name__, error)
                error = OSError(str(error))
            try:
                loop.call_soon_threadsafe(done, None if error else future.result(), error)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                pass

        self._executor.submit(work, *args).add_done_callback(report)

    def write_outcome(self, path: Path, error: OSError | None) -> None:
        """Log a failed write once per run of failures (the broker keeps such a page in memory instead)."""
        if error is None:
            self.pages_written += 1
            if self._write_failing:
                self._write_failing = False
                log.warning("page files can be written again")
        elif not self._write_failing:
            self._write_failing = True
            log.warning("cannot write page file %s: %s; deep queues keep their messages in memory meanwhile",
                        path, error.strerror or error)


class PageFile:
    """The pages of one queue: write(data) assigns a place and writes it behind the loop's back; read(location)
    fetches it back; release(location) once it is no longer needed. A chunk takes pages until it is full, and is
    deleted as soon as none of its pages is needed."""

    def __init__(self, store: PageStore, number: int):
        self.store = store
        self.number = number
        self.chunks: dict[int, _Chunk] = {}  # chunk number -> open chunk file
        self.current = -1  # the number of the chunk new pages go to (while it is in chunks)

    def _chunk_for(self, length: int) -> tuple[int, _Chunk]:
        chunk = self.chunks.get(self.current)
        if chunk is None or chunk.size + length > self.store.chunk_bytes:
            self.current += 1
            path = self.store.directory / f"{self.number:08d}.{self.current:08d}.page"
            chunk = self.chunks[self.current] = _Chunk(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600), path)
        return self.current, chunk

    def write(self, data: bytes, done: Callable[[bool], None]) -> PageLocation:
        """Give data a place and write it there; done(ok) on the loop once written (or not: ok False)."""
        number, chunk = self._chunk_for(len(data))
        location = PageLocation(number, chunk.size, len(data))
        chunk.size += len(data)
        chunk.pages += 1
        path = chunk.path

        def written(_result, error: OSError | None) -> None:
            self.store.write_outcome(path, error)
            done(error is None)

        self.store.submit(_write_at, chunk.fd, data, location.offset, done=written)
        return location

    def read(self, location: PageLocation, done: Callable[[bytes | None], None]) -> None:
        """Fetch a written page; done(data) on the loop, or done(None) if it cannot be read (logged)."""
        chunk = self.chunks[location.chunk]

        def fetched(data, error: OSError | None) -> None:
            if error is not None:
                log.error("cannot read page file %s: %s", chunk.path, error.strerror or error)
            else:
                self.store.pages_read += 1
            done(None if error is not None else data)

        self.store.submit(_read_at, chunk.fd, location.length, location.offset, done=fetched)

    def read_now(self, location: PageLocation) -> bytes | None:
        """The same, on the calling thread (when the loop needs a page at once); None if it cannot be read."""
        chunk = self.chunks[location.chunk]
        try:
            data = _read_at(chunk.fd, location.length, location.offset)
        except OSError as error:
            log.error("cannot read page file %s: %s", chunk.path, error.strerror or error)
            return None
        self.store.pages_read += 1
        return data

    def release(self, location: PageLocation) -> None:
        """The page is no longer needed: its chunk goes once none of its pages is (the next page starts another)."""
        chunk = self.chunks.get(location.chunk)
        if chunk is None:
            return
        chunk.pages -= 1
        if not chunk.pages:
            self._delete(location.chunk)

    def discard(self) -> None:
        """Every page is released at once (the queue was purged or deleted)."""
        for number in list(self.chunks):
            self._delete(number)

    def _delete(self, number: int) -> None:
        chunk = self.chunks.pop(number)
        self.store.submit(_remove, chunk.fd, chunk.path, done=_ignore)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _read_at(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise OSError(f"short read: {len(data)} of {length} bytes at offset {offset}")
    return data


def _remove(fd: int, path: Path) -> None:
    os.close(fd)
    path.unlink(missing_ok=True)


def _ignore(_result, error: OSError | None) -> None:
    if error is not None:
        log.warning("cannot remove a spent page file: %s", error.strerror or error)
