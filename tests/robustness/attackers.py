"""What the tests that attack a broker from processes of their own share: ending the attackers, and the figure
they are judged by."""

from __future__ import annotations

import multiprocessing


def stop_all(attackers: list[multiprocessing.Process], grace: float) -> None:
    """Wait up to grace seconds for each attacker to end by itself, then kill it."""
    for process in attackers:
        process.join(grace)
        if process.is_alive():
            process.kill()


def p99(latencies: list[float]) -> float:
    """The 99th percentile of round-trip times, in seconds."""
    ordered = sorted(latencies)
    return ordered[int(len(ordered) * 0.99)]
