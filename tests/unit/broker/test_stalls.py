"""The watch on a broker process's event loop (broker.stalls): a callback that holds the loop longer than the
threshold is warned of, with how long and where the watching thread found the loop's thread; shorter holds are not;
warnings come at most once a period, the next one counting those between. (The holds are long beside the threshold,
and the threshold beside what a busy machine delays a process by.)"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
import time

import uvloop

from broker.stalls import StallWatch

THRESHOLD = 0.3
CHECK_EVERY = 0.01


def hold(seconds: float) -> None:
    """Hold the loop (and keep the interpreter, but for the switches CPython makes) for seconds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def watched(holds: list[float], warn_every: float = 60.0, thread: bool = True) -> None:
    """An event loop under a StallWatch (and its watching thread, if thread), in which each of holds holds the loop
    in turn, 0.05 s apart (a pause: a long one), and then ends."""
    watching = []

    async def main() -> None:
        watch = StallWatch(THRESHOLD, CHECK_EVERY, warn_every)
        watch.attach(asyncio.get_running_loop())
        if thread:
            watching.append(threading.Thread(target=watch.watch, daemon=True))
            watching[0].start()
        for seconds in holds:
            await asyncio.sleep(0.05 if seconds else warn_every)
            hold(seconds)
        await asyncio.sleep(0.05)

    asyncio.run(main())
    for each in watching:
        each.join(5)
        assert not each.is_alive(), "the watching thread ends with its loop"


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "broker.stalls"]


def held(warning: str) -> float:
    found = re.match(r"the event loop was held for at least (\d+\.\d\d) s", warning)
    assert found, warning
    return float(found.group(1))


def test_a_hold_longer_than_the_threshold_is_warned_of_with_where_the_loop_was(caplog):
    with caplog.at_level(logging.WARNING, "broker.stalls"):
        watched([0.5])
    [warning] = warnings_of(caplog)
    assert held(warning) >= 0.5 - CHECK_EVERY, warning
    assert ", found at broker/test_stalls.py:" in warning and " hold < broker/test_stalls.py:" in warning, warning
    assert "the other threads" not in warning, warning  # (the loop's own code held it)


def test_holds_shorter_than_the_threshold_are_not_warned_of(caplog):
    with caplog.at_level(logging.WARNING, "broker.stalls"):
        watched([0.1] * 3)
    assert warnings_of(caplog) == []


def test_a_warning_comes_at_most_once_a_period_and_counts_the_holds_since_the_last(caplog):
    with caplog.at_level(logging.WARNING, "broker.stalls"):
        watched([0.4, 0.6, 0.5, 0, 0.7], warn_every=2.0)  # (0: a pause of the period)
    first, second = warnings_of(caplog)  # (of the holds of 0.4 and 0.7 s; those of 0.6 and 0.5 s counted)
    assert held(first) >= 0.4 - CHECK_EVERY and "since the last warning" not in first, first
    assert held(second) >= 0.7 - CHECK_EVERY, second
    longest = re.search(r" \(2 more held it since the last warning, the longest for at least (\d\.\d\d) s\)$", second)
    assert longest and float(longest.group(1)) >= 0.6 - CHECK_EVERY, second  # (the longer of the two)


def test_a_hold_the_watching_thread_does_not_see_into_is_warned_of_without_where(caplog):
    """As when a C call keeps the interpreter throughout (a collection of the garbage collector): here no thread
    looks."""
    with caplog.at_level(logging.WARNING, "broker.stalls"):
        watched([0.5], thread=False)
    [warning] = warnings_of(caplog)
    assert held(warning) >= 0.5 - CHECK_EVERY and "found at" not in warning, warning


def test_a_long_hold_is_said_by_the_watching_thread_while_it_lasts(caplog):
    """(As a loop that never turns again would say nothing itself.)"""
    async def main() -> None:
        watch = StallWatch(THRESHOLD, CHECK_EVERY, 60.0, still_held=0.6)
        watch.attach(asyncio.get_running_loop())
        watching = threading.Thread(target=watch.watch, daemon=True)
        watching.start()
        await asyncio.sleep(0.05)
        hold(1.0)
        said_meanwhile.extend(warnings_of(caplog))
        await asyncio.sleep(0.05)

    said_meanwhile: list[str] = []
    with caplog.at_level(logging.WARNING, "broker.stalls"):
        asyncio.run(main())
    [during] = said_meanwhile
    said = re.match(r"the event loop has been held for \d s so far, found at broker/test_stalls.py:\d+ hold < ", during)
    assert said, during
    during_too, after = warnings_of(caplog)
    assert during_too == during and held(after) >= 1.0 - CHECK_EVERY, after


def test_a_loop_found_in_no_code_of_its_own_is_found_with_where_the_other_threads_were():
    """As when another thread keeps the interpreter in a C call (the copy of a batch of 20 MB): the loop's own thread
    shows nothing but the loop's run, so the watching thread says where the others were."""
    release = threading.Event()
    holder = threading.Thread(target=lambda: holding(release), name="holder", daemon=True)
    holder.start()

    async def main() -> str | None:
        watch = StallWatch(THRESHOLD, 60.0, 60.0)  # (no beat comes meanwhile)
        watch.attach(asyncio.get_running_loop())

        def looking() -> None:  # (on a thread of the loop's executor, once the loop waits in its C code)
            deadline = time.monotonic() + 5
            while sys._current_frames()[watch.loop_thread] is not watch.outside and time.monotonic() < deadline:
                time.sleep(0.001)
            watch.due = time.monotonic() - 1  # (overdue: a stall)
            watch.look()

        await asyncio.get_running_loop().run_in_executor(None, looking)
        return watch.found[1] if watch.found else None

    try:
        found = uvloop.run(main())
    finally:
        release.set()
    assert found is not None
    assert found.startswith("asyncio/runners.py:") and "; the other threads: " in found, found
    holder_found = r"; the other threads: .*holder at [^;]*threading.py:\d+ wait < broker/test_stalls.py:\d+ holding"
    assert re.search(holder_found, found), found


def holding(release: threading.Event) -> None:
    release.wait()
