"""Listing 100,000 queues through the management API (a page, a page of those a name or a regex filter keeps, the
whole listing) holds the broker's other clients a few milliseconds at a time: the queues are sorted and filtered on
a thread, and only the page's own are shown (a page held them 125 to 140 ms while every queue's entry was made
ready first)."""

from __future__ import annotations

import pytest
from pamqp import commands, frame

from tests.integration.management import quote, request
from tests.integration.rawclient import RawClient
from tests.integration.test_large_settlements import ROUND_TRIP_BOUND, RoundTrips

QUEUES = 100_000
WRITE = 10_000  # declares a write holds


@pytest.mark.alone
def test_pages_of_a_hundred_thousand_queues_hold_no_other_client(broker, unique):
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ")
    with RawClient.connect(broker, timeout=60) as client:
        client.handshake()
        client.open_channel(1)
        for start in range(0, QUEUES, WRITE):  # (declares without a reply; their connection owns none of them)
            client.send_raw(b"".join(frame.marshal(commands.Queue.Declare(
                queue=f"{unique}-{number:06d}", nowait=True), 1) for number in range(start, start + WRITE)))
        client.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every declare before it is made
        client.expect(commands.Basic.QosOk, timeout=60)
        round_trips = RoundTrips(broker)
        round_trips.start()
        try:
            page = request(broker, "GET", "/api/queues/%2F?page=2&page_size=100").body
            named = request(broker, "GET", f"/api/queues/%2F?page=1&page_size=10&name={unique}-01234").body
            matched = request(broker, "GET", f"/api/queues/%2F?page=1&page_size=500&use_regex=true&name="
                                             f"{quote(f'^{unique}-0009..$')}").body
            whole = request(broker, "GET", "/api/queues/%2F?columns=name").body
        finally:
            slowest = round_trips.stop()
        for number in range(QUEUES):
            client.send(1, commands.Queue.Delete(queue=f"{unique}-{number:06d}", nowait=True))
        client.send(1, commands.Basic.Qos(prefetch_count=0))
        client.expect(commands.Basic.QosOk, timeout=60)
    assert slowest < ROUND_TRIP_BOUND, f"another client's slowest round trip: {slowest * 1000:.0f} ms"
    mine = sorted(f"{unique}-{number:06d}" for number in range(QUEUES))
    assert page["total_count"] >= QUEUES and page["item_count"] == 100
    assert [queue["name"] for queue in named["items"]] == mine[1234 * 10:1234 * 10 + 10]
    assert named["filtered_count"] == 10
    assert [queue["name"] for queue in matched["items"]] == mine[900:1000]
    assert [queue["name"] for queue in whole if queue["name"].startswith(unique)] == mine
