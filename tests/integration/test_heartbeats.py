"""Heartbeats as rabbit_heartbeat sends them: checked every half interval, sent whenever nothing else went out since
the last check (a heartbeat of our own is not traffic), so a client with a short idle timeout is never dropped."""

from __future__ import annotations

import time

from tests.integration.rawclient import RawClient, describe

LISTEN_FOR = 3.0  # seconds of an idle connection with heartbeat 1 s: six half intervals


def test_an_idle_connection_gets_a_heartbeat_every_half_interval(broker):
    with RawClient.connect(broker) as client:
        client.handshake(heartbeat=1)
        arrivals, started = [], time.monotonic()
        while time.monotonic() - started < LISTEN_FOR:
            client.send_heartbeat()  # keep our side of the bargain, so that only the broker's beats are counted
            try:
                channel, value = client.read_frame(timeout=0.2, skip_heartbeats=False)
            except TimeoutError:
                continue
            assert (channel, describe(value)) == (0, "Heartbeat()")
            arrivals.append(time.monotonic() - started)
        # One per half second, give or take a tick: one beat a second (skipping a beat after each of our own)
        # would give three.
        assert len(arrivals) >= 5, arrivals
