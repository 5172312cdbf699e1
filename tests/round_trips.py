"""Another client's round trips, timed while a test keeps the broker busy: passive declares of a queue of its own, one
after another, in a process of its own. On a thread of the test's process they waited for the interpreter behind
whatever the test did meanwhile (reading a listing of 100,000 queues: 20 ms a round trip, up to 55 ms, where a process
of their own measured 4 ms, up to 39 ms)."""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any

from pamqp import commands

from tests.conftest import logged_at
from tests.integration.rawclient import RawClient

ROUND_TRIP_BOUND = 0.05  # seconds another client's round trip may take meanwhile
PAUSE = 0.001  # seconds between two round trips (so that they time the broker, not load it)
STALL = "broker.stalls:"  # the logger of what a broker says of a stall of its event loop (broker.stalls)

Times = list[tuple[float, float]]  # (time.time() at its end, seconds it took) of each round trip


def _timed(sock: socket.socket, stopping: Event, times: Connection) -> None:
    """The round trips on the connection sock is (open, with channel 1), from a queue of its own declared (said on
    times: None) until stopping is set; then their Times on times."""
    taken: Times = []
    with RawClient(sock, timeout=30) as client:
        client.send(1, commands.Queue.Declare(queue="", exclusive=True))
        own = client.expect(commands.Queue.DeclareOk).queue
        times.send(None)
        while not stopping.is_set():
            started = time.monotonic()
            client.send(1, commands.Queue.Declare(queue=own, passive=True))
            client.expect(commands.Queue.DeclareOk)
            taken.append((time.time(), time.monotonic() - started))
            time.sleep(PAUSE)
    times.send(taken)


class RoundTrips:
    """_timed() in a process of its own, from its construction (once its queue is declared) to stop(): on a
    connection of its own to broker (anything with .host and .port), or on client's (open, with channel 1: one the
    test chose, say on a given worker), which is the process's from then on."""

    def __init__(self, broker: Any = None, client: RawClient | None = None) -> None:
        if client is None:
            client = RawClient.connect(broker, timeout=30)
            client.handshake()
            client.open_channel(1)
        context = multiprocessing.get_context("spawn")  # (a fork would copy the test's threads' locks, held or not)
        self.stopping = context.Event()
        self.received, sent = context.Pipe(duplex=False)
        self.process = context.Process(target=_timed, args=(client.sock, self.stopping, sent), daemon=True)
        self.process.start()
        sent.close()
        client.close()  # (the process holds the connection's socket now)
        self._received(60, "declared its queue")

    def stop(self) -> Times:
        self.stopping.set()
        times = self._received(60, "ended")
        self.process.join()
        return times

    def _received(self, timeout: float, what: str) -> Any:
        if not self.received.poll(timeout):
            self.process.kill()
            raise TimeoutError(f"the other client's round trips: not {what} within {timeout:.0f} s")
        return self.received.recv()


def slowest(times: Times) -> float:
    return max((took for _, took in times), default=0.0)


def describe(times: Times, log: str = "") -> str:
    """The round trips' figures, and when each one over the bound ended (time.time(), to find in a broker's log);
    with the broker's log (the text format), the stalls of its event loop that it logged meanwhile (broker.stalls)."""
    if not times:
        return "no round trip"
    ordered = sorted(took for _, took in times)
    over = [f"{took * 1000:.0f} ms at {ended:.3f}" for ended, took in times if took > ROUND_TRIP_BOUND]
    stalls = stalls_logged(log, min(ended - took for ended, took in times), max(ended for ended, _ in times))
    return (f"{len(ordered):,} round trips: p50 {statistics.median(ordered) * 1000:.1f} ms, p99 "
            f"{ordered[len(ordered) * 99 // 100] * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms, {len(over)} over "
            f"{ROUND_TRIP_BOUND * 1000:.0f} ms{': ' if over else ''}{', '.join(over)}"
            f"{'; the broker logged: ' if stalls else ''}{' / '.join(stalls)}")


def stalls_logged(log: str, since: float, until: float) -> list[str]:
    """The lines of log (the text format) that say its event loop was held, logged from since to until (time.time(),
    with a second's slack: the line comes once the loop turns again)."""
    found = []
    for line in log.splitlines():
        if STALL in line:
            try:
                at = logged_at(line[:23])
            except ValueError:
                continue
            if since - 1 <= at <= until + 1:
                found.append(line)
    return found
