"""Rewrite one segment in place, keeping only what is still needed, a slice at a time.

Publishes keep only their live queues (and carry each queue's delivered flag); REMOVED/DELIVERED records keep only
the ids whose publish sits in an older segment that still needs them. The rewrite is written aside, fsynced and
renamed over the segment, so a crash leaves either the old file or the new one, and both recover the same state.
Recovery repairs every file it reads, so a damaged record met here appeared since start: ``steps`` raises
``CorruptRecord`` and the writer abandons the rewrite, keeping the segment whole.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path

from storage import records
from storage.index import MessageIndex, Segment
from storage.segments import fsync_directory, segment_path

SLICE_BYTES = 1 << 20  # input bytes handled per step, so a pending batch never waits long behind a compaction


class Compaction:
    """One segment's rewrite; the writer thread drives ``steps`` between batches."""

    def __init__(self, directory: Path, segment: Segment, index: MessageIndex) -> None:
        self.segment = segment
        self.upto = index.seq  # every REMOVED/DELIVERED record up to here is already reflected in the index
        self._index = index
        # Which older segments exist, taken on the loop when the job is made: one forgotten later is still on disk
        # until the batch that deletes it is written, so the rewrite must keep the records aimed at it.
        firsts, homes = index.homes_snapshot()
        self._firsts = firsts  # first ids of the segments holding publishes, ascending
        self._homes = [home.number for home in homes]  # the segments of _firsts
        self._compacted_upto = {number: older.compacted_upto for number, older in index.segments.items()}
        self._path = segment_path(directory, segment.number)
        self._temporary = self._path.with_suffix(".compacting")
        self.size: int | None = None  # size of the rewritten file once done
        self.refers: dict[int, int] = {}  # older segment -> seq, for the records the rewrite kept

    def steps(self) -> Iterator[int]:
        """Do the rewrite, yielding the input bytes of each slice; sets ``size`` and ``refers`` once replaced."""
        data = self._path.read_bytes()
        with open(self._temporary, "wb") as target:
            out = bytearray()
            mark = 0
            for start, end, payload in records.scan(data):
                self._copy(payload, data, start, end, out)
                if end - mark >= SLICE_BYTES:
                    target.write(out)
                    out.clear()
                    yield end - mark
                    mark = end
            target.write(out)
            target.flush()
            os.fdatasync(target.fileno())
            self.size = target.tell()
        os.replace(self._temporary, self._path)
        fsync_directory(self._path.parent)

    def abandon(self) -> None:
        try:
            self._temporary.unlink(missing_ok=True)
        except OSError:
            pass  # recovery removes a leftover rewrite at the next start

    def _copy(self, payload: memoryview, data: bytes, start: int, end: int, out: bytearray) -> None:
        kind = payload[0]
        index = self._index
        segment = self.segment
        if kind == records.PUBLISH:
            publish = records.decode_publish(payload)
            live = index.live_queues(segment, publish.msg_id, publish.queues)
            if live == publish.queues:
                out += data[start:end]
            elif live:
                out += records.publish_head(
                    publish.msg_id, live, publish.exchange, publish.routing_key, publish.header_payload, publish.body
                )
                out += publish.header_payload
                out += publish.body
            return
        queue, ids = records.decode_id_list(payload)
        if not ids:
            return
        # The ids in order, taken a run per segment of publishes they fall in (the segments' first ids bound each
        # run), each run kept or dropped whole: a cost per segment spanned rather than per id (a REMOVED record of
        # a multiple ack holds thousands). The order of a record's ids means nothing.
        ordered = sorted(ids)
        firsts = self._firsts
        kept: list[int] = []
        for position in range(max(0, bisect_right(firsts, ordered[0]) - 1), bisect_right(firsts, ordered[-1])):
            older = self._homes[position]
            if older == segment.number or not self._still_needed_by(older):
                continue
            low = bisect_left(ordered, firsts[position])
            high = bisect_left(ordered, firsts[position + 1]) if position + 1 < len(firsts) else len(ordered)
            if low < high:
                kept += ordered[low:high]
                self.refers[older] = segment.refers[older]
        if kept:
            out += records.id_list(kind, queue, kept)

    def _still_needed_by(self, older: int) -> bool:
        """Whether this segment's records aimed at segment ``older`` matter (``MessageIndex.depends_on``, as of
        the job's making)."""
        upto = self._compacted_upto.get(older)
        return upto is not None and self.segment.refers.get(older, 0) > upto
