"""A histogram of observed values, cheap enough to fill once per store batch from the writer thread and read from
the event loop (counts only ever grow; a reader may see one observation half counted, never a wrong total later)."""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds  # upper bounds of the buckets, increasing; one more bucket holds what is above
        self.counts = [0] * (len(bounds) + 1)  # observations per bucket (not cumulative)
        self.sum = 0.0  # of every observed value

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, ending with (inf, every observation)."""
        total = 0
        result = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            total += count
            result.append((bound, total))
        return result
