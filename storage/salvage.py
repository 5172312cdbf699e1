"""Reading past damage: find the next intact record after a bad one, keep the damaged bytes, repair the file.

A damaged range that runs to the end of the file is a torn tail (a write cut short); one followed by intact records
is corruption. Either way the bytes go to ``data_dir/quarantine/<file>@<offset>`` before the file is repaired, and
the repair (a cut, or a rewrite without the range: written aside, fsynced, renamed over) makes later starts read the
same state without meeting the damage again.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from storage import records
from storage.segments import fsync_directories, fsync_directory, make_directories

log = logging.getLogger(__name__)

QUARANTINE_DIRECTORY = "quarantine"
CANDIDATE_COST = 256  # search budget spent on each position whose head looked like a record's (in CRC'd bytes)
SEARCH_BUDGET_BASE = 64 << 20  # budget of every search, plus SEARCH_BUDGET_RATIO per byte of file left to search
SEARCH_BUDGET_RATIO = 8


@dataclass(slots=True)
class Damage:
    start: int  # offset of the first unreadable byte
    end: int  # offset of the next intact record (the file size for a torn tail)
    reason: str  # what was wrong at ``start``
    records: int  # records the range held, as far as their frames can be followed
    exact: bool  # whether the frames lead exactly from start to end (else ``records`` is a lower bound)
    gave_up: bool = False  # the search ran out of budget before the end: intact records may be in the range

    @property
    def size(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        count = f"{self.records} record{'s' * (self.records != 1)}"
        return count if self.exact else f"at least {count}"


def next_record(data: bytes, bad: int, types: frozenset[int]) -> tuple[int, bool]:
    """The offset of the first intact record after the bad one at ``bad`` (``len(data)`` if none), and whether the
    search gave up. The bad record's own length is tried first (damage inside a payload leaves it right); then
    each position whose bytes could start a record of ``types`` is checked, cheap tests before the CRC, within a
    budget linear in the bytes searched."""
    view = memoryview(data)
    total = len(view)
    end = records.plausible_end(view, bad, types)
    if end is not None and (end == total or records.record_end(view, end, types) is not None):
        return end, False
    budget = SEARCH_BUDGET_BASE + SEARCH_BUDGET_RATIO * (total - bad)
    pattern = _candidate_pattern(types, total)
    search = pattern.search
    match = search(data, bad + 4)
    while match is not None:
        candidate = match.start() - 3
        budget -= CANDIDATE_COST
        end = records.plausible_end(view, candidate, types)
        if end is not None:
            budget -= end - candidate
            if records.record_end(view, candidate, types) is not None:
                return candidate, False
        if budget < 0:
            return total, True
        match = search(data, match.start() + 1)
    return total, False


def _candidate_pattern(types: frozenset[int], total: int) -> re.Pattern[bytes]:
    """Matches from the last byte of a record's length field to its type byte: the length's top byte cannot exceed
    the file's size, and the type is one of ``types``."""
    top = min(total >> 24, 255)
    kinds = b"".join(re.escape(bytes([kind])) for kind in sorted(types))
    return re.compile(b"[\\x00-" + re.escape(bytes([top])) + b"][\\s\\S]{4}[" + kinds + b"]")


def damage_at(data: bytes, bad: int, reason: str, types: frozenset[int]) -> Damage:
    """The damaged range that starts with the bad record at ``bad``."""
    end, gave_up = next_record(data, bad, types)
    count, exact = _count_frames(data, bad, end)
    return Damage(bad, end, reason, count, exact, gave_up)


def _count_frames(data: bytes, start: int, stop: int) -> tuple[int, bool]:
    """Follow frame lengths from ``start``: how many records lie in [start, stop), and whether they fill it."""
    count = 0
    pos = start
    while stop - pos >= records.FRAME_SIZE:
        length, _ = records.FRAME.unpack_from(data, pos)
        if length == 0 or pos + records.FRAME_SIZE + length > stop:
            break
        count += 1
        pos += records.FRAME_SIZE + length
    if pos == stop:
        return count, True
    return max(count, 1), False


class Quarantine:
    """Where damaged bytes, and what start-up sets aside (``MessageStore.set_aside``), are kept:
    ``data_dir/quarantine``."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / QUARANTINE_DIRECTORY

    def keep(self, source: Path, offset: int, content: bytes | memoryview) -> Path | None:
        """Store ``content`` (found at ``offset`` of ``source``) durably; return the file it went to, or None if it
        could not be written (logged: then ``source`` must keep the bytes)."""
        try:
            return self.write(f"{source.name}@{offset}", (content,))
        except OSError as error:
            log.error("cannot keep %d damaged bytes of %s in %s (%s): the file stays as it is", len(content), source,
                      self.directory, error)
            return None

    def write(self, name: str, chunks: Iterable[bytes | memoryview]) -> Path:
        """Store the chunks durably as one file named ``name``; return it. Raises OSError."""
        changed = {self.directory}  # fsynced once the copy is written (with the data dir if quarantine/ is new)
        target = self._free(name, changed)
        with open(target, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        fsync_directories(changed)
        return target

    def take(self, source: Path, name: str) -> Path:
        """Move the directory ``source`` here, durably, named ``name``; return where it went. Raises OSError."""
        changed = {self.directory, source.parent}  # one gains an entry, the other loses it
        target = self._free(name, changed)
        os.rename(source, target)
        fsync_directories(changed)
        return target

    def _free(self, name: str, changed: set[Path]) -> Path:
        """Where something named ``name`` goes: ``name``, or ``name.1`` and so on if taken (the same offset damaged
        again after a repair, a repair or a set-aside cut short by a crash); makes the directory if missing."""
        make_directories(self.directory, changed)
        target = self.directory / name
        copy = 0
        while target.exists():
            copy += 1
            target = self.directory / f"{name}.{copy}"
        return target


def repair(path: Path, data: bytes, drop: list[tuple[int, int]], temporary_suffix: str) -> bool:
    """Remove the sorted, disjoint byte ranges ``drop`` from the file ``path`` (whose content is ``data``): a cut
    when one range runs to the end, else a rewrite aside then renamed over; True once done. A failure is logged, not
    raised: the file keeps the ranges, and the next start reads past them again."""
    try:
        if len(drop) == 1 and drop[0][1] == len(data):
            with open(path, "r+b") as file:
                file.truncate(drop[0][0])
                os.fsync(file.fileno())
            return True
        view = memoryview(data)
        temporary = path.with_suffix(temporary_suffix)
        with open(temporary, "wb") as file:
            kept_from = 0
            for start, end in drop:
                file.write(view[kept_from:start])
                kept_from = end
            file.write(view[kept_from:])
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        fsync_directory(path.parent)
    except OSError as error:
        log.error("cannot take %d damaged or moved ranges out of %s (%s): the next start reads past them again",
                  len(drop), path, error)
        return False
    return True
