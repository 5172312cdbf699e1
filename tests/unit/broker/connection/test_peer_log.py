"""Rate-limited log lines about peers, and tracebacks of internal errors at most once per interval."""

import asyncio
import logging

from broker.connection import peer_log
from broker.connection.peer_log import LINES_PER_WINDOW, TOTAL_LINES_PER_WINDOW, PeerLog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lines_about_one_address_are_limited_and_the_rest_summed_up(caplog, monkeypatch):
    monkeypatch.setattr(peer_log, "WINDOW", 0.05)

    async def flood():
        log = PeerLog(logging.getLogger("test.peer_log"))
        for n in range(100):
            log.warning("192.0.2.1", "closing 192.0.2.1:%d: bad frame", n)
        log.warning("192.0.2.2", "closing 192.0.2.2:1: bad frame")  # another address has lines of its own
        await asyncio.sleep(0.2)

    with caplog.at_level(logging.WARNING, "test.peer_log"):
        asyncio.run(flood())
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [f"closing 192.0.2.1:{n}: bad frame" for n in range(LINES_PER_WINDOW)] + [
        "closing 192.0.2.2:1: bad frame",
        f"{100 - LINES_PER_WINDOW} more lines about 192.0.2.1 in 0 s were left out of the log"]


def test_lines_about_many_addresses_are_limited_in_all_and_the_rest_summed_up(caplog, monkeypatch):
    """A flood from many addresses, a few lines each (under each address's own limit): TOTAL_LINES_PER_WINDOW lines
    in all, then one line for the rest, the addresses' own summaries counted in it."""
    monkeypatch.setattr(peer_log, "WINDOW", 0.05)
    addresses = 3 * TOTAL_LINES_PER_WINDOW
    clock = Clock()  # still while the flood comes: it all falls in one window, however long it takes

    async def flood():
        log = PeerLog(logging.getLogger("test.peer_log"), clock)
        for n in range(addresses):
            for _ in range(LINES_PER_WINDOW + 1):  # one line past its own limit: its summary is a line too
                log.warning(f"2001:db8::{n:x}", "closing [2001:db8::%x]:1: bad frame", n)
        clock.now += 1.0  # the summaries come in the next window
        await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, "test.peer_log"):
        asyncio.run(flood())
    lines = [record.getMessage() for record in caplog.records]
    logged = TOTAL_LINES_PER_WINDOW  # the first addresses' lines, in order
    assert lines[:logged] == [f"closing [2001:db8::{n // LINES_PER_WINDOW:x}]:1: bad frame" for n in range(logged)]
    sums = lines[logged:]  # the flood's window and the next, where its summaries come: each window's lines capped
    assert len(lines) <= 2 * (TOTAL_LINES_PER_WINDOW + 1)
    counted = [int(line.split()[0]) for line in sums]  # each a summary: of one address, or of a window's excess
    assert sum(counted) == addresses * (LINES_PER_WINDOW + 1) - logged  # every line left out is counted once
    assert any(line.endswith("more lines about peers in 0 s were left out of the log") for line in sums)


def test_a_traceback_at_most_once_per_interval_then_one_line(caplog):
    clock = Clock()
    log = PeerLog(logging.getLogger("test.peer_log"), clock)
    with caplog.at_level(logging.ERROR, "test.peer_log"):
        for _ in range(3):
            try:
                raise KeyError("x" * 1000)
            except KeyError:
                log.internal_error("192.0.2.1", "internal error on channel %d of %s", 1, "192.0.2.1:5")
        clock.now += peer_log.TRACEBACK_INTERVAL
        try:
            raise KeyError("later")
        except KeyError:
            log.internal_error("192.0.2.1", "internal error on channel %d of %s", 1, "192.0.2.1:5")
    with_traceback = [record.exc_info is not None for record in caplog.records]
    assert with_traceback == [True, False, False, True]
    assert caplog.records[1].getMessage().startswith("internal error on channel 1 of 192.0.2.1:5: KeyError('xxx")
    assert len(caplog.records[1].getMessage()) < 260
