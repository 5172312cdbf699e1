"""A follower's hot standby: recovery kept up to date while the leader's writes arrive, so that a promoted follower
reads only what arrived last before it serves, however deep its queues.

``Standby.catch_up()`` reads what was appended to the data dir's files since its last call with recovery's own
reader (``storage.recovery.RecordReader``): the definitions log's new records, then each segment's, new segments in
order. It reads complete records only, leaving a partial one at a file's end (a join's copy arrives in chunks) for
the next call. It follows the leader's other changes as recovery would find them: a spent segment deleted, a segment
compacted (the places of its live messages looked up again), the definitions log rewritten (read again), a queue
deleted (its messages below the deletion dropped). A join's copy, whose files arrive in no order it could follow,
is read once it is whole (``applied()`` tells it of the copy's frames): from the start when it is the first copy of
the leadership followed (``follows()``), whose files may hold another history than those read; else on from where
the standby was, as after any other frames. A copy of the same leadership (a follower that fell behind and joined
again) changed the files as the leader's frames would have, skipping steps as a catch-up does: the files it kept
grew, the others were compacted, rewritten or deleted by the leader meanwhile. (Reading them again from the start
cost a follower 12 to 17 s of CPU for 4 million messages, on a machine already too busy to ack in time.) Anything
else (damage, a file cut back, ids that do not increase, a segment compacted before it was read to its end) makes it
start again from the files on disk, at most once every ``RETRY_AFTER`` seconds. ``take()`` hands the reader to the
store's recovery, or None while the standby is not whole: then the store reads the data dir as at any start.

The standby only reads: the follower's writer (``storage.replica.ReplicaWriter``) keeps the data dir byte-identical
to the leader's, and a promoted follower's recovery repairs or marks what any start would.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from storage import records
from storage.definitions_log import DefinitionTable
from storage.recovered_messages import REMOVED, place
from storage.recovery import RecordReader
from storage.replica import RESET, Frame, kept_files
from storage.segments import DEFINITIONS_LOG, messages_directory, segment_numbers, segment_path

log = logging.getLogger(__name__)

RETRY_AFTER = 5.0  # seconds after a failed catch-up before the standby reads the data dir again from the start
GATHER = 0.05  # seconds the thread lets writes gather after a catch-up (take() reads what came meanwhile)
# a segment's bytes read between two chances for the other threads to run: the reader is compiled and keeps the
# interpreter throughout (1 MiB of the records of 16 B messages, 12,000 of them, held the follower's event loop 50
# to 130 ms; 64 KiB of dead-lettered messages' records up to 90 ms of CPU on a busy follower, where the stream's
# thread takes the interpreter again after each write and fdatasync of a group, and may wait a piece each time)
PIECE_BYTES = 16 << 10
SWEEP_BYTES = 64 << 20  # bytes read between sweeps that drop the removed messages from the queues' columns


class StartAgain(Exception):
    """What the files hold cannot be followed record by record: the text says why."""


@dataclass(slots=True)
class Tailed:
    """A file the standby reads as it grows."""

    inode: int  # the file's inode: another one means the file was rewritten (-1: rewritten, a copy sent it again)
    offset: int = 0  # bytes read (complete records)
    complete: bool = False  # a later segment existed when it was last read: nothing more will be appended to it


class Standby:
    """Recovery kept up to date on a follower's data dir (see the module's docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = Path(data_dir)
        self._segments_dir = messages_directory(self._data_dir)
        self._reader: RecordReader | None = None  # None: not whole (the next catch-up reads from the start)
        self._definitions: Tailed | None = None  # the definitions log, once read
        self._segments: dict[int, Tailed] = {}  # segment number -> how far it is read
        self._failed_at = 0.0  # monotonic time of the last failed catch-up (0: none)
        self._since_sweep = 0  # bytes read since the removed messages were last dropped from the columns
        self._wake = threading.Event()  # more was written: catch up
        self._halt = threading.Event()  # take() or stop() was called: the thread ends
        self._copies = 0  # join copies begun (RESETs applied)
        self._copies_read = 0  # of them, those the last catch-up took account of
        self._copying = False  # a join's copy is under way: nothing is read until it is whole
        self._leader = -1  # the epoch of the leadership followed (follows()); -1: none said
        self._files_of = -1  # the epoch of the leadership whose join copy the files hold (-1: none came yet)
        self._start_over = False  # a copy of another leadership came since the last catch-up: read from the start
        self._kept: set[str] | None = None  # the files every copy since the last catch-up kept (None: no copy came)
        self._copy_lock = threading.Lock()  # (the stream's thread says what a copy did, the standby's reads it)
        # it has read the data dir whole and kept up since (a hint for other threads: what take() gives decides)
        self.whole = False
        self._thread: threading.Thread | None = None
        self.restarts = 0  # times it started again from the files on disk

    # --- on a thread of its own ------------------------------------------------------------------------------
    def start(self) -> None:
        """Catch up on a thread of its own now, and after each group of frames ``applied()``."""
        self._thread = threading.Thread(target=self._run, name="standby", daemon=True)
        self._thread.start()

    def follows(self, epoch: int) -> None:
        """The follower follows the leadership of this epoch now (before its stream's first frame)."""
        self._leader = epoch

    def applied(self, frames: list[Frame]) -> None:
        """The follower's writer has made these frames durable (on the stream's thread). A join's copy (a RESET,
        then frames of sequence -1) is read once it is whole (see the module's docstring): its files arrive in no
        order the standby could follow record by record; the frames after it (sequence 0 and up) come as the leader
        wrote."""
        for sequence, ops in frames:
            resets = [op for op in ops if op[0] == RESET]
            if resets:
                kept = kept_files(resets[-1])
                with self._copy_lock:
                    if self._files_of == -1 or self._files_of != self._leader:
                        self._start_over = True
                    self._files_of = self._leader
                    self._kept = kept if self._kept is None else self._kept & kept
                    self._copies += 1
                self._copying = True
                self.whole = False
            elif sequence >= 0:
                self._copying = False
        self._wake.set()

    def _run(self) -> None:
        while not self._halt.is_set():
            self.catch_up()
            self._wake.wait()
            self._wake.clear()
            self._halt.wait(GATHER)

    def take(self) -> RecordReader | None:
        """Stop, read what arrived last, and hand the reader over (None: the standby is not whole); once."""
        self.stop()
        if self._thread is not None:
            self._thread.join()  # (a catch-up under way ends first)
        self._failed_at = 0.0  # a last try, however recent the last failure
        self.catch_up()
        reader, self._reader = self._reader, None
        return None if self._copying else reader

    def stop(self) -> None:
        """End its thread after the catch-up under way, if any (without waiting for it)."""
        self._halt.set()
        self._wake.set()

    # --- catching up ---------------------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Read what the data dir's files gained since the last call (after a failure, everything again, but not
        within RETRY_AFTER seconds of it)."""
        if self._copying or self._failed_at and time.monotonic() - self._failed_at < RETRY_AFTER:
            return
        with self._copy_lock:
            copies, start_over, kept = self._copies, self._start_over, self._kept
            self._start_over, self._kept = False, None
        if copies != self._copies_read:  # a join's copy since the last catch-up
            self._copies_read = copies
            if start_over:
                self._reader = None
            elif self._reader is not None and kept is not None:
                self._sent_again(kept)
        fresh = self._reader is None
        if fresh:
            self.whole = False
            self._reader = RecordReader(self._data_dir, self._segments_dir)
            self._definitions = None
            self._segments = {}
        started = time.monotonic()
        try:
            self._catch_up(self._reader)
        except (StartAgain, OSError) as why:
            log.info("the standby of %s reads its data dir again: %s", self._data_dir, why)
            self._reader = None
            self.whole = False
            self._failed_at = time.monotonic()
            self.restarts += 1
            return
        self._failed_at = 0.0
        if self._copies != copies:  # a copy began while it read: what it read may mix the two
            self._reader = None
            self.whole = False
            return
        self.whole = True
        if fresh:
            log.info("the standby of %s has read its data dir: %d messages in %.2f s", self._data_dir,
                     sum(len(messages.ids) - messages.removed for messages in self._reader.queues.values()),
                     time.monotonic() - started)

    def _sent_again(self, kept: set[str]) -> None:
        """A join's copy of the leadership followed kept these files; it deleted the others and sent the leader's
        whole: what was read of one of those may differ from it now, whatever its inode (a file made at once after
        one deleted often gets the deleted one's)."""
        if self._definitions is not None and DEFINITIONS_LOG not in kept:
            self._definitions.inode = -1
        for number, tailed in self._segments.items():
            if segment_path(self._segments_dir, number).relative_to(self._data_dir).as_posix() not in kept:
                tailed.inode = -1

    def _catch_up(self, reader: RecordReader) -> None:
        self._read_definitions(reader)
        numbers = segment_numbers(self._segments_dir)
        for position, number in enumerate(numbers):
            self._read_segment(reader, number, later=position + 1 < len(numbers))
        on_disk = set(numbers)  # (a segment deleted since the listing is found deleted by the next call)
        for number in [number for number in self._segments if number not in on_disk]:
            self._deleted(reader, number)
        if reader.misplaced or reader.repairs or reader.set_aside_definitions:
            raise StartAgain("the files need the repairs of a start")
        if self._since_sweep >= SWEEP_BYTES:
            self._since_sweep = 0
            for messages in reader.queues.values():
                if messages.removed > len(messages.ids) // 2:
                    messages.drop_removed()

    def _read_definitions(self, reader: RecordReader) -> None:
        path = self._data_dir / DEFINITIONS_LOG
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self._definitions is not None:
                raise StartAgain("the definitions log is gone") from None
            return
        try:
            stat = os.fstat(fd)
            tailed = self._definitions
            if tailed is None or tailed.inode != stat.st_ino or stat.st_size < tailed.offset:
                if tailed is not None:  # rewritten (a snapshot of the live definitions): read it all again
                    reader.definitions = DefinitionTable()
                tailed = self._definitions = Tailed(stat.st_ino)
            data = os.pread(fd, stat.st_size - tailed.offset, tailed.offset)
        finally:
            os.close(fd)
        if not data:
            return
        deleted_below = dict(reader.index.deleted_below)
        tailed.offset += self._read(reader, data, segment=False)
        reader.definitions_bytes = tailed.offset
        changed = [(queue, below) for queue, below in reader.index.deleted_below.items()
                   if deleted_below.get(queue) != below]
        for queue, below in changed:
            self._queue_deleted(reader, queue, below)

    def _read_segment(self, reader: RecordReader, number: int, later: bool) -> None:
        tailed = self._segments.get(number)
        path = segment_path(self._segments_dir, number)
        if tailed is not None and tailed.complete:
            try:
                if os.stat(path).st_ino == tailed.inode:
                    return  # (the usual case: one system call)
            except FileNotFoundError:
                return  # deleted since the listing (a start again from the whole data dir, until this was caught)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # deleted since the listing
        try:
            stat = os.fstat(fd)
            if tailed is None:
                head = reader.index.head
                if head is not None and number < head.number:
                    raise StartAgain(f"segment {number} appeared below segment {head.number}")
                reader.index.roll(number)
                tailed = self._segments[number] = Tailed(stat.st_ino)
            elif tailed.inode != stat.st_ino:
                if not tailed.complete:
                    raise StartAgain(f"segment {number} was rewritten before it was read to its end")
                self._compacted(reader, number, os.pread(fd, stat.st_size, 0), stat.st_ino)
                return
            if stat.st_size < tailed.offset:
                raise StartAgain(f"segment {number} was cut back to {stat.st_size} bytes")
            data = os.pread(fd, stat.st_size - tailed.offset, tailed.offset)
        finally:
            os.close(fd)
        if data:
            reader.segment = number
            reader.at = tailed.offset
            tailed.offset += self._read(reader, data, segment=True)
            reader.index.segments[number].size = tailed.offset
        if later:
            if tailed.offset < stat.st_size:
                raise StartAgain(f"segment {number} ends in a partial record, and a later one was begun")
            tailed.complete = True

    def _read(self, reader: RecordReader, data: bytes, segment: bool) -> int:
        """Apply data's complete records (a segment's, or the definitions log's); how many bytes they take (a
        partial record may follow). A segment's are read a piece at a time: between pieces a thread that waits for
        the interpreter gets it (the follower's event loop, and its stream thread, whose acks wait milliseconds, not
        the seconds a join's copy takes to read); one that does not wait costs nothing (pieces of 8 KiB, each
        followed by a time.sleep(0), stretched the failovers of tests/cluster/test_failover.py past 5 s)."""
        reader.count = 0
        taken = len(data)
        try:
            if segment:
                at = 0
                while at < len(data):  # (the interpreter checks for a waiting thread at each turn of this loop)
                    at = reader.segment_records(data, at, at + PIECE_BYTES)
            else:
                reader.definition_records(data, 0)
        except records.CorruptRecord as bad:
            taken, reason = bad.args
            if not partial(data, taken):
                raise StartAgain(f"a damaged record ({reason})") from None
        except Exception as error:  # recovery's _Unusable: an intact record that cannot be applied
            raise StartAgain(f"a record that cannot be applied ({error})") from None
        finally:
            reader.at = 0
        reader.report["records"] += reader.count
        reader.report["bytes"] += taken
        self._since_sweep += taken
        return taken

    def _deleted(self, reader: RecordReader, number: int) -> None:
        """A spent segment was deleted: its messages are gone, as a start finds them, whether or not the standby read
        the records that removed them (the leader deletes a segment only once nothing in it is live and no other
        depends on its records): a purge's watermark may come in a part of the definitions log not read yet, or be
        left out of a rewrite of it; a queue's removals may lie in the part of a deleted segment not read."""
        segment = reader.index.segments.get(number)
        if segment is None:
            raise StartAgain(f"segment {number} was deleted, and the index has no such segment")
        low, high = place(number, 0), place(number + 1, 0)
        for queue, messages in reader.queues.items():
            places, flags = messages.places, messages.flags
            live = [position for position in range(bisect_left(places, low), bisect_left(places, high))
                    if not flags[position] & REMOVED]
            if live:
                messages.gone(queue, live)
        reader.index.forget(segment)
        del self._segments[number]

    def _compacted(self, reader: RecordReader, number: int, data: bytes, inode: int) -> None:
        """Segment number was rewritten without its dead records: its live messages' records moved up. A message
        the rewrite left out, or left a queue out of, is gone from that queue as a start would find it (the leader
        compacts on what it has acked, before the ack's record is written)."""
        found: dict[int, tuple[int, frozenset[str]]] = {}  # message id -> where its publish is, the queues it lists
        publishes = records.PublishReader()
        try:
            for at, end, payload in records.scan(data):
                if payload[0] == records.PUBLISH:
                    msg_id, (queues, _, _, _), _ = publishes.read(data, at + records.FRAME_SIZE, end)
                    found[msg_id] = (at, frozenset(queue for queue, _ in queues))
        except records.CorruptRecord as bad:
            raise StartAgain(f"compacted segment {number}: a damaged record ({bad.args[1]})") from None
        low, high = place(number, 0), place(number + 1, 0)
        for queue, messages in reader.queues.items():
            places, ids, flags = messages.places, messages.ids, messages.flags
            gone = []  # positions
            last = low  # (a message left out keeps the place before it: the places stay in order)
            for position in range(bisect_left(places, low), bisect_left(places, high)):
                msg_id = ids[position]
                at, listed = found.get(msg_id, (-1, frozenset()))
                if at >= 0:
                    last = place(number, at)
                places[position] = last
                if queue not in listed and not flags[position] & REMOVED:
                    gone.append(position)
            if gone:
                messages.remove(queue, gone)
        self._segments[number] = Tailed(inode, len(data), True)
        reader.index.segments[number].size = len(data)

    def _queue_deleted(self, reader: RecordReader, queue: str, below: int) -> None:
        """The queue was deleted: its messages with lower ids than ``below`` are gone (as a start finds them)."""
        messages = reader.queues.get(queue)
        if messages is None:
            return
        ids, flags = messages.ids, messages.flags
        gone = [position for position in range(bisect_left(ids, below)) if not flags[position] & REMOVED]
        deleted_below = reader.index.deleted_below
        del deleted_below[queue]  # (remove() passes over the ids below a queue's deletion: gone already)
        messages.remove(queue, gone)
        deleted_below[queue] = below


def partial(data: bytes, at: int) -> bool:
    """Whether the record at ``at`` is whole but for bytes not yet written (rather than damaged)."""
    if len(data) - at < records.FRAME_SIZE:
        return True
    length, _ = records.FRAME.unpack_from(data, at)
    return 0 < length <= records.MAX_PAYLOAD and at + records.FRAME_SIZE + length > len(data)
