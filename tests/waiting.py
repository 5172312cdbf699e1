"""The suite's one polling helper (tests/conftest.py imports it too), and its wait for the turns in which work done in
slices goes on; the standard library alone, so that the bench tools and the cluster's client processes can import it
without pytest."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# A broker's timers count whole milliseconds from the time its event loop read at the start of its turn (libuv), so a
# delay may end up to a millisecond or two before its nominal length, as another clock measures it
TIMER_GRAIN = 0.002


def wait_for(condition: Callable[[], T], timeout: float = 15.0, what: str = "the condition", step: float = 0.02,
             *, until: Callable[[T], object] = bool) -> T:
    """Call condition() every `step` s until until(its value) holds (by default: it is truthy); return that value."""
    deadline = time.monotonic() + timeout
    while not until(value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; last value: {str(value)[-3000:]}")
        time.sleep(step)
    return value


async def two_loop_turns() -> None:
    """Let the running event loop turn twice: the line of slices (broker.model.turns) runs its first at the next turn,
    and then one every other turn, after the replies of the turn between."""
    for _ in range(2):
        await asyncio.sleep(0)
