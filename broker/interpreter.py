"""A broker process's interpreter settings (one process, a worker, a node of a cluster, the supervisor of several
workers): how long a thread keeps the interpreter while another waits for it, the cyclic garbage collector's policy
(broker.collector), and the watch on the event loop's stalls (broker.stalls)."""

from __future__ import annotations

import sys
from typing import Final

from broker import collector, stalls

# Seconds a thread keeps the interpreter lock while another waits for it (CPython's default: 0.005). The event loop's
# thread waits that long each time it wakes while the store's writer works: a multiple nack of 400,000 persistent
# messages to a dead-letter queue held another client's round trips p99 33 to 41 ms, up to 57, with 5 ms, and p99 6
# to 16 ms, up to 48, with 1 ms (four runs each); the throughput of the benchmarks did not move.
SWITCH_INTERVAL: Final = 0.001


def tune() -> None:
    """Set the process's switch interval, its collector's policy and its stall watch, from its event loop (at its
    start)."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    collector.install()
    stalls.watch()
