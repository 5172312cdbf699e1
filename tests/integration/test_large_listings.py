"""Listing 100,000 queues through the management API (a page, a page of those a name or a regex filter keeps, the
whole listing, with one column or all: also as a HEAD, and to a client that leaves after its first megabyte) holds
the broker's other clients a few milliseconds at a time: the queues are sorted and filtered on a thread, only the
page's own are shown (a page held them 125 to 140 ms while every queue's entry was made ready first), and a whole
listing is written as it is encoded (its 118 MB, joined first, held them 95 to 113 ms; the entries of a HEAD's or
a gone client's listing, freed at once, 180 to 220 ms)."""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest
from pamqp import commands, frame

from tests.integration.management import quote, request
from tests.integration.rawclient import RawClient
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest

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
        try:
            page = request(broker, "GET", "/api/queues/%2F?page=2&page_size=100").body
            named = request(broker, "GET", f"/api/queues/%2F?page=1&page_size=10&name={unique}-01234").body
            matched = request(broker, "GET", f"/api/queues/%2F?page=1&page_size=500&use_regex=true&name="
                                             f"{quote(f'^{unique}-0009..$')}").body
            # (about 5 MB, decoded after the timing: decoding it held the thread that times the round trips, which
            # shares this process's interpreter lock, 35 to 51 ms)
            whole = read(broker, "GET", "/api/queues/%2F?columns=name")
            begun = read(broker, "GET", "/api/queues/%2F", at_most=1 << 20)  # (and the connection closed)
            head = read(broker, "HEAD", "/api/queues/%2F")
            every_column = read(broker, "GET", "/api/queues/%2F")  # (about 120 MB)
        finally:
            times = round_trips.stop()
        for number in range(QUEUES):
            client.send(1, commands.Queue.Delete(queue=f"{unique}-{number:06d}", nowait=True))
        client.send(1, commands.Basic.Qos(prefetch_count=0))
        client.expect(commands.Basic.QosOk, timeout=60)
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
    mine = sorted(f"{unique}-{number:06d}" for number in range(QUEUES))
    assert page["total_count"] >= QUEUES and page["item_count"] == 100
    assert [queue["name"] for queue in named["items"]] == mine[1234 * 10:1234 * 10 + 10]
    assert named["filtered_count"] == 10
    assert [queue["name"] for queue in matched["items"]] == mine[900:1000]
    assert [queue["name"] for queue in json.loads(whole) if queue["name"].startswith(unique)] == mine
    listed = [queue for queue in json.loads(every_column) if queue["name"].startswith(unique)]
    assert [queue["name"] for queue in listed] == mine
    assert all(queue["messages"] == 0 and queue["vhost"] == "/" for queue in listed)
    assert head == b"" and begun.startswith(b'[{"')


def read(broker, method: str, path: str, at_most: int | None = None) -> bytes:
    """The body of a management API reply as it came (at_most bytes of it, when given), undecoded."""
    credentials = base64.b64encode(b"guest:guest").decode()
    call = urllib.request.Request(broker.management_url + path, method=method,
                                  headers={"authorization": f"Basic {credentials}"})
    with urllib.request.urlopen(call, timeout=60) as response:
        assert response.status == 200
        return response.read(at_most)
