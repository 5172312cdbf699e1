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
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage import format, records, salvage
from storage.definitions import DefinitionTable
from storage.index import MessageIndex
from storage.segments import (
    CLEAN_MARKER, DEFINITIONS_LOG, fsync_directory, messages_directory, segment_numbers, segment_path,
)

log = logging.getLogger(__name__)


class SegmentBodies:
    """The bodies of recovered messages, read from their segment files when asked for, so that recovery never holds
    every queued body in memory at once. A segment is mapped on its first read (once recovery has repaired the
    files) and unmapped when this object goes; a mapping keeps reading the file it mapped even if the store later
    compacts or deletes it."""

    def __init__(self, segments_dir: Path) -> None:
        self.segments_dir = segments_dir
        self.maps: dict[int, mmap.mmap] = {}  # segment number -> its mapping

    def read(self, number: int, start: int, end: int) -> bytes:
        mapping = self.maps.get(number)
        if mapping is None:
            with open(segment_path(self.segments_dir, number), "rb") as file:
                mapping = self.maps[number] = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        return mapping[start:end]


class StoredMessage:
    """A message read back from the store, for one queue; its body is read from its segment when first asked for
    (bodies is None when it is in hand already)."""

    __slots__ = ("msg_id", "exchange", "routing_key", "header_payload", "redelivered", "_body", "_bodies", "_where")

    def __init__(self, msg_id: int, exchange: str, routing_key: str, header_payload: bytes, body: bytes | None,
                 redelivered: bool, bodies: SegmentBodies | None = None, where: int = 0):
        self.msg_id = msg_id  # broker-wide id, assigned by the broker, increasing
        self.exchange = exchange
        self.routing_key = routing_key
        self.header_payload = header_payload  # raw AMQP content-header payload (class 60, ... , properties)
        self.redelivered = redelivered  # it had been delivered from this queue before the stop
        self._body = body  # the body, or None while it is only in its segment
        self._bodies = bodies  # where to read it from then
        self._where = where  # where the body is: segment number, start and end in it, in one int (body_place)

    @property
    def body(self) -> bytes:
        if self._body is not None:
            return self._body
        return self._bodies.read(*_place_of(self._where))

    def keep_body(self, rewritten: dict[int, bytes]) -> None:
        """Keep the body in hand if its segment is about to be rewritten (rewritten: number -> its content)."""
        if self._body is None:
            number, start, end = _place_of(self._where)
            data = rewritten.get(number)
            if data is not None:
                self._body = data[start:end]


def body_place(number: int, start: int, end: int) -> int:
    """Segment number, start and end of a body as one int: one small object per message rather than four."""
    return (number << 80) | (start << 40) | end


def _place_of(place: int) -> tuple[int, int, int]:
    return place >> 80, (place >> 40) & _OFFSET_MASK, place & _OFFSET_MASK


_OFFSET_MASK = (1 << 40) - 1


@dataclass
class Recovered:
    exchanges: list[dict]  # definitions as given to append_definition, latest state, in creation order
    queues: list[dict]
    bindings: list[dict]
    messages: dict[str, list[StoredMessage]]  # durable queue name -> messages in queue order
    next_msg_id: int  # the broker continues numbering from here
    report: dict  # figures: records read, bytes, seconds, torn-tail bytes truncated ...
    vhosts: list[dict] = field(default_factory=list)
    users: list[dict] = field(default_factory=list)
    policies: list[dict] = field(default_factory=list)
    permissions: list[dict] = field(default_factory=list)
    operator_policies: list[dict] = field(default_factory=list)
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


