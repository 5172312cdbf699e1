"""MessageStore: the broker's one entry point to durable messages and definitions."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from functools import partial
from itertools import islice
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final

from storage import records
from storage.compaction import Compaction
from storage.definitions_log import DefinitionTable
from storage.index import MessageIndex, Segment
from storage.lock import DataDirLock, DataDirLocked
from storage.recovered_messages import PLACE_BITS, RecoveredMessages, StoredMessage, StoredRun, place
from storage.recovery import RecordReader, Recovered, recover
from storage.salvage import Quarantine
from storage.segments import fsync_directory, messages_directory, segment_path
from storage.standby import Standby
from storage.streams import StreamLogs
from storage.writer import Batch, Cut, Tap, Writer

__all__ = ["DataDirLocked", "MessageStore", "Recovered", "RecoveredMessages", "StoredMessage"]

log = logging.getLogger(__name__)

SEGMENT_BYTES: Final = 16 << 20  # a segment is closed once this full (records never span two segments)
COMPACT_RATIO: Final = 0.5  # rewrite a closed segment once this share of its (queue, message) pairs is gone
MIN_COMPACT_BYTES: Final = 1 << 20  # smaller segments are not worth a rewrite (they go once empty)
DEFINITIONS_SLACK: Final = 64 << 10  # snapshot the definitions log when it outgrows twice the live state plus this
STOP_TIMEOUT: Final = 60.0  # seconds close() waits for the writer to write the last batch and stop
ID_RECORD_IDS: Final = 16384  # ids gathered for one REMOVED or DELIVERED record, at most (its compaction's step)
REMOVAL_SLICE: Final = 16384  # ids of a large removal (a purge of a deep queue) marked per loop turn
PROBE_INTERVAL: Final = 1.0  # seconds between two tries of the disk while writes fail and nothing else is written
COMPACTION_RETRY: Final = 1.0  # seconds before a segment whose compaction failed is compacted again
HEALTH_SAID_EVERY: Final = 10.0  # seconds between two logged turns of the store's health to failing, at most


class MessageStore:
    """Durable messages and definitions in an append-only, segmented log with group commit.

    Every method runs on the event loop thread. ``append_*`` only add bytes to the pending batch; the writer thread
    turns each batch into one write and one fdatasync per file.

    Health: a batch that cannot be written makes the store unhealthy, and the next batch that writes anything makes
    it healthy again; ``on_health(healthy)`` is called on the loop at each change (before the batch's callbacks).
    Every batch is still tried while unhealthy, so ``when_durable`` callbacks get their answer (False) promptly, and
    a record that changes nothing is written every ``PROBE_INTERVAL`` seconds, so that health comes back once the
    disk takes writes again even if nothing else is written (publishers are blocked by then).
    """

    def __init__(
        self, data_dir: Path, loop: asyncio.AbstractEventLoop | None = None, *, segment_bytes: int = SEGMENT_BYTES,
        compact_ratio: float = COMPACT_RATIO, min_compact_bytes: int = MIN_COMPACT_BYTES,
        on_health: Callable[[bool], None] | None = None, stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self._data_dir = Path(data_dir)
        self._segments_dir = messages_directory(self._data_dir)
        self._loop = loop  # None: the running loop at the first append
        self._segment_bytes = segment_bytes
        self._compact_ratio = compact_ratio
        self._paused_compactions: set[int] = set()  # segments whose compaction failed, until it is tried again
        self._failing_said = False  # the log said writes fail, and not yet that they succeed again
        self._failing_said_at = -HEALTH_SAID_EVERY  # (the loop's time) when it last said so
        self._min_compact_bytes = min_compact_bytes
        self._stop_timeout = stop_timeout
        self._lock = DataDirLock(self._data_dir)  # held from recover() until close()
        self._index: MessageIndex | None = None  # set by recover()
        self._definitions: DefinitionTable | None = None  # set by recover()
        self._writer = Writer(
            self._segments_dir, self._data_dir, self._on_written, self._on_compacted, self._on_writer_died
        )
        self._writer.loop = loop
        self._chunks: list[tuple[int, bytearray]] = []  # pending segment bytes, per segment
        self._buffer = bytearray()  # the last of _chunks: where appends go
        self._pending_definitions = bytearray()
        # durability callbacks for the next batch, each with the number of batches that had failed when it was asked
        self._callbacks: list[tuple[Callable[[bool], None], int]] = []
        self._published: list[tuple[int, tuple[str, ...]]] = []  # publishes in the pending batch
        # REMOVED/DELIVERED ids by (record type, queue), gathered until the batch is taken (or the head rolls), so
        # that a turn's acks or deliveries from one queue make one record rather than one each
        self._pending_ids: dict[tuple[int, str], array] = {}
        # Removals of more than REMOVAL_SLICE ids (a purge of a deep queue), marked in the index a slice a loop turn:
        # (queue, the ids not marked yet), first first; and the durability callbacks that wait for the last slice
        self._removals: deque[tuple[str, Iterator[int]]] = deque()
        self._after_removals: list[tuple[Callable[[bool], None], int]] = []
        self._failures = 0  # batches that failed so far (a durability callback fails if one did since it was asked)
        self._deletions: list[int] = []  # spent segments whose unlink failed with a batch: retried with the next
        self._definitions_log_bytes = 0  # definitions log size once the pending batch is written
        self._snapshot_due = False  # rewrite the definitions log with the next batch
        self._kick_scheduled = False  # a hand-over is queued on the loop for this turn
        self._in_flight: Batch | None = None  # the batch the writer holds (one at a time)
        self._writer_dead = False  # the writer thread died: every batch fails at once
        self._head_on_disk = False  # a batch wrote to the head segment: a failed write rolls away from it
        self._closed = False
        self._healthy = True  # the last batch that wrote something (or failed) was written
        self._probe_timer: asyncio.TimerHandle | None = None  # the next try of the disk while unhealthy
        self.on_health = on_health  # called with the new health on each change
        self.streams = StreamLogs(self._data_dir / "streams", self._wake)  # stream queues' own logs
        self.callback_errors = 0  # callbacks that raised (logged)
        # replication: gate(sequence, release) holds a batch's callbacks until release() (None: they run at once)
        self._gate: Callable[[int, Callable[[], None]], None] | None = None
        self._sequence = 0  # the writer's frame sequence as of the last batch reported (what a gate waits for)
        self._cuts: list[Cut] = []  # cuts requested, one per batch from the next on

    # --- start-up -------------------------------------------------------------------------------------------
    def recover(self, standby: Standby | None = None) -> Recovered:
        """Read everything back (synchronously, before serving); truncates a torn tail. Call once, first. A
        follower's ``standby`` hands over what it has read, and only the rest is read.

        Locks the data dir first: DataDirLocked if another store holds it."""
        self._lock.acquire()
        try:
            return self._recover(standby.take if standby is not None else None)
        except BaseException:
            self._lock.release()
            raise

    def _recover(self, take_standby: Callable[[], RecordReader | None] | None) -> Recovered:
        state = recover(self._data_dir, self._segments_dir, take_standby)
        self._index = state.index
        self._definitions = state.definitions
        self._definitions_log_bytes = state.definitions_log_bytes
        head = self._index.roll(state.next_segment)
        self._new_chunk(head.number)
        self._delete_spent_segments()
        self._writer.start()
        report = state.recovered.report
        log.info(
            "recovered %d messages, %d records, %d bytes in %.3f s%s (torn tail: %d bytes; corrupt ranges: %d; set "
            "aside: %d records; quarantined: %d bytes)", report["messages"], report["records"], report["bytes"],
            report["seconds"], " with the hot standby" if report["standby"] else "", report["torn_tail_bytes"],
            report["corrupt_ranges"], report["set_aside_records"], report["quarantined_bytes"],
        )
        return state.recovered

    def _delete_spent_segments(self) -> None:
        """Deletions found at start-up are made before the writer starts. Every segment counts as changed then, so
        compactions are only noted as due (``draining``), and start with the first batch."""
        deletions, _ = self._recovered_index().housekeeping(self._compact_ratio, self._min_compact_bytes)
        for segment in deletions:
            segment_path(self._segments_dir, segment.number).unlink(missing_ok=True)
        if deletions:  # gone for good before a rewrite may drop the removals of the messages they held
            fsync_directory(self._segments_dir)

    # --- appends (hot path) ---------------------------------------------------------------------------------
    def append_message(
        self, msg_id: int, queues: tuple[str, ...], exchange: str, routing_key: str, header_payload: bytes,
        body: bytes,
    ) -> int:
        """A persistent message routed to durable queues (msg ids must increase from call to call); returns where
        its record is (storage.recovered_messages.place), for a queue that pages it to read it back from there."""
        index, segment = self._recovered_index(), self._head()
        if segment.size >= self._segment_bytes:
            segment = self._roll()
        index.add(msg_id, queues)
        where = place(segment.number, segment.size)
        head = records.publish_head(msg_id, queues, exchange, routing_key, header_payload, body)
        segment.size += len(head) + len(header_payload) + len(body)
        buffer = self._buffer
        buffer += head
        buffer += header_payload
        buffer += body
        self._published.append((msg_id, queues))
        if not self._kick_scheduled:
            self._schedule_kick()
        return where

    # --- messages a paging queue reads back from the store -----------------------------------------------------
    def pin(self, queue: str, where: int, count: int) -> None:
        """A queue will read count records back from where's segment (once they are durable): it waits with
        compaction."""
        self._recovered_index().pin(where >> PLACE_BITS, queue, count)

    def unpin(self, queue: str, where: int, count: int) -> None:
        """count records pinned for queue in where's segment are no longer to be read back."""
        self._recovered_index().unpin(where >> PLACE_BITS, queue, count)

    def run_of(self, queue: str, ids: array, places: array, body_bytes: int, persistent: int,
               persistent_bytes: int) -> StoredRun:
        """Records pinned for queue in one segment, written already, as a run to read them back by (its release()
        unpins them)."""
        return StoredRun(ids, places, None, segment_path(self._segments_dir, places[0] >> PLACE_BITS), self._index,
                         queue, frozenset(), body_bytes, persistent, persistent_bytes)

    def append_removed(self, queue: str, msg_ids: Iterable[int]) -> None:
        """Messages left ``queue`` (acked, dropped, purged, expired...). A list of more than REMOVAL_SLICE ids, or
        an iterator of ids (a purge of a deep queue, whose ids are read as they are marked), is marked a slice a loop
        turn, after any such removal before it; a durability callback registered meanwhile waits for its last slice
        (when_durable)."""
        if (isinstance(msg_ids, Iterator) or isinstance(msg_ids, list) and len(msg_ids) > REMOVAL_SLICE) \
                and not self._closed:
            self._removals.append((queue, iter(msg_ids)))
            if len(self._removals) == 1:
                self._remove_slice()
            return
        self._remove(queue, msg_ids)

    def _remove(self, queue: str, msg_ids: Iterable[int]) -> None:
        self._roll_if_full()
        removed = self._recovered_index().remove(queue, msg_ids)
        if removed:
            self._append_ids(records.REMOVED, queue, removed)

    def _remove_slice(self) -> None:
        if self._closed:  # (_finish_removals marked the rest at the close)
            return
        queue, msg_ids = self._removals[0]
        piece = list(islice(msg_ids, REMOVAL_SLICE))
        self._remove(queue, piece)
        if len(piece) < REMOVAL_SLICE:
            self._removals.popleft()
        if self._removals:
            asyncio.get_running_loop().call_soon(self._remove_slice)
        else:
            self._callbacks += self._after_removals
            self._after_removals = []
            if not self._kick_scheduled:
                self._schedule_kick()

    def _finish_removals(self) -> None:
        """The removals under way, marked at once (the store closes: no client waits on the loop any more)."""
        while self._removals:
            queue, msg_ids = self._removals.popleft()
            self._remove(queue, list(msg_ids))
        self._callbacks += self._after_removals
        self._after_removals = []

    def append_delivered(self, queue: str, msg_ids: Iterable[int]) -> None:
        """Messages were delivered from ``queue``; after a restart they come back redelivered. Never waits."""
        self._roll_if_full()
        marked = self._recovered_index().deliver(queue, msg_ids)
        if marked:
            self._append_ids(records.DELIVERED, queue, marked)

    def adopt(self, held: str, queue: str, msg_ids: Iterable[int]) -> None:
        """Messages written under the held key ``held`` (storage.records.held_key: a transaction's, until it was
        decided) are ``queue``'s from now on, in one record. Written at once, not gathered as removals are, so that
        a removal of one of them, gathered after it, follows it on disk."""
        self._roll_if_full()
        adopted = self._recovered_index().adopt(held, queue, msg_ids)
        if adopted:
            record = records.id_list(records.ADOPTED, held, adopted)
            self._head().size += len(record)
            self._buffer += record
            if not self._kick_scheduled:
                self._schedule_kick()

    def _append_ids(self, kind: int, queue: str, msg_ids: list[int]) -> None:
        pending = self._pending_ids.get((kind, queue))
        if pending is None:
            pending = self._pending_ids[kind, queue] = array("Q")
        pending.extend(msg_ids)
        if len(pending) >= ID_RECORD_IDS:  # (written now, in the head the index linked them to: it has not rolled)
            self._flush_ids()
        if not self._kick_scheduled:
            self._schedule_kick()

    def _flush_ids(self) -> None:
        """Write the gathered ids into the head segment, the one the index linked them to."""
        if not self._pending_ids:
            return
        head, buffer = self._head(), self._buffer
        for (kind, queue), msg_ids in self._pending_ids.items():
            record = records.id_list(kind, queue, msg_ids)
            head.size += len(record)
            buffer += record
        self._pending_ids = {}

    def append_definition(self, kind: str, name: str, data: dict | None) -> None:
        """Durable definition change; ``data`` None means deleted. kind: exchange/queue/binding/vhost/user/policy."""
        record = self._recovered_definitions().set(kind, name, data)
        self._pending_definitions += record
        if not self._kick_scheduled:
            self._schedule_kick()

    def definitions(self) -> list[tuple[str, str, dict]]:
        """Every live definition as (kind, name, data), in creation order."""
        return self._recovered_definitions().items()

    def delete_queue(self, queue: str) -> None:
        """All messages of ``queue`` are gone, and so is its definition."""
        self.drop_messages(queue)
        self.append_definition("queue", queue, None)

    def drop_messages(self, queue: str) -> None:
        """All messages of ``queue`` are gone (a watermark in the definitions log says so); its definition stays."""
        below = self._recovered_index().drop_queue(queue)
        self._pending_definitions += records.queue_deleted(queue, below)
        if not self._kick_scheduled:
            self._schedule_kick()

    # --- start-up rewrites (broker.model.upgrade) ------------------------------------------------------------
    def copy_messages(self, moves: list[tuple[RecoveredMessages, str]], first_id: int) -> list[RecoveredMessages]:
        """At start-up, before anything is served: each queue's recovered messages written again for another key,
        in order, with their redelivered flags and fresh ids from first_id on, in segments of their own that are
        written and fsynced before this returns (as recovery rehomes misplaced publishes); returns them as the
        recovered messages of those keys. Deleting the old keys is the caller's part. Raises OSError."""
        assert first_id > self._recovered_index().last_id, "ids increase"
        copies = []
        msg_id = first_id
        copying = _Copying(self._roll(), self._segments_dir)
        try:
            for stored, key in moves:
                copy = RecoveredMessages(key, self._segments_dir, self._recovered_index())
                for run in stored.runs(0):
                    for message in run.read_and_release():
                        if copying.segment.size >= self._segment_bytes:
                            copying.close()
                            copying = _Copying(self._roll(), self._segments_dir)
                        copying.append(self._recovered_index(), copy, msg_id, message)
                        msg_id += 1
                copies.append(copy)
        finally:
            copying.close()
        fsync_directory(self._segments_dir)
        self._roll()  # what is appended from now on goes to a segment of its own
        for copy in copies:
            copy.finish()
        return copies

    def set_aside(self, key: str, stored: RecoveredMessages | None) -> list[Path]:
        """At start-up, before anything is served or the streams are opened: what the store holds under key goes to
        ``data_dir/quarantine/`` (its recovered messages as publish records, its stream's log directory as it is),
        durably, then the store holds nothing under key (its definition, if any, stays); returns where each went.
        Raises OSError (key is then left as it was)."""
        quarantine = Quarantine(self._data_dir)
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        kept = []
        if stored:
            kept.append(quarantine.write(f"messages-{name}", _publish_records(key, stored)))
        if self.streams.path_of(key).exists():
            kept.append(quarantine.take(self.streams.path_of(key), f"stream-{name}"))
        self.drop_messages(key)
        return kept

    def when_durable(self, callback: Callable[[bool], None]) -> None:
        """Run callback(ok) on the loop once everything appended so far is on disk; ok=False if the write failed.
        What was appended so far may be in the batch being written, while the callback goes with the next one: it
        is told of a failure of any batch that ends after it was asked for (a later batch that succeeds says
        nothing of the bytes of one that failed)."""
        asked = (callback, self._failures)
        if self._removals:
            self._after_removals.append(asked)
            return
        self._callbacks.append(asked)
        if not self._kick_scheduled:
            self._schedule_kick()

    def _wake(self) -> None:
        """Something (a stream's log) has bytes for the next batch."""
        if not self._kick_scheduled and not self._closed:
            self._schedule_kick()

    # --- batches --------------------------------------------------------------------------------------------
    def _recovered_index(self) -> MessageIndex:
        """The index recover() built: every method but recover, close and stats comes after it."""
        index = self._index
        assert index is not None, "recover() first"
        return index

    def _recovered_definitions(self) -> DefinitionTable:
        definitions = self._definitions
        assert definitions is not None, "recover() first"
        return definitions

    def _head(self) -> Segment:
        """The segment records go to (recover() rolls the first one)."""
        head = self._recovered_index().head
        assert head is not None, "recover() rolls the first segment"
        return head

    def _roll_if_full(self) -> None:
        """Roll before indexing a record, so the index links it to the segment that will hold it."""
        if self._head().size >= self._segment_bytes:
            self._roll()

    def _roll(self) -> Segment:
        self._flush_ids()
        segment = self._recovered_index().roll(self._head().number + 1)
        self._new_chunk(segment.number)
        self._head_on_disk = False
        return segment

    def _new_chunk(self, number: int) -> None:
        self._buffer = bytearray()
        self._chunks.append((number, self._buffer))

    def _schedule_kick(self) -> None:
        self._kick_scheduled = True
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._writer.loop = self._loop
        self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_scheduled = False
        if self._in_flight is None and not self._closed:
            self._hand_over()

    def _take_batch(self) -> Batch:
        self._flush_ids()
        index, definitions = self._recovered_index(), self._recovered_definitions()
        deletions, compactions = index.housekeeping(self._compact_ratio, self._min_compact_bytes)
        batch = Batch(
            chunks=self._chunks, definitions=bytes(self._pending_definitions), callbacks=self._callbacks,
            published=self._published, deletions=self._deletions + [segment.number for segment in deletions],
            compactions=[Compaction(self._segments_dir, segment, index) for segment in compactions],
        )
        if self.streams.has_work():
            batch.resets, batch.files, batch.unlinks, streams = self.streams.take()
            batch.streams = [stream.written for stream in streams]
        if self._cuts:
            batch.cut = self._cuts.pop(0)
        self._definitions_log_bytes += len(batch.definitions)
        if self._snapshot_due or self._definitions_log_bytes > 2 * definitions.live_bytes + DEFINITIONS_SLACK:
            needed_below = index.still_needed_below()
            for queue in [q for q, below in index.deleted_below.items() if below <= needed_below]:
                del index.deleted_below[queue]
            batch.definitions_snapshot = definitions.snapshot(index.deleted_below, needed_below)
            self._definitions_log_bytes = len(batch.definitions_snapshot)
            self._snapshot_due = False
        self._chunks = []
        self._new_chunk(self._head().number)
        self._pending_definitions = bytearray()
        self._callbacks = []
        self._published = []
        self._deletions = []
        return batch

    def _hand_over(self) -> None:
        batch = self._take_batch()
        if self._is_empty(batch) and self._recovered_index().draining:
            # nothing was appended while the last batch was written: the segments that were draining are quiet now
            batch = self._take_batch()
        if self._is_empty(batch):
            if batch.definitions_snapshot is not None:
                self._snapshot_due = True  # a rewrite retried after a failure waits for something else to write
            return
        self._in_flight = batch
        if self._writer_dead:
            assert self._loop is not None, "batches are handed over on the loop"
            self._loop.call_soon(self._on_written, batch, False)
        else:
            self._writer.submit(batch)

    @staticmethod
    def _is_empty(batch: Batch) -> bool:
        return not (any(data for _, data in batch.chunks) or batch.definitions or batch.callbacks or batch.deletions
                    or batch.compactions or batch.unlinks or batch.resets or batch.files or batch.cut is not None)

    @staticmethod
    def _writes_bytes(batch: Batch) -> bool:
        return (any(data for _, data in batch.chunks) or bool(batch.definitions) or bool(batch.files)
                or batch.definitions_snapshot is not None)

    def _on_written(self, batch: Batch, ok: bool) -> None:
        self._in_flight = None
        if not ok:
            self._failures += 1
        if ok:
            if self._writes_bytes(batch):
                head = self._head().number
                self._head_on_disk = self._head_on_disk or any(data for number, data in batch.chunks if number == head)
                self._set_health(True)
        else:
            self._forget_failed(batch)
            self._set_health(False)
        # stream logs take note first (and at once: the next batch's chunks follow on from these), so that consumers
        # may read the chunks before the publishers' confirms go out
        self._run_callbacks(batch.streams, ok)
        self._sequence = max(self._sequence, batch.sequence)
        # (the outcome each callback is told: the batch's, unless a batch failed since the callback was asked for)
        told = [(callback, ok and failures == self._failures) for callback, failures in batch.callbacks]
        if self._gate is None:
            self._tell(told)
        elif told:
            self._gate(self._sequence, partial(self._tell, told))
        if not self._closed:
            self._hand_over()

    def _run_callbacks(self, callbacks: list[Callable[[bool], None]], ok: bool) -> None:
        self._tell([(callback, ok) for callback in callbacks])

    def _tell(self, told: list[tuple[Callable[[bool], None], bool]]) -> None:
        for callback, ok in told:
            try:
                callback(ok)
            except Exception:
                self.callback_errors += 1
                log.exception("store durability callback failed")

    def _forget_failed(self, batch: Batch) -> None:
        """Undo what the index took from a batch that is not on disk (its files were cut back)."""
        index = self._recovered_index()
        for msg_id, queues in batch.published:
            index.undo(msg_id, queues)
        for number, data in batch.chunks:
            segment = index.segments.get(number)
            if segment is not None:
                segment.size -= len(data)
        self._snapshot_due = True  # definition changes of the lost batch are rewritten whole
        self._deletions.extend(batch.deletions)
        self.streams.retry(batch.resets, batch.unlinks)
        for compaction in batch.compactions:
            compaction.segment.compacting = False
            index.dirty.add(compaction.segment.number)
        if self._head_on_disk:
            # a segment that filled the disk must be able to go once consumed: new records go to a fresh one
            self._roll()

    def _set_health(self, healthy: bool) -> None:
        if healthy == self._healthy:
            return
        self._healthy = healthy
        if healthy:
            if self._failing_said:
                log.warning("store writes succeed again")
                self._failing_said = False
            assert self._probe_timer is not None, "set when writes began to fail"
            self._probe_timer.cancel()
        else:
            assert self._loop is not None, "batches are handed over on the loop"
            if self._loop.time() - self._failing_said_at >= HEALTH_SAID_EVERY:  # (a full disk flaps: said seldom)
                log.error("store writes are failing: durable writes are refused until one succeeds")
                self._failing_said, self._failing_said_at = True, self._loop.time()
            self._probe_timer = self._loop.call_later(PROBE_INTERVAL, self._probe)
        if self.on_health is not None:
            try:
                self.on_health(healthy)
            except Exception:
                log.exception("store health callback failed")

    def _probe(self) -> None:
        """While unhealthy: append a record that changes nothing, to try the disk again; then again later."""
        if self._closed:
            return
        self._roll_if_full()
        self._append_ids(records.DELIVERED, "", [])
        assert self._loop is not None, "batches are handed over on the loop"
        self._probe_timer = self._loop.call_later(PROBE_INTERVAL, self._probe)

    @property
    def healthy(self) -> bool:
        """Whether writes succeed: the last batch that wrote something was written."""
        return self._healthy

    def _on_writer_died(self) -> None:
        """The writer thread is gone (logged CRITICAL there): fail its batch and, from now on, every batch."""
        self._writer_dead = True
        if self._in_flight is not None:
            self._on_written(self._in_flight, False)

    def _on_compacted(self, compaction: Compaction) -> None:
        segment = compaction.segment
        index = self._recovered_index()
        if index.segments.get(segment.number) is not segment:
            return  # it emptied and was deleted (with its rewrite) meanwhile; the deletion's batch kicks anyway
        if compaction.size is None:  # tried again after a pause: a full disk would fail it at once, again and again
            assert self._loop is not None, "compactions start from batches, handed over on the loop"
            self._paused_compactions.add(segment.number)  # (still marked compacting meanwhile, so that none starts)
            self._loop.call_later(COMPACTION_RETRY, self._compaction_retried, segment)
            return
        index.compacted(segment, compaction.size, compaction.upto, compaction.refers)
        if not self._kick_scheduled and not self._closed:
            self._schedule_kick()

    def _compaction_retried(self, segment: Segment) -> None:
        """A segment whose compaction failed may be compacted again (unless it went meanwhile)."""
        self._paused_compactions.discard(segment.number)
        segment.compacting = False
        index = self._recovered_index()
        if index.segments.get(segment.number) is segment and not self._closed:
            index.dirty.add(segment.number)
            if not self._kick_scheduled:
                self._schedule_kick()

    # --- replication ----------------------------------------------------------------------------------------
    def replicate(self, tap: Tap, gate: Callable[[int, Callable[[], None]], None]) -> None:
        """From the next batch on, the writer hands every change to the files to ``tap(sequence, ops)`` on its
        thread (storage.replica), and each batch's callbacks wait for ``gate(sequence, release)``, called on the
        loop, to call ``release()`` (once, in sequence order: callbacks of a later batch never run before those of
        an earlier one). Call it after start-up (recovery, the streams opened), before serving."""
        self._writer.tap = tap
        self._gate = gate

    def request_cut(self, callback: Cut) -> None:
        """The next batch is followed, on the writer thread, by ``callback(sequence, [(path, fd, size), ...])``: every
        replicated file held open for reading with its size, which with the frames after ``sequence`` make the data
        dir. The callback owns the fds. A batch is made for it even if nothing else is pending. A cut that cannot be
        taken (too many open files) comes as ``callback(-1, [])``."""
        self._cuts.append(callback)
        if not self._kick_scheduled and not self._closed:
            self._schedule_kick()

    def writer_progress(self) -> float:
        """time.monotonic() when the writer thread last finished a batch (written or failed) or a compaction's slice."""
        return self._writer.progress

    # --- shutdown and figures -------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush everything, fsync, stop the writer, unlock the data dir (blocks, at most ``stop_timeout`` seconds
        for the writer). Pending callbacks run on the loop later."""
        if self.begin_close():
            self.finish_close()

    def begin_close(self) -> bool:
        """close()'s part on the loop: hand the writer its last batch. Whether finish_close() has a writer to wait
        for."""
        if self._closed:
            return False
        self._closed = True
        if self._index is None:
            return False
        self._finish_removals()
        batch = self._take_batch()
        batch.final = True
        self._writer.submit(batch)
        return True

    def finish_close(self) -> None:
        """close()'s wait for the writer, then the unlock; on any thread, so that a hung disk holds no event loop."""
        if self._writer.join(self._stop_timeout):
            self._lock.release()
        else:  # the data dir stays locked until the process exits, since the writer may still write to it
            log.critical("store writer did not stop within %.0f s: closing without flushing", self._stop_timeout)

    def stats(self) -> dict:
        index = self._index
        segments = list(index.segments.values()) if index else []
        return {
            "bytes_on_disk": sum(segment.size for segment in segments) + self._definitions_log_bytes,
            "segments": len(segments),
            "live_messages": index.live_refs if index else 0,  # (queue, message) pairs
            "index_bytes": sum(len(segment.states) for segment in segments),
            "compactions_running": sum(segment.compacting and segment.number not in self._paused_compactions
                                       for segment in segments),
            "batches": self._writer.batches,
            "fsyncs": self._writer.fsyncs,
            "bytes_written": self._writer.bytes_written,
            "failed": self._writer.failed,
            "healthy": self._healthy,
            "batch_messages": self._writer.batch_messages,  # storage.histogram.Histogram of messages per batch
            "sync_seconds": self._writer.sync_seconds,  # Histogram of each batch's fdatasync time
        }


