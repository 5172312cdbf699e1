"""The one thread that touches the store's files: write a batch, one fdatasync per file, report back.

The event loop hands over a batch only when the previous one is done, so everything appended meanwhile forms the
next batch (group commit). Each batch comes back with one ``loop.call_soon_threadsafe``. Between batches the thread
advances compactions a slice at a time: whenever no batch is waiting, and in any case by ``COMPACTION_PACE`` input
bytes per byte written, so that compactions keep up with publishers that keep the writer busy without a pause.

The thread never stops serving before the final batch: a failed write (OSError: disk full, EIO) or a bug (any other
exception, logged CRITICAL with its traceback) fails that batch, whose callbacks get False, and a failed compaction
step abandons that compaction. Should the thread die all the same, it says so (``died``) and the store refuses
every later batch itself.

Replication (``tap``, ``storage.replica``): with a tap set, every change the thread makes to the data dir is also
handed to it as a frame of ops with the next ``sequence``: a batch's writes before its own fdatasync (so that
followers write while the leader syncs), then its deletions, a finished compaction, or the TRUNCATEs that undo a
failed batch. A batch asking for a ``cut`` gets it once written: the replicated files, opened and sized between two
batches, so that what they hold up to those sizes plus every later frame is the leader's data dir.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from storage.compaction import Compaction
from storage.histogram import Histogram
from storage.records import CorruptRecord
from storage.replica import APPEND, DELETE, REPLACE, RMTREE, Op, replicated_files, truncate_op
from storage.segments import (
    CLEAN_MARKER, DEFINITIONS_LOG, fsync_directories, fsync_directory, open_appending, segment_path, write_synced,
)

log = logging.getLogger(__name__)

COMPACTION_PACE = 2  # compaction input bytes owed per byte written: a segment may be rewritten twice as it empties
FAILURE_SAID_EVERY = 10.0  # seconds between two log lines of failed writes, at most
NO_ROOM = frozenset((errno.ENOSPC, errno.EDQUOT))  # a write failed for want of room (the disk, or the user's quota)

Tap = Callable[[int, list[Op]], None]  # tap(sequence, ops), on the writer thread
# cut(sequence, [(relative path, fd open for reading, size)]): the files as of that sequence; the receiver closes fds
Cut = Callable[[int, list[tuple[str, int, int]]], None]


@dataclass(slots=True)
class Batch:
    chunks: list[tuple[int, bytearray]]  # (segment number, bytes to append), in order
    definitions: bytes = b""  # bytes to append to the definitions log
    definitions_snapshot: bytes | None = None  # replaces the definitions log (then ``definitions`` is ignored)
    # run with the outcome once written (each with the store's count of failed batches when it was asked for)
    callbacks: list[tuple[Callable[[bool], None], int]] = field(default_factory=list)
    published: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (msg id, queues) to undo on failure
    deletions: list[int] = field(default_factory=list)  # segments to unlink once this batch is durable
    compactions: list[Compaction] = field(default_factory=list)  # rewrites to start once this batch is durable
    resets: list[Path] = field(default_factory=list)  # stream directories to remove before the appends below
    files: list[tuple[Path, bytes]] = field(default_factory=list)  # appends to stream segments (storage.streams)
    unlinks: list[Path] = field(default_factory=list)  # stream segments to remove once durable (retention)
    streams: list[Callable[[bool], None]] = field(default_factory=list)  # stream logs told the outcome first
    final: bool = False  # the store is closing: leave the clean-shutdown marker, then stop
    cut: Cut | None = None  # given the replicated files held open once this batch is written (a joining follower)
    sequence: int = 0  # the writer's frame sequence once this batch was written: the last frame covering it


BATCH_MESSAGES_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SYNC_SECONDS_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Writer:
    def __init__(
        self, segments_dir: Path, data_dir: Path, written: Callable[[Batch, bool], None],
        compacted: Callable[[Compaction], None], died: Callable[[], None],
    ) -> None:
        self._segments_dir = segments_dir
        self._data_dir = data_dir
        self._written = written  # posted to the loop after each batch
        self._compacted = compacted  # posted to the loop after each compaction (size None if it failed)
        self._died = died  # posted to the loop if the thread ends other than after the final batch
        self.loop: asyncio.AbstractEventLoop | None = None  # where reports go (set by the store before any batch)
        self._inbox: queue.SimpleQueue[Batch] = queue.SimpleQueue()
        self._files: dict[int, int] = {}  # segment number -> open fd (the head, and the previous head briefly)
        self._sizes: dict[int, int] = {}  # segment number -> durable size of the open file
        self._definitions_fd = -1
        self._stream_files: dict[Path, int] = {}  # stream segment -> open fd (those the last batch appended to)
        self._stream_sizes: dict[Path, int] = {}  # stream segment -> durable size of the open file
        # directories whose entries changed (a file or directory made, a file renamed over) and are not fsynced yet:
        # fsynced once per batch, before it is reported; kept for the next batch if that one failed
        self._unsynced_directories: set[Path] = set()
        self._definitions_size = 0
        self._jobs: deque[tuple[Compaction, Iterator[int]]] = deque()  # compactions and their step iterators
        self._compaction_owed = 0  # input bytes compactions get before the next batch, even if one is waiting
        self.failed = False  # a write failed and could not be undone: every later batch fails too
        # when a failed write (an OSError) was last logged: on a full disk, writes that fit and writes that do not
        # alternate, one of each per client action, so failures are said once per FAILURE_SAID_EVERY at most
        self._failure_said_at = -FAILURE_SAID_EVERY
        self._compaction_failing = False  # the last compaction failed for an OSError (logged once per run of them)
        self.batches = 0  # batches written
        self.fsyncs = 0  # fdatasync/fsync calls made for batches
        self.bytes_written = 0
        self.batch_messages = Histogram(BATCH_MESSAGES_BOUNDS)  # messages written per batch (group commit size)
        self.sync_seconds = Histogram(SYNC_SECONDS_BOUNDS)  # time each batch's fdatasync calls took together
        # when the thread last finished a batch (written or failed) or a compaction's slice: a leader's lease is kept
        # while it moves (between two batches of a deep settlement, 2 to 28 MB of compaction owed took up to 1.5 s)
        self.progress = time.monotonic()
        self.tap: Tap | None = None  # handed every change to the files as a frame (set once, by the store)
        self.sequence = 0  # the last frame's sequence
        self._frame: list[Op] | None = None  # ops not yet handed to the tap (None: no tap for this batch)
        self._thread = threading.Thread(target=self._run, name="warren-store-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self._inbox.put(batch)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:
            log.critical("store writer thread died: every later durable write is refused", exc_info=True)
            self._post(self._died)

    def _serve(self) -> None:
        while True:
            if self._jobs:
                if self._compaction_owed > 0:
                    self._compaction_owed -= self._step_compaction()
                    self.progress = time.monotonic()
                    continue
                try:
                    batch = self._inbox.get_nowait()
                except queue.Empty:
                    self._step_compaction()
                    self.progress = time.monotonic()
                    continue
            else:
                self._compaction_owed = 0
                batch = self._inbox.get()
            ok = self._write(batch)
            if batch.cut is not None:
                self._take_cut(batch.cut)
            batch.sequence = self.sequence
            self.progress = time.monotonic()
            self._post(self._written, batch, ok)
            if batch.final:
                self._stop(clean=ok)
                return

    def _post(self, function: Callable, *args: object) -> None:
        if self.loop is None:
            return
        try:
            self.loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            pass

    def _write(self, batch: Batch) -> bool:
        """Write and fdatasync the batch, then act on it; on any failure cut the files back and return False. A
        batch the disk had no room for still frees what it lets go (its spent segments, and the stream segments
        retention let go), for the batches after it: deleting a segment whose messages are all gone only makes
        their removal final, though the records that say so are not written, and on a full disk it is the only way
        out (a spent segment that waited for a batch to succeed would wait for ever)."""
        if self.failed:
            return False
        error = self._try(batch)
        if isinstance(error, OSError) and error.errno in NO_ROOM and not self.failed:
            self._apply_deletions(batch.deletions)
            self._apply_unlinks(batch.unlinks)
            self._tell_tap("the deletions of a batch the disk had no room for")
            batch.deletions, batch.unlinks = [], []  # (done: not asked of the next batch again)
        if error is not None:
            if not isinstance(error, OSError):
                log.critical("store write failed, %d callbacks get a failure", len(batch.callbacks), exc_info=error)
            elif time.monotonic() - self._failure_said_at >= FAILURE_SAID_EVERY:
                log.error("store write failed, %d callbacks get a failure: %s", len(batch.callbacks), error)
                self._failure_said_at = time.monotonic()
            return False
        self.batches += 1
        try:
            self._after_durable(batch)
        except Exception:
            log.critical("store housekeeping after a batch failed (the batch itself is on disk)", exc_info=True)
        self._tell_tap("the deletions after a batch")
        return True

    def _try(self, batch: Batch) -> Exception | None:
        """Append the batch and make it durable; on any failure cut the files back and return the error."""
        touched: dict[int, int] = {}  # fd -> size before this batch
        self._frame = None if self.tap is None else []
        try:
            self._append(batch, touched)
        except Exception as error:
            self._roll_back(touched)
            return error
        return None

    def _append(self, batch: Batch, touched: dict[int, int]) -> None:
        """Write the batch's bytes and make them durable, with the entries of any file it made; ``touched`` gets
        each fd's size before, as it goes."""
        for number, data in batch.chunks:
            if not data:
                continue
            fd = self._files.get(number)
            if fd is None:
                fd = open_appending(segment_path(self._segments_dir, number), self._unsynced_directories)
                self._files[number] = fd
                self._sizes[number] = os.fstat(fd).st_size
            touched.setdefault(fd, self._sizes[number])
            self._write_all(fd, data)
            self._sizes[number] += len(data)
            if self._frame is not None:
                # (the chunk itself, not a copy: the store appends to a new one once it handed this batch over)
                self._frame.append((APPEND, self._relative(segment_path(self._segments_dir, number)), data))
        self._remove_stream_directories(batch.resets)
        self._append_stream_chunks(batch.files, touched)
        if batch.definitions_snapshot is not None:
            self._replace_definitions(batch.definitions_snapshot)
        elif batch.definitions:
            fd = self._open_definitions()
            touched.setdefault(fd, self._definitions_size)
            self._write_all(fd, batch.definitions)
            self._definitions_size += len(batch.definitions)
            if self._frame is not None:
                self._frame.append((APPEND, DEFINITIONS_LOG, batch.definitions))
        self._flush_frame()
        started = time.perf_counter()
        for fd in touched:
            os.fdatasync(fd)
            self.fsyncs += 1
        self.sync_seconds.observe(time.perf_counter() - started)
        self.batch_messages.observe(len(batch.published))
        self.fsyncs += fsync_directories(self._unsynced_directories)

    def _remove_stream_directories(self, directories: list[Path]) -> None:
        """Deleted streams (or what an earlier stream of a name declared anew left) go before any chunk of the batch
        is appended, and the removal is durable before the batch's definitions are."""
        for path in [path for path in self._stream_files if path.parent in directories]:
            self._close_stream_file(path)
        removed = [directory for directory in dict.fromkeys(directories) if directory.exists()]
        for directory in removed:
            if self._frame is not None:  # told even if the removal fails halfway: the store retries it
                self._frame.append((RMTREE, self._relative(directory), b""))
            shutil.rmtree(directory)
        if removed:
            fsync_directory(removed[0].parent)
            self.fsyncs += 1

    def _append_stream_chunks(self, files: list[tuple[Path, bytes]], touched: dict[int, int]) -> None:
        """Append stream chunks to their segments (closing those no longer appended to), making any segment or
        stream directory that is missing."""
        if not files and not self._stream_files:
            return
        appended = set()
        for path, data in files:
            fd = self._stream_files.get(path)
            if fd is None:
                fd = open_appending(path, self._unsynced_directories)
                self._stream_files[path] = fd
                self._stream_sizes[path] = os.fstat(fd).st_size
            touched.setdefault(fd, self._stream_sizes[path])
            self._write_all(fd, data)
            self._stream_sizes[path] += len(data)
            appended.add(path)
            if self._frame is not None:
                self._frame.append((APPEND, self._relative(path), data))
        for path in [path for path in self._stream_files if path not in appended]:
            self._close_stream_file(path)

    def _close_stream_file(self, path: Path) -> None:
        os.close(self._stream_files.pop(path))
        del self._stream_sizes[path]

    def _after_durable(self, batch: Batch) -> None:
        """Start the batch's compactions, close segments left behind, unlink the spent ones."""
        for job in batch.compactions:
            self._jobs.append((job, job.steps()))
        if self._jobs:
            self._compaction_owed += COMPACTION_PACE * sum(len(data) for _, data in batch.chunks)
        self._close_old_segments()
        self._apply_deletions(batch.deletions)
        self._apply_unlinks(batch.unlinks)

    def _write_all(self, fd: int, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        self.bytes_written += len(data)

    def _roll_back(self, touched: dict[int, int]) -> None:
        """Cut every file back to its size before the failed batch, so no torn record sits mid-log."""
        try:
            for fd, size in touched.items():
                os.ftruncate(fd, size)
                os.fdatasync(fd)
        except Exception:
            log.critical("store cannot undo a failed write, refusing further writes", exc_info=True)
            self.failed = True
            return
        cut_back: list[Op] = []  # TRUNCATE ops, for the tap
        for number, fd in self._files.items():
            if fd in touched:
                self._sizes[number] = touched[fd]
                cut_back.append(truncate_op(self._relative(segment_path(self._segments_dir, number)), touched[fd]))
        for path, fd in self._stream_files.items():
            if fd in touched:
                self._stream_sizes[path] = touched[fd]
                cut_back.append(truncate_op(self._relative(path), touched[fd]))
        if self._definitions_fd in touched:
            self._definitions_size = touched[self._definitions_fd]
            cut_back.append(truncate_op(DEFINITIONS_LOG, self._definitions_size))
        if self._frame is not None:
            # what the tap was not told yet, less the appends the cut undid
            self._frame = [op for op in self._frame if op[0] != APPEND] + cut_back
            self._tell_tap("the undoing of a failed batch")

    def _close_old_segments(self) -> None:
        newest = max(self._files, default=None)
        for number in [n for n in self._files if n != newest]:
            os.close(self._files.pop(number))
            del self._sizes[number]

    def _open_definitions(self) -> int:
        if self._definitions_fd < 0:
            self._definitions_fd = open_appending(self._data_dir / DEFINITIONS_LOG, self._unsynced_directories)
            self._definitions_size = os.fstat(self._definitions_fd).st_size
        return self._definitions_fd

    def _replace_definitions(self, content: bytes) -> None:
        if self._definitions_fd >= 0:  # closed first: appends must never go to the file the rename replaces
            os.close(self._definitions_fd)
            self._definitions_fd = -1
        path = self._data_dir / DEFINITIONS_LOG
        temporary = path.with_suffix(".snapshot")
        write_synced(temporary, content)
        self.bytes_written += len(content)
        self.fsyncs += 1
        os.replace(temporary, path)
        if self._frame is not None:
            self._frame.append((REPLACE, DEFINITIONS_LOG, content))
        self._unsynced_directories.add(self._data_dir)

    def _apply_deletions(self, numbers: list[int]) -> None:
        if not numbers:
            return
        self._drop_compactions(set(numbers))
        try:
            for number in numbers:
                fd = self._files.pop(number, None)
                if fd is not None:
                    os.close(fd)
                    del self._sizes[number]
                path = segment_path(self._segments_dir, number)
                path.unlink(missing_ok=True)
                if self._frame is not None:
                    self._frame.append((DELETE, self._relative(path), b""))
            fsync_directory(self._segments_dir)
        except OSError as error:
            log.error("store could not delete a spent segment: %s", error)

    def _apply_unlinks(self, paths: list[Path]) -> None:
        """Remove the stream segments retention let go."""
        if not paths:
            return
        try:
            for path in paths:
                if path in self._stream_files:
                    self._close_stream_file(path)
                path.unlink(missing_ok=True)
                if self._frame is not None:
                    self._frame.append((DELETE, self._relative(path), b""))
            for directory in {path.parent for path in paths}:
                fsync_directory(directory)
        except OSError as error:
            log.error("store could not remove %s: %s", path, error)

    def _drop_compactions(self, numbers: set[int]) -> None:
        """Segments about to be deleted need no rewrite: stop theirs (the store has forgotten them already)."""
        for job, steps in [(job, steps) for job, steps in self._jobs if job.segment.number in numbers]:
            steps.close()
            job.abandon()
            self._jobs.remove((job, steps))

    def _step_compaction(self) -> int:
        """Advance the oldest compaction by a slice; return the input bytes it handled."""
        job, steps = self._jobs[0]
        try:
            return next(steps)
        except StopIteration:
            log.debug("compacted segment %d to %d bytes", job.segment.number, job.size)
            self._compaction_failing = False
            self._tell_compacted(job)
        except OSError as error:
            if not self._compaction_failing:  # (once per run of failures: a full disk fails each retry)
                log.error("compaction of segment %d failed: %s", job.segment.number, error)
            self._compaction_failing = True
            job.abandon()
            job.size = None
        except CorruptRecord as error:
            offset, reason = error.args
            log.error("compaction of segment %d stopped at damage (%s at offset %d) that appeared since start: the "
                      "segment is kept as it is, and the next start reads past the damage", job.segment.number,
                      reason, offset)
            job.abandon()
            job.size = None
        except Exception:
            log.critical("compaction of segment %d failed", job.segment.number, exc_info=True)
            job.abandon()
            job.size = None
        self._jobs.popleft()
        self._post(self._compacted, job)
        return 0

    # --- replication --------------------------------------------------------------------------------------------
    def _relative(self, path: Path) -> str:
        return path.relative_to(self._data_dir).as_posix()

    def _flush_frame(self) -> None:
        """Hand the ops made since the last frame to the tap as the next frame (an exception is the caller's)."""
        frame, tap = self._frame, self.tap
        if not frame or tap is None:
            return
        self.sequence += 1
        tap(self.sequence, frame)
        self._frame = []

    def _tell_tap(self, what: str) -> None:
        """_flush_frame where nothing can be undone any more: a failing tap is logged, and what it missed is lost."""
        try:
            self._flush_frame()
        except Exception:
            log.critical("store replication tap failed on %s: followers miss that frame", what, exc_info=True)
            self._frame = []

    def _tell_compacted(self, job: Compaction) -> None:
        """A segment's rewrite is renamed into place: the tap gets its new content."""
        if self.tap is None:
            return
        path = segment_path(self._segments_dir, job.segment.number)
        try:
            self._frame = [(REPLACE, self._relative(path), path.read_bytes())]
        except OSError as error:
            log.error("store cannot read back compacted segment %s for its followers, they keep the segment as it "
                      "was: %s", path, error)
            return
        self._tell_tap("a compaction")

    def _take_cut(self, cut: Cut) -> None:
        """Hand ``cut`` the replicated files, each held open with its size as of now, between two batches."""
        held: list[tuple[str, int, int]] = []
        try:
            for relative in replicated_files(self._data_dir):
                try:
                    fd, size = _open_sized(self._data_dir / relative)
                except FileNotFoundError:  # a stream segment retention removed meanwhile: not part of the cut
                    continue
                held.append((relative.as_posix(), fd, size))
        except Exception as error:  # OSError (say too many open files) or a bug: the thread goes on either way
            for _, fd, _ in held:
                os.close(fd)
            log.error("store cannot take a cut of its files for a joining follower: %r", error)
            held = []
            sequence = -1  # the receiver learns the cut failed
        else:
            sequence = self.sequence
        try:
            cut(sequence, held)
        except Exception:
            log.critical("store cut receiver failed", exc_info=True)

    def _stop(self, clean: bool) -> None:
        for job, steps in self._jobs:
            steps.close()
            job.abandon()
        self._jobs.clear()
        for fd in [*self._files.values(), *self._stream_files.values()]:
            os.close(fd)
        self._files.clear()
        self._stream_files.clear()
        if self._definitions_fd >= 0:
            os.close(self._definitions_fd)
        if clean:
            try:
                (self._data_dir / CLEAN_MARKER).touch()
                fsync_directory(self._data_dir)
            except OSError as error:
                log.error("store could not mark its clean shutdown: %s", error)


def _open_sized(path: Path) -> tuple[int, int]:
    """The file open for reading, and its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