class _Reader:
    def __init__(self, data_dir: Path) -> None:
        self.index = MessageIndex()
        self.definitions = DefinitionTable()
        self.queues: dict[str, dict[int, StoredMessage]] = {}  # queue -> live messages by id, in order
        self.bodies = SegmentBodies(messages_directory(data_dir))  # where the bodies of those messages are read
        self.segment = 0  # number of the segment being read
        self.publishes = records.PublishReader()  # shared by all segments, so equal values are shared across them
        self.quarantine = salvage.Quarantine(data_dir)
        self.repairs: list[tuple[Path, bytes, list[tuple[int, int]]]] = []  # files to repair once all is read
        self.misplaced: list[_Misplaced] = []  # publishes whose ids did not increase, in the order read
        self.moved: list[tuple[int, int]] = []  # byte ranges of the current file's misplaced publishes
        self.unkept = False  # some damaged bytes of the current file could not be put in quarantine
        self.set_aside_definitions: list[tuple[str, str]] = []
        self.report = {
            "records": 0, "bytes": 0, "torn_tail_bytes": 0, "corrupt_segments": 0, "corrupt_ranges": 0,
            "quarantined_bytes": 0, "set_aside_records": 0, "rehomed_messages": 0,
            "definitions_damaged": False,
        }

    def read_file(
        self, path: Path, is_tail: bool, types: frozenset[int], apply: Callable[[bytes, memoryview, int, int], None],
    ) -> int:
        """Apply each intact record of ``path`` (the file's bytes, the payload, and where the payload starts and ends
        in them), reading past damage; return the file's size once repaired."""
        data = path.read_bytes()
        self.report["bytes"] += len(data)
        count = 0
        frame_size = records.FRAME_SIZE
        drop: list[tuple[int, int]] = []  # byte ranges the repaired file leaves out
        self.moved = []
        self.unkept = False
        corrupt = False
        offset = 0
        while offset < len(data):
            pos = end = offset
            try:
                for pos, end, payload in records.scan(data, offset):
                    apply(data, payload, pos + frame_size, end)
                    count += 1
                break
            except records.CorruptRecord as bad:
                damage = salvage.damage_at(data, *bad.args, types)
                corrupt |= self._damaged(path, data, damage, is_tail)
                drop.append((damage.start, damage.end))
                offset = damage.end
            except Exception as error:  # whatever the decoders raise for an intact record they cannot make sense of
                self._set_aside(path, data, pos, end, error)
                drop.append((pos, end))
                offset = end
        self.report["records"] += count
        self.report["corrupt_segments"] += corrupt and types is records.SEGMENT_TYPES
        drop = sorted(drop + self.moved)
        if not drop or self.unkept:
            return len(data)  # intact, or damaged bytes that could not be kept elsewhere stay where they are
        self.repairs.append((path, data, drop))
        return len(data) - sum(stop - start for start, stop in drop)

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
        kind = data[start]
        index = self.index
        if kind == records.PUBLISH:
            msg_id, metadata, body_start = self.publishes.read(data, start, end)
            if msg_id <= index.last_id:
                self.misplaced.append(_Misplaced(msg_id, metadata, data[body_start:end]))
                self.moved.append((start - records.FRAME_SIZE, end))
                return
            queues, exchange, routing_key, header_payload = metadata
            where = body_place(self.segment, body_start, end)
            for queue, delivered in index.add_recovered(msg_id, queues):
                messages = self.queues.get(queue)
                if messages is None:
                    messages = self.queues[queue] = {}
                messages[msg_id] = StoredMessage(msg_id, exchange, routing_key, header_payload, None, delivered,
                                                 self.bodies, where)
        elif kind in (records.REMOVED, records.DELIVERED):
            # a compacted publish lists only its live queues, so an older record may name a queue it has left
            queue, ids = records.decode_id_list(payload)
            messages = self.queues.get(queue, {})
            present = [msg_id for msg_id in ids if msg_id in messages]
            if kind == records.REMOVED:
                for msg_id in index.remove(queue, present):
                    del messages[msg_id]
            else:
                for msg_id in index.deliver(queue, present):
                    messages[msg_id].redelivered = True
        else:
            raise ValueError(f"unknown segment record type {kind}")

    def rehome(self, segments_dir: Path, number: int) -> int:
        """Give the misplaced publishes fresh ids (in the order read) in a new segment ``number``, written and
        fsynced before their old copies are repaired away; return its size."""
        index = self.index
        segment = index.roll(number)
        first_id = index.last_id + 1
        out = bytearray()
        for message in self.misplaced:
            queues, exchange, routing_key, header_payload = message.metadata
            # the queue deletions that were made after the message's publish are those above its own id
            queues = tuple(pair for pair in queues if message.msg_id >= index.deleted_below.get(pair[0], -1))
            msg_id = index.last_id + 1
            for queue, delivered in index.add_recovered(msg_id, queues):
                self.queues.setdefault(queue, {})[msg_id] = StoredMessage(
                    msg_id, exchange, routing_key, header_payload, message.body, delivered
                )
            if queues:
                out += records.publish_head(msg_id, queues, exchange, routing_key, header_payload, message.body)
                out += header_payload
                out += message.body
        path = segment_path(segments_dir, number)
        with open(path, "wb") as file:
            file.write(out)
            file.flush()
            os.fsync(file.fileno())
        fsync_directory(segments_dir)
        log.error(
            "%d messages were stored with ids that do not increase (two brokers on one data dir?): they keep their "
            "queues with the new ids %d..%d in %s; an ack recorded for an old id counts for the first message that "
            "had it", len(self.misplaced), first_id, index.last_id, path,
        )
        self.report["rehomed_messages"] = len(self.misplaced)
        segment.size = len(out)
        return segment.size

    def repair(self) -> None:
        """Take the damaged, set-aside and moved ranges out of their files (all are kept elsewhere by now). The
        bodies of live messages in a segment rewritten so are kept in hand first: their places in it change."""
        rewritten = {int(path.stem): data for path, data, drop in self.repairs
                     if path.name != DEFINITIONS_LOG and not (len(drop) == 1 and drop[0][1] == len(data))}
        if rewritten:
            for messages in self.queues.values():
                for message in messages.values():
                    message.keep_body(rewritten)
        for path, data, drop in self.repairs:
            suffix = ".snapshot" if path.name == DEFINITIONS_LOG else ".compacting"
            salvage.repair(path, data, drop, suffix)


