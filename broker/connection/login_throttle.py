"""Repeated failed logins from one address are answered more and more slowly, so that guessing passwords one after
another gets expensive. Memory is bounded and nothing blocks: the connection answers on a loop timer."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

# Longest wait before a refused login is answered: the handshake timeout, so that a refused connection lives no
# longer than one that never logs in.
MAX_DELAY = 10.0
FORGET_AFTER = 60.0  # seconds without a failure after which an address starts again from scratch
MAX_ADDRESSES = 10_000  # addresses remembered at most; the one that failed longest ago is forgotten first


class LoginThrottle:
    """Consecutive refused logins per address: the first is answered at once, the second after `delay`, each further
    one after twice the previous wait, up to MAX_DELAY. A successful login from the address starts it over."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        # address -> (consecutive refused logins, clock time of the last), least recent first
        self.failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def refused(self, address: str, delay: float) -> float:
        """Count a refused login from address; return the seconds to wait before answering it (0 when delay is 0)."""
        if not delay:
            return 0.0
        now = self.clock()
        count, last = self.failures.pop(address, (0, now))
        if now - last > FORGET_AFTER:
            count = 0
        count += 1
        self.failures[address] = (count, now)
        if len(self.failures) > MAX_ADDRESSES:
            self.failures.popitem(last=False)
        if count == 1:
            return 0.0
        return min(delay * 2.0 ** min(count - 2, 16), MAX_DELAY)

    def count_refused(self, address: str, delay: float, then: Callable[[float], None]) -> None:
        """refused(), its wait handed to then: at once here; once the supervisor has counted it, in a worker of
        several (broker.workers.logins), where an address's connections reach any worker."""
        then(self.refused(address, delay))

    def accepted(self, address: str) -> None:
        self.failures.pop(address, None)