class _Copying:
    """A segment copy_messages writes itself: the index's head, which the writer thread appends nothing to."""

    def __init__(self, segment: Segment, segments_dir: Path) -> None:
        self.segment = segment  # its size grows with each record written
        self.file = open(segment_path(segments_dir, segment.number), "xb")

    def append(self, index: MessageIndex, copy: RecoveredMessages, msg_id: int, message: StoredMessage) -> None:
        """A copy of message for copy's queue, with msg_id."""
        pairs = ((copy.queue, message.redelivered),)
        head = records.publish_head(msg_id, pairs, message.exchange, message.routing_key, message.header_payload,
                                    message.body)
        self.file.write(head)
        self.file.write(message.header_payload)
        self.file.write(message.body)
        index.add_recovered(msg_id, pairs)
        copy.add(msg_id, place(self.segment.number, self.segment.size), len(message.body),
                 records.is_persistent(message.header_payload), message.redelivered)
        self.segment.size += len(head) + len(message.header_payload) + len(message.body)

    def close(self) -> None:
        """Written and fsynced (once: a second call does nothing)."""
        if not self.file.closed:
            with self.file:
                self.file.flush()
                os.fsync(self.file.fileno())


def _publish_records(key: str, stored: RecoveredMessages) -> Iterator[bytes]:
    """A queue's recovered messages as the publish records of its segments, for key alone."""
    for run in stored.runs(0):
        for message in run.read_and_release():
            yield records.publish_head(message.msg_id, ((key, message.redelivered),), message.exchange,
                                       message.routing_key, message.header_payload, message.body)
            yield message.header_payload
            yield message.body
