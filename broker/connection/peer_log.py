"""Log lines about peers, rate-limited per address and in all, and tracebacks of internal errors at most once a
minute: nothing clients send, however often and from however many addresses, can flood the log (or spend the event
loop's time writing it)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

LINES_PER_WINDOW = 20  # lines about one address per WINDOW (an application opening its connections is logged whole);
# the others are counted and summed up in one line
WINDOW = 1.0  # seconds
TOTAL_LINES_PER_WINDOW = 200  # lines of one PeerLog per WINDOW, whatever the addresses (a flood from many of them)
TRACEBACK_INTERVAL = 60.0  # seconds between two logged tracebacks of internal errors; the others get one line
MAX_ADDRESSES = 10_000  # addresses with a window open at most; the oldest window is dropped first


class _Window:
    __slots__ = ("start", "logged", "suppressed")

    def __init__(self, start: float):
        self.start = start  # clock time the window opened
        self.logged = 0  # lines logged in it
        self.suppressed = 0  # lines left out of it


class PeerLog:
    """A logger's lines about one peer address, LINES_PER_WINDOW per WINDOW at most; when lines
    were left out, one line says how many once the window has passed."""

    def __init__(self, logger: logging.Logger, clock=time.monotonic):
        self.logger = logger
        self.clock = clock
        self.windows: dict[str, _Window] = {}  # address -> its current window, oldest first
        self.total = _Window(float("-inf"))  # the current window of every address's lines together
        self.last_traceback = float("-inf")  # clock time of the last traceback logged

    def info(self, address: str, message: str, *args: object) -> None:
        self._log(logging.INFO, address, message, args)

    def warning(self, address: str, message: str, *args: object) -> None:
        self._log(logging.WARNING, address, message, args)

    def internal_error(self, address: str, message: str, *args: object) -> None:
        """An unexpected exception, from an except block: logged with its traceback at most once per
        TRACEBACK_INTERVAL (an internal bug needs one to be fixed), otherwise in one line."""
        now = self.clock()
        if now - self.last_traceback >= TRACEBACK_INTERVAL:
            self.last_traceback = now
            self.logger.exception(message, *args)
        else:
            self._log(logging.ERROR, address, message + ": %.200r", (*args, sys.exc_info()[1]))

    def _log(self, level: int, address: str, message: str, args: tuple) -> None:
        now = self.clock()
        window = self.windows.get(address)
        if window is None or now - window.start >= WINDOW:
            window = self._open_window(address, now)
        if window.logged < LINES_PER_WINDOW:
            window.logged += 1
            if self._within_total(now, 1):
                self.logger.log(level, message, *args)
            return
        if not window.suppressed:
            asyncio.get_running_loop().call_later(window.start + WINDOW - now, self._summarize, address, window)
        window.suppressed += 1

    def _within_total(self, now: float, lines: int) -> bool:
        """Whether a line (standing for ``lines`` lines) fits in this log's total for the window; if not, it is
        counted, and one line sums up those left out once the window has passed."""
        total = self.total
        if now - total.start >= WINDOW:
            total = self.total = _Window(now)
        if total.logged < TOTAL_LINES_PER_WINDOW:
            total.logged += 1
            return True
        if not total.suppressed:
            asyncio.get_running_loop().call_later(total.start + WINDOW - now, self._summarize_total, total)
        total.suppressed += lines
        return False

    def _open_window(self, address: str, now: float) -> _Window:
        self.windows.pop(address, None)
        window = self.windows[address] = _Window(now)
        if len(self.windows) > MAX_ADDRESSES:
            del self.windows[next(iter(self.windows))]
        return window

    def _summarize(self, address: str, window: _Window) -> None:
        if self.windows.get(address) is window:
            del self.windows[address]
        if self._within_total(self.clock(), window.suppressed):
            self.logger.warning("%d more lines about %s in %.0f s were left out of the log", window.suppressed,
                                address, WINDOW)

    def _summarize_total(self, total: _Window) -> None:
        self.logger.warning("%d more lines about peers in %.0f s were left out of the log", total.suppressed, WINDOW)
