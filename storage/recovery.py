"""Start-up: read the definitions log and the segments in order, rebuild the queues and the index.

Damage never costs intact records: after a bad record, reading goes on at the next intact one (``storage.salvage``).
A damaged range that runs to the end of the last segment or of the definitions log is a torn tail (a write cut
short by a crash): it is cut with a warning. Any other is corruption, logged as an error with what was lost. Either
way its bytes are kept under ``data_dir/quarantine/`` and the file is repaired once everything is read, so the next
start reads the same state without meeting the damage again. A record that is intact but cannot be used (a
definition that does not decode) is set aside the same way. A publish whose id does not increase (two brokers
once wrote one data dir) gets a fresh id and moves to a segment of its own, so every message stays readable.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage import format, records, salvage
from storage.definitions_log import DefinitionTable
from storage.index import MessageIndex
from storage.recovered_messages import TRANSIENT, RecoveredMessages, place
from storage.segments import (
    CLEAN_MARKER, DEFINITIONS_LOG, fsync_directories, fsync_directory, make_directories, segment_numbers, segment_path,
)

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    exchanges: list[dict]  # definitions as given to append_definition, latest state, in creation order
    queues: list[dict]
    bindings: list[dict]
    messages: dict[str, RecoveredMessages]  # durable queue name -> its messages, in queue order
    next_msg_id: int  # the broker continues numbering from here
    report: dict  # figures: records read, bytes, seconds, torn-tail bytes truncated ...
    vhosts: list[dict] = field(default_factory=list)
    users: list[dict] = field(default_factory=list)
    policies: list[dict] = field(default_factory=list)
    permissions: list[dict] = field(default_factory=list)
    topic_permissions: list[dict] = field(default_factory=list)
    operator_policies: list[dict] = field(default_factory=list)
    parameters: list[dict] = field(default_factory=list)  # runtime parameters (a shovel's definition)
    # decisions to commit a transaction across processes that some process has not taken its share of yet
    transactions: list[dict] = field(default_factory=list)
    retained: list[dict] = field(default_factory=list)  # MQTT's retained messages (broker.model.retained)
    mqtt_sessions: list[dict] = field(default_factory=list)  # MQTT sessions waiting to end (broker.connection.mqtt)
    mqtt_wills: list[dict] = field(default_factory=list)  # MQTT wills held back by their delay (likewise)
    # (kind, name) of definitions whose latest record could not be decoded and was set aside (in quarantine/):
    # the broker should keep the messages of such a queue rather than drop them as a queue's that is gone
    set_aside_definitions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class RecoveredState:
    """What the store itself keeps from recovery."""

    recovered: Recovered
    index: MessageIndex
    definitions: DefinitionTable
    definitions_log_bytes: int  # current size of the definitions log
    next_segment: int  # number for the first segment written from now on


@dataclass(slots=True)
class _Misplaced:
    """A publish read after one with a higher or equal id: it is given a fresh id and moved."""

    msg_id: int  # the id in its record
    metadata: records.Metadata  # (queue, delivered) pairs, exchange, routing key, header payload
    body: bytes


class _Unusable(Exception):
    """An intact record that cannot be applied: args are its offset, its end and the error."""


@dataclass(slots=True)
class _Follow:
    """A publish for a single queue that later ones may follow (see RecordReader.segment_records)."""

    meta: bytes  # its metadata bytes (queue count, queues, exchange, routing key, content header)
    head_size: int  # payload bytes before the body: type, id, metadata
    queue: str
    state: int  # its state in the index, which the run's messages share
    messages: RecoveredMessages  # the queue's
    delivered: bool
    persistent: bool


class RecordReader:
    """Recovery's reader: applies the definitions log's and the segments' records to the index, the definitions
    and each queue's recovered messages, file by file (``recover``) or, on a follower, as they arrive
    (``storage.standby``)."""

    def __init__(self, data_dir: Path, segments_dir: Path) -> None:
        self.index = MessageIndex()
        self.definitions = DefinitionTable()
        self.queues: dict[str, RecoveredMessages] = {}  # queue -> its live messages
        self.segments_dir = segments_dir  # where their records are read back from
        self.persistent: dict[bytes, bool] = {}  # content header -> whether it marks the message persistent
        self.follow: _Follow | None = None  # the run of publishes the last segment record began, if any
        self.count = 0  # records applied from the file being read
        self.segment = 0  # number of the segment being read
        self.at = 0  # offset in its file of the bytes being read (a standby reads only a file's new bytes)
        self.definitions_bytes = 0  # the definitions log's size once read (and repaired)
        self.publishes = records.PublishReader()  # shared by all segments, so equal values are shared across them
        self.quarantine = salvage.Quarantine(data_dir)
        self.repairs: list[tuple[Path, bytes, list[tuple[int, int]]]] = []  # files to repair once all is read
        self.misplaced: list[_Misplaced] = []  # publishes whose ids did not increase, in the order read
        self.moved: list[tuple[int, int]] = []  # byte ranges of the current file's misplaced publishes
        self.unkept = False  # some damaged bytes of the current file could not be put in quarantine
        self.set_aside_definitions: list[tuple[str, str]] = []
        self.adoptions: dict[str, str] = {}  # held key -> the queue that adopted its messages (ADOPTED records)
        # id of a live message a queue adopted -> the held keys it is listed under (one per queue that adopted it)
        self.adopted: dict[int, list[str]] = {}
        self.report: dict[str, int | float] = {
            "records": 0, "bytes": 0, "torn_tail_bytes": 0, "corrupt_segments": 0, "corrupt_ranges": 0,
            "quarantined_bytes": 0, "set_aside_records": 0, "rehomed_messages": 0,
            "definitions_damaged": False,
        }

    def read_file(self, path: Path, is_tail: bool, types: frozenset[int], read: Callable[[bytes, int], object]) -> int:
        """Apply each intact record of ``path`` with read(the file's bytes, the offset to start at), reading past
        damage; return the file's size once repaired."""
        data = path.read_bytes()
        self.report["bytes"] += len(data)
        self.count = 0
        drop: list[tuple[int, int]] = []  # byte ranges the repaired file leaves out
        self.moved = []
        self.unkept = False
        corrupt = False
        offset = 0
        while offset < len(data):
            try:
                read(data, offset)
                break
            except records.CorruptRecord as bad:
                bad_at, reason = bad.args
                damage = salvage.damage_at(data, bad_at, reason, types)
                corrupt |= self._damaged(path, data, damage, is_tail)
                drop.append((damage.start, damage.end))
                offset = damage.end
            except _Unusable as unusable:
                pos, end, error = unusable.args
                self._set_aside(path, data, pos, end, error)
                drop.append((pos, end))
                offset = end
        count = self.count
        self.report["records"] += count
        self.report["corrupt_segments"] += corrupt and types is records.SEGMENT_TYPES
        drop = sorted(drop + self.moved)
        if not drop or self.unkept:
            return len(data)  # intact, or damaged bytes that could not be kept elsewhere stay where they are
        self.repairs.append((path, data, drop))
        return len(data) - sum(stop - start for start, stop in drop)

    def definition_records(self, data: bytes, offset: int) -> None:
        """Apply the definitions log's records from offset on; raise CorruptRecord at a damaged one, _Unusable at
        one that cannot be applied."""
        frame_size = records.FRAME_SIZE
        for pos, end, payload in records.scan(data, offset):
            try:
                self.definition_record(data, payload, pos + frame_size, end)
            except Exception as error:  # whatever the decoders raise for an intact record they cannot make sense of
                raise _Unusable(pos, end, error) from None
            self.count += 1

    def segment_records(self, data: bytes, offset: int, until: int = -1) -> int:
        """The same for a segment's records (checked as records.scan checks them), up to the first that begins at
        or after ``until`` (-1: all); returns where it stopped. A publish that follows one for a single queue with
        the next id and the same metadata, as a queue's messages usually lie in a segment, is taken in this loop:
        where it is and its body size are gathered, and the queue's columns and the index learn of the run in
        bulk."""
        view = memoryview(data)
        total = len(data)
        stop = total if until < 0 else min(until, total)
        unpack_frame, unpack_id, crc32 = records.FRAME.unpack_from, records.MSG_ID.unpack_from, zlib.crc32
        frame_size, max_payload, publish = records.FRAME_SIZE, records.MAX_PAYLOAD, records.PUBLISH
        base = place(self.segment, self.at)
        pos = offset
        follow: _Follow | None = None  # the run publishes may continue (None: the last record began none)
        meta = b""  # its metadata bytes
        head_size = 0  # its payload bytes before the body
        next_id = 0  # the id the next publish of the run would have
        places: list[int] = []  # where the publishes taken into the run since the last _took are
        sizes: list[int] = []  # their body sizes
        applied = 0  # records applied from offset on
        length: int
        crc: int
        try:
            while pos < stop:
                if total - pos < frame_size:
                    raise records.CorruptRecord(pos, "truncated frame header")
                length, crc = unpack_frame(data, pos)
                start = pos + frame_size
                end = start + length
                if length == 0 or length > max_payload or end > total:
                    raise records.CorruptRecord(pos, "length runs past the end of the file")
                if crc32(data[start:end]) != crc:  # a copy: cheaper than a memoryview for most records
                    raise records.CorruptRecord(pos, "CRC mismatch")
                if (follow is not None and data[start] == publish and data.startswith(meta, start + 9)
                        and unpack_id(data, start + 1)[0] == next_id):
                    places.append(base + pos)
                    sizes.append(end - start - head_size)
                    next_id += 1
                else:
                    if places:
                        assert follow is not None, "only a run takes publishes"
                        self._took(follow, places, sizes)
                    try:
                        self.segment_record(data, view[start:end], start, end)
                    except Exception as error:  # what the decoders raise for an intact record they cannot use
                        raise _Unusable(pos, end, error) from None
                    follow = self.follow
                    if follow is not None:
                        meta, head_size, next_id = follow.meta, follow.head_size, self.index.last_id + 1
                applied += 1
                pos = end
        finally:
            self.count += applied
            if places:
                assert follow is not None, "only a run takes publishes"
                self._took(follow, places, sizes)
        return pos

    def _took(self, follow: _Follow, places: list[int], sizes: list[int]) -> None:
        """The publishes at places, with those body sizes, were taken in segment_records's loop after the one that
        began follow's run: their messages, with the ids after the last one, join its queue; the lists are
        emptied."""
        follow.messages.add_run(self.index.last_id + 1, places, sizes, follow.persistent, follow.delivered)
        self.index.add_recovered_more(follow.queue, follow.state, len(places))
        places.clear()
        sizes.clear()

    def _keep(self, path: Path, data: bytes, start: int, end: int) -> Path | str:
        """Put ``data[start:end]`` of ``path`` in quarantine; return where, for the log."""
        kept = self.quarantine.keep(path, start, memoryview(data)[start:end])
        if kept is None:
            self.unkept = True
            return f"{path} (not repaired)"
        self.report["quarantined_bytes"] += end - start
        return kept

    def _damaged(self, path: Path, data: bytes, damage: salvage.Damage, is_tail: bool) -> bool:
        """Keep and report a damaged range; return whether it is corruption (not a torn tail)."""
        kept = self._keep(path, data, damage.start, damage.end)
        if is_tail and damage.end == len(data) and not damage.gave_up:
            log.warning("%s: torn tail at offset %d (%s): truncating %d bytes (%s), kept in %s", path, damage.start,
                        damage.reason, damage.size, damage.describe(), kept)
            self.report["torn_tail_bytes"] += damage.size
            return False
        lost = "messages, acks and deliveries" if path.name != DEFINITIONS_LOG else "definitions and queue deletions"
        if damage.gave_up:
            extent = ", the search for an intact record after it gave up (some may be in the range)"
        else:
            extent = ", no intact record found in the rest of the file" if damage.end == len(data) else ""
        log.error("%s: corrupt record at offset %d (%s): %d bytes unreadable (%s)%s; the %s in them are lost; the "
                  "bytes are kept in %s", path, damage.start, damage.reason, damage.size, damage.describe(), extent,
                  lost, kept)
        self.report["corrupt_ranges"] += 1
        if path.name == DEFINITIONS_LOG:
            self.report["definitions_damaged"] = True  # definitions may be missing that nobody can name
        return True

    def _set_aside(self, path: Path, data: bytes, start: int, end: int, error: Exception) -> None:
        """An intact record that cannot be applied: keep it in quarantine and go on without it."""
        kept = self._keep(path, data, start, end)
        self.report["set_aside_records"] += 1
        payload = memoryview(data)[start + records.FRAME_SIZE:end]
        what = f"record of type {payload[0]}"
        if payload[0] in (records.DEFINITION, records.LEGACY_DEFINITION):
            try:
                kind, name, _ = records.decode_definition(payload)
            except ValueError:
                what = "definition record (kind and name unreadable)"
                self.report["definitions_damaged"] = True
            else:
                what = f"{kind} definition {name!r}"
                self.set_aside_definitions.append((kind, name))
        log.error("%s: %s at offset %d cannot be used (%s: %s); set aside in %s", path, what, start,
                  type(error).__name__, error, kept)

    def definition_record(self, data: bytes, payload: memoryview, start: int, end: int) -> None:
        kind = payload[0]
        if kind in (records.DEFINITION, records.LEGACY_DEFINITION):
            self.definitions.apply_recovered(kind, *records.decode_definition(payload),
                                             data[start - records.FRAME_SIZE:end])
        elif kind == records.QUEUE_DELETED:
            queue, below = records.decode_queue_deleted(payload)
            self.index.deleted_below[queue] = max(below, self.index.deleted_below.get(queue, 0))
        else:
            raise ValueError(f"unknown definitions record type {kind}")

    def segment_record(self, data: bytes, payload: memoryview, start: int, end: int) -> None:
        self.follow = None
        kind = data[start]
        index = self.index
        if kind == records.PUBLISH:
            msg_id, metadata, body_start = self.publishes.read(data, start, end)
            if msg_id <= index.last_id:
                self.misplaced.append(_Misplaced(msg_id, metadata, data[body_start:end]))
                self.moved.append((start - records.FRAME_SIZE, end))
                return
            queues, _, _, header_payload = metadata
            live = index.add_recovered(msg_id, queues)
            self._add(msg_id, live, place(self.segment, self.at + start - records.FRAME_SIZE), end - body_start,
                      header_payload)
            if len(queues) == 1 and live:
                (queue, delivered), = live
                messages = self.queues[queue]
                self.follow = _Follow(self.publishes.metadata_bytes, body_start - start, queue,
                                      index.state_of(msg_id), messages, delivered,
                                      not messages.flags[-1] & TRANSIENT)
                return
        elif kind in (records.REMOVED, records.DELIVERED):
            # a compacted publish lists only its live queues, so an older record may name a queue it has left
            queue, ids = records.decode_id_list(payload)
            listed = self.queues.get(queue)
            if listed is not None:
                self._removed_or_delivered(kind, queue, listed, listed.positions(ids))
            if self.adopted:  # (messages a queue adopted are still listed under the key they were held under)
                adopted = self.adopted
                for held in {held for msg_id in ids for held in adopted.get(msg_id, ())
                             if self.adoptions[held] == queue}:
                    held_listed = self.queues[held]
                    self._removed_or_delivered(kind, queue, held_listed, held_listed.positions(ids))
        elif kind == records.ADOPTED:
            held, ids = records.decode_id_list(payload)
            listed = self.queues.get(held)
            parts = records.held_parts(held)
            if listed is None or parts is None:
                return
            queue = parts[1]
            listed_ids = listed.ids
            positions = listed.positions(ids)
            below = index.deleted_below.get(queue, -1)  # (a queue deleted since: they went with it)
            gone = [position for position in positions if listed_ids[position] < below]
            listed.remove(held, gone)
            for msg_id in index.adopt(held, queue, [listed_ids[position] for position in positions
                                                    if listed_ids[position] >= below]):
                self.adopted.setdefault(msg_id, []).append(held)
            self.adoptions[held] = queue
        else:
            raise ValueError(f"unknown segment record type {kind}")

    def _removed_or_delivered(self, kind: int, queue: str, listed: RecoveredMessages, positions: list[int]) -> None:
        if kind == records.REMOVED:
            removed = listed.remove(queue, positions)
            adopted = self.adopted
            if adopted:
                for msg_id in removed:
                    helds = adopted.get(msg_id)
                    if helds is not None:
                        helds[:] = [held for held in helds if self.adoptions[held] != queue]
                        if not helds:
                            del adopted[msg_id]
        else:
            listed.deliver(queue, positions)

    def adopt_held(self) -> None:
        """Each held key's messages that a queue adopted join that queue's, in id order (once all is read)."""
        for held, queue in self.adoptions.items():
            listed = self.queues.pop(held, None)
            if listed is None:
                continue
            into = self.queues.get(queue)
            if into is None:
                into = self.queues[queue] = RecoveredMessages(queue, self.segments_dir, self.index)
            into.absorb(listed)
        self.adoptions.clear()
        self.adopted.clear()

    def _add(self, msg_id: int, live: tuple[tuple[str, bool], ...], where: int, size: int,
             header_payload: bytes) -> None:
        """A publish's message joins the queues it is live in."""
        persistent = self.persistent.get(header_payload)
        if persistent is None:
            if len(self.persistent) >= records.PublishReader.CACHE_ENTRIES:
                self.persistent.clear()
            persistent = self.persistent[header_payload] = records.is_persistent(header_payload)
        for queue, delivered in live:
            messages = self.queues.get(queue)
            if messages is None:
                messages = self.queues[queue] = RecoveredMessages(queue, self.segments_dir, self.index)
            messages.add(msg_id, where, size, persistent, delivered)

    def rehome(self, segments_dir: Path, number: int) -> int:
        """Give the misplaced publishes fresh ids (in the order read) in a new segment ``number``, written and
        fsynced before their old copies are repaired away; return its size."""
        index = self.index
        segment = index.roll(number)
        first_id = index.last_id + 1
        out = bytearray()
        placed = []  # (msg id, live pairs, offset in the new segment, body size, header) to add once it is mapped
        for message in self.misplaced:
            queues, exchange, routing_key, header_payload = message.metadata
            # the queue deletions that were made after the message's publish are those above its own id
            queues = tuple(pair for pair in queues if message.msg_id >= index.deleted_below.get(pair[0], -1))
            msg_id = index.last_id + 1
            live = index.add_recovered(msg_id, queues)
            if queues:
                placed.append((msg_id, live, len(out), len(message.body), header_payload))
                out += records.publish_head(msg_id, queues, exchange, routing_key, header_payload, message.body)
                out += header_payload
                out += message.body
        path = segment_path(segments_dir, number)
        with open(path, "wb") as file:
            file.write(out)
            file.flush()
            os.fsync(file.fileno())
        fsync_directory(segments_dir)
        for msg_id, live, offset, size, header_payload in placed:
            self._add(msg_id, live, place(number, offset), size, header_payload)
        log.error(
            "%d messages were stored with ids that do not increase (two brokers on one data dir?): they keep their "
            "queues with the new ids %d..%d in %s; an ack recorded for an old id counts for the first message that "
            "had it", len(self.misplaced), first_id, index.last_id, path,
        )
        self.report["rehomed_messages"] = len(self.misplaced)
        segment.size = len(out)
        return segment.size

    def repair(self) -> None:
        """Take the damaged, set-aside and moved ranges out of their files (all are kept elsewhere by now); the
        places of the messages after them in a segment move up with them."""
        for path, data, drop in self.repairs:
            if path.name == DEFINITIONS_LOG:
                salvage.repair(path, data, drop, ".snapshot")
            elif salvage.repair(path, data, drop, ".compacting"):
                for messages in self.queues.values():
                    messages.moved(int(path.stem), drop)


def recover(data_dir: Path, segments_dir: Path,
            take_standby: Callable[[], RecordReader | None] | None = None) -> RecoveredState:
    """Read the data dir back, or take a follower's standby (``storage.standby``): its reader, which has read all
    of it already (None: the standby is not whole, and the files are read)."""
    started = time.perf_counter()
    caught_up = take_standby() if take_standby is not None else None
    made: set[Path] = set()  # the data dir, if messages/ is new (a fresh data dir, a promoted follower's copy)
    make_directories(segments_dir, made)
    fsync_directories(made)
    format.check_and_mark(data_dir)
    for leftover in [*segments_dir.glob("*.compacting"), *data_dir.glob("*.snapshot")]:
        leftover.unlink()  # a rewrite interrupted before its rename: the original is intact
    clean_marker = data_dir / CLEAN_MARKER
    clean = clean_marker.exists()
    reader = caught_up or read_all(data_dir, segments_dir)
    numbers = segment_numbers(segments_dir)
    next_segment = (numbers[-1] + 1) if numbers else 0
    if reader.misplaced:
        reader.rehome(segments_dir, next_segment)
        next_segment += 1
    reader.repair()
    reader.adopt_held()
    index = reader.index
    index.head = None
    index.dirty = set(index.segments)
    clean_marker.unlink(missing_ok=True)

    next_msg_id = max([index.last_id + 1, *index.deleted_below.values()])
    messages = {queue: stored for queue, stored in reader.queues.items() if stored.finish()}
    definitions = reader.definitions
    report = reader.report
    report.update(
        segments=len(numbers),
        messages=sum(len(queue) for queue in messages.values()),
        clean_shutdown=clean,
        seconds=round(time.perf_counter() - started, 3),
        standby=caught_up is not None,
    )
    recovered = Recovered(
        exchanges=definitions.of_kind("exchange"), queues=definitions.of_kind("queue"),
        bindings=definitions.of_kind("binding"), messages=messages, next_msg_id=next_msg_id, report=report,
        vhosts=definitions.of_kind("vhost"), users=definitions.of_kind("user"),
        policies=definitions.of_kind("policy"), permissions=definitions.of_kind("permission"),
        topic_permissions=definitions.of_kind("topic_permission"),
        operator_policies=definitions.of_kind("operator_policy"), parameters=definitions.of_kind("parameter"),
        transactions=definitions.of_kind("transaction"), retained=definitions.of_kind("retained"),
        mqtt_sessions=definitions.of_kind("mqtt_session"), mqtt_wills=definitions.of_kind("mqtt_will"),
        set_aside_definitions=reader.set_aside_definitions,
    )
    return RecoveredState(recovered, index, definitions, reader.definitions_bytes, next_segment)


def read_all(data_dir: Path, segments_dir: Path) -> RecordReader:
    """The definitions log's and every segment's records, read past damage (kept aside to repair once all is
    read)."""
    reader = RecordReader(data_dir, segments_dir)
    definitions_log = data_dir / DEFINITIONS_LOG
    if definitions_log.exists():
        reader.definitions_bytes = reader.read_file(
            definitions_log, True, records.DEFINITIONS_TYPES, reader.definition_records
        )
    numbers = segment_numbers(segments_dir)
    index = reader.index
    for position, number in enumerate(numbers):
        reader.segment = number
        segment = index.roll(number)
        path = segment_path(segments_dir, number)
        segment.size = reader.read_file(
            path, position == len(numbers) - 1, records.SEGMENT_TYPES, reader.segment_records
        )
    return reader
