"""Message ids as the cluster tools carry them: a body starts with its id, and sets of ids travel as ranges."""

from __future__ import annotations

import struct
from collections.abc import Iterable

ID = struct.Struct(">Q")  # the first 8 bytes of every body: the message's id, big-endian

Ranges = list[list[int]]  # sorted, disjoint [start, stop) pairs, as range() takes them


def to_ranges(sorted_ids: Iterable[int]) -> Ranges:
    """Ascending distinct ids as the runs of consecutive ids they form."""
    ranges: Ranges = []
    for value in sorted_ids:
        if ranges and ranges[-1][1] == value:
            ranges[-1][1] = value + 1
        else:
            ranges.append([value, value + 1])
    return ranges


def count_of(ranges: Ranges) -> int:
    return sum(stop - start for start, stop in ranges)


def describe(ranges: Ranges, limit: int = 5) -> str:
    """'0-99, 200, 300-304' (inclusive ends), the first `limit` runs, then how many more."""
    shown = [f"{start}" if stop == start + 1 else f"{start}-{stop - 1}" for start, stop in ranges[:limit]]
    if len(ranges) > limit:
        shown.append(f"... ({len(ranges) - limit} more runs)")
    return ", ".join(shown) or "none"
