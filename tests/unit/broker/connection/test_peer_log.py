"""Rate-limited log lines about peers, and tracebacks of internal errors at most once per interval."""

import asyncio
import logging

from broker.connection import peer_log
from broker.connection.peer_log import LINES_PER_WINDOW, PeerLog


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
