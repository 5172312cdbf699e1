"""Start-up: read the definitions log and the segments in order, rebuild the queues and the index.

A torn or corrupt record at the end of a file (a write cut short by a crash) is truncated away with a warning.
Corruption inside an older segment is reported as an error; the records before it are kept.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage import records
from storage.definitions import DefinitionTable
from storage.index import MessageIndex
from storage.segments import CLEAN_MARKER, DEFINITIONS_LOG, segment_numbers, segment_path

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StoredMessage:
    msg_id: int  # broker-wide id, assigned by the broker, increasing
    exchange: str
    routing_key: str
    header_payload: bytes  # raw AMQP content-header payload (class 60, weight, body size, flags, properties)
    body: bytes
    redelivered: bool  # it had been delivered from this queue before the stop


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


@dataclass
class RecoveredState:
    """What the store itself keeps from recovery."""

    recovered: Recovered
    index: MessageIndex
    definitions: DefinitionTable
    definitions_log_bytes: int  # current size of the definitions log
    next_segment: int  # number for the first segment written from now on


class _Reader:
    def __init__(self) -> None:
        self.index = MessageIndex()
        self.definitions = DefinitionTable()
        self.queues: dict[str, dict[int, StoredMessage]] = {}  # queue -> live messages by id, in order
        self.publishes = records.PublishReader()  # shared by all segments, so equal values are shared across them
        self.report = {"records": 0, "bytes": 0, "torn_tail_bytes": 0, "corrupt_segments": 0}

    def read_file(self, path: Path, is_tail: bool, apply: Callable[[bytes, memoryview, int, int], None]) -> int:
        """Apply each intact record of ``path`` (the file's bytes, the payload, and where the payload starts and ends
        in them); return the size of its intact prefix."""
        data = path.read_bytes()
        self.report["bytes"] += len(data)
        count = 0
        frame_size = records.FRAME_SIZE
        try:
            for pos, end, payload in records.scan(data):
                apply(data, payload, pos + frame_size, end)
                count += 1
            intact = len(data)
        except records.CorruptRecord as corrupt:
            intact, reason = corrupt.args
            if is_tail:
                log.warning("%s: %s at offset %d, truncating %d bytes", path, reason, intact, len(data) - intact)
                os.truncate(path, intact)
                self.report["torn_tail_bytes"] += len(data) - intact
            else:
                log.error("%s: %s at offset %d, ignoring the %d bytes after it", path, reason, intact,
                          len(data) - intact)
                self.report["corrupt_segments"] += 1
        self.report["records"] += count
        return intact

    def definition_record(self, data: bytes, payload: memoryview, start: int, end: int) -> None:
        kind = payload[0]
        if kind == records.DEFINITION:
            self.definitions.apply_recovered(*records.decode_definition(payload))
        elif kind == records.QUEUE_DELETED:
            queue, below = records.decode_queue_deleted(payload)
            self.index.deleted_below[queue] = max(below, self.index.deleted_below.get(queue, 0))
        else:
            raise ValueError(f"unknown definitions record type {kind}")

    def segment_record(self, data: bytes, payload: memoryview, start: int, end: int) -> None:
        kind = data[start]
        index = self.index
        if kind == records.PUBLISH:
            msg_id, (queues, exchange, routing_key, header_payload), body = self.publishes.read(data, start, end)
            for queue, delivered in index.add_recovered(msg_id, queues):
                messages = self.queues.get(queue)
                if messages is None:
                    messages = self.queues[queue] = {}
                messages[msg_id] = StoredMessage(msg_id, exchange, routing_key, header_payload, body, delivered)
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


def recover(data_dir: Path, segments_dir: Path) -> RecoveredState:
    started = time.perf_counter()
    segments_dir.mkdir(parents=True, exist_ok=True)
    for leftover in [*segments_dir.glob("*.compacting"), *data_dir.glob("*.snapshot")]:
        leftover.unlink()  # a rewrite interrupted before its rename: the original is intact
    clean_marker = data_dir / CLEAN_MARKER
    clean = clean_marker.exists()
    reader = _Reader()
    definitions_log = data_dir / DEFINITIONS_LOG
    definitions_bytes = 0
    if definitions_log.exists():
        definitions_bytes = reader.read_file(definitions_log, True, reader.definition_record)
    numbers = segment_numbers(segments_dir)
    index = reader.index
    for position, number in enumerate(numbers):
        segment = index.roll(number)
        segment.size = reader.read_file(
            segment_path(segments_dir, number), position == len(numbers) - 1, reader.segment_record
        )
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
        policies=definitions.of_kind("policy"),
    )
    return RecoveredState(recovered, index, definitions, definitions_bytes, (numbers[-1] + 1) if numbers else 0)
