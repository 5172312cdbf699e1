"""`--workers`: a listing over every vhost, and the definitions' export, are made of every worker's answer by the
supervisor's API. Those answers (118 MB for 100,000 queues) are decoded, kept, merged and sorted on a thread whose
objects the collector does not walk, and an answer passed on as it came is written a chunk at a time: decoded on the
supervisor's event loop, they held every other API request 0.6 to 1.2 s."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from pamqp import commands, frame

from tests.integration.management import request
from tests.integration.rawclient import RawClient
from tests.integration.test_large_listings import read
from tests.integration.test_workers import workers  # noqa: F401 (the fixture)

if os.environ.get("WARREN_TEST_URL"):
    pytest.skip("starts brokers of its own", allow_module_level=True)

QUEUES = 100_000  # in "/", which worker 0 leads
OTHERS = 100  # in v1, which worker 1 leads
WRITE = 10_000  # declares a write holds
# Another API request's slowest answer meanwhile. It crosses the supervisor's event loop and a worker's, each
# several times, while the listing keeps both cores of a 2-core machine busy (worker 0 encoding, the supervisor
# decoding and encoding again): 40 to 95 ms were measured; every request waited for each decoding, 0.6 to 1.2 s.
REQUEST_BOUND = 0.25


class ApiRoundTrips(threading.Thread):
    """Another client's API requests, one after another, each timed."""

    def __init__(self, broker, path: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.path = path
        self.slowest = 0.0
        self.failed: list[int] = []  # statuses other than 200
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            status = request(self.broker, "GET", self.path, timeout=30).status
            self.slowest = max(self.slowest, time.monotonic() - started)
            if status != 200:
                self.failed.append(status)

    def stop(self) -> float:
        self.stopping.set()
        self.join()
        return self.slowest


def declared(broker, vhost: str, names: list[str]) -> None:
    """The queues declared in vhost, without replies but the last."""
    with RawClient.connect(broker, timeout=60) as client:
        client.handshake(vhost=vhost)
        client.open_channel(1)
        for start in range(0, len(names), WRITE):
            client.send_raw(b"".join(frame.marshal(commands.Queue.Declare(queue=name, nowait=True), 1)
                                     for name in names[start:start + WRITE]))
        client.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every declare before it is made
        client.expect(commands.Basic.QosOk, timeout=60)


@pytest.mark.alone
def test_listings_made_of_every_workers_answer_hold_no_other_request(workers):
    broker = workers()
    mine = [f"q-{number:06d}" for number in range(QUEUES)]
    others = [f"o-{number:03d}" for number in range(OTHERS)]
    declared(broker, "/", mine)
    declared(broker, "v1", others)
    round_trips = ApiRoundTrips(broker, "/api/vhosts/v1")  # (answered by worker 1, through the supervisor)
    round_trips.start()
    try:
        whole = read(broker, "GET", "/api/queues")
        named = read(broker, "GET", "/api/queues?columns=vhost,name")
        exported = read(broker, "GET", "/api/definitions")
    finally:
        slowest = round_trips.stop()
    assert slowest < REQUEST_BOUND, f"another API request's slowest answer: {slowest * 1000:.0f} ms"
    assert not round_trips.failed
    expected = [("/", name) for name in mine] + [("v1", name) for name in others]  # (sorted by vhost, then name)
    assert [(queue["vhost"], queue["name"]) for queue in json.loads(named)] == expected
    assert [(queue["vhost"], queue["name"]) for queue in json.loads(whole)] == expected
    definitions = json.loads(exported)
    assert sorted((queue["vhost"], queue["name"]) for queue in definitions["queues"]) == expected
    assert {vhost["name"] for vhost in definitions["vhosts"]} >= {"/", "v1"}