def recover(data_dir: Path, segments_dir: Path) -> RecoveredState:
    started = time.perf_counter()
    segments_dir.mkdir(parents=True, exist_ok=True)
    format.check_and_mark(data_dir)
    for leftover in [*segments_dir.glob("*.compacting"), *data_dir.glob("*.snapshot")]:
        leftover.unlink()  # a rewrite interrupted before its rename: the original is intact
    clean_marker = data_dir / CLEAN_MARKER
    clean = clean_marker.exists()
    reader = _Reader(data_dir)
    definitions_log = data_dir / DEFINITIONS_LOG
    definitions_bytes = 0
    if definitions_log.exists():
        definitions_bytes = reader.read_file(
            definitions_log, True, records.DEFINITIONS_TYPES, reader.definition_record
        )
    numbers = segment_numbers(segments_dir)
    index = reader.index
    for position, number in enumerate(numbers):
        reader.segment = number
        segment = index.roll(number)
        segment.size = reader.read_file(
            segment_path(segments_dir, number), position == len(numbers) - 1, records.SEGMENT_TYPES,
            reader.segment_record,
        )
    next_segment = (numbers[-1] + 1) if numbers else 0
    if reader.misplaced:
        reader.rehome(segments_dir, next_segment)
        next_segment += 1
    reader.repair()
    index.head = None
    index.dirty = set(index.segments)
    clean_marker.unlink(missing_ok=True)

    next_msg_id = max([index.last_id + 1, *index.deleted_below.values()])
    messages = {queue: list(by_id.values()) for queue, by_id in reader.queues.items() if by_id}
    definitions = reader.definitions
    report = reader.report
    report.update(
        segments=len(numbers),
        messages=sum(len(queue) for queue in messages.values()),
        clean_shutdown=clean,
        seconds=round(time.perf_counter() - started, 3),
    )
    recovered = Recovered(
        exchanges=definitions.of_kind("exchange"), queues=definitions.of_kind("queue"),
        bindings=definitions.of_kind("binding"), messages=messages, next_msg_id=next_msg_id, report=report,
        vhosts=definitions.of_kind("vhost"), users=definitions.of_kind("user"),
        policies=definitions.of_kind("policy"), permissions=definitions.of_kind("permission"),
        operator_policies=definitions.of_kind("operator_policy"), set_aside_definitions=reader.set_aside_definitions,
    )
    return RecoveredState(recovered, index, definitions, definitions_bytes, next_segment)
