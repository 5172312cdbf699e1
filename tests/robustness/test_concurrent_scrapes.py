"""Forty Prometheus scrapes of a broker with 10,000 queues, all at once, do not hold up other clients: AMQP
round trips (publish, then basic.get of that message) on another connection stay under 50 ms at the 99th
percentile while they run. Each scrape used to render the whole exposition on its own, forty at a time; the
broker's p99 round trip went to about 400 ms."""

from __future__ import annotations

import http.client
import multiprocessing
import statistics
import threading
import time

import pytest

from tests.integration.helpers import connect

pytestmark = pytest.mark.alone  # it times AMQP round trips during concurrent scrapes

QUEUES = 10_000
SCRAPES = 40


def scrape_all_at_once(host: str, port: int, path: str, sent, sizes) -> None:
    """Send SCRAPES requests for path at once, set sent, then read every answer (run in a process of its own, so
    that reading 40 large bodies takes no time from the client whose round trips are measured)."""
    requests_sent = threading.Barrier(SCRAPES, action=sent.set)

    def scrape(index: int) -> None:
        connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.request("GET", path)
        requests_sent.wait()
        response = connection.getresponse()
        body = response.read()
        sizes[index] = body.count(b"rabbitmq_queue_messages_ready{") if response.status == 200 else -1
        connection.close()

    threads = [threading.Thread(target=scrape, args=(index,)) for index in range(SCRAPES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def round_trips_while(channel, queue: str, busy) -> list[float]:
    """Seconds of each publish-then-get round trip on channel, for as long as busy() holds."""
    times = []
    while busy():
        started = time.perf_counter()
        channel.basic_publish("", queue, b"ping")
        method, _, _ = channel.basic_get(queue, auto_ack=True)
        times.append(time.perf_counter() - started)
        assert method is not None
    return times


@pytest.mark.slow
def test_forty_concurrent_per_object_scrapes_of_ten_thousand_queues_leave_amqp_round_trips_quick(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        channel = conn.channel()
        for index in range(QUEUES):
            channel.queue_declare(f"scraped-{index}")
        context = multiprocessing.get_context("spawn")
        sent, sizes = context.Event(), context.Array("i", SCRAPES)
        scrapers = context.Process(target=scrape_all_at_once,
                                   args=(broker.host, broker.prometheus_port, "/metrics/per-object", sent, sizes))
        scrapers.start()
        try:
            assert sent.wait(30), "the scrapes were never all sent"
            times = round_trips_while(channel, "scraped-0", scrapers.is_alive)
        finally:
            scrapers.join(60)
            scrapers.kill()
    assert list(sizes) == [QUEUES] * SCRAPES  # every scrape got every queue's series
    assert len(times) >= 20, f"only {len(times)} round trips while the scrapes ran"
    p99 = statistics.quantiles(times, n=100)[98]
    assert p99 < 0.05, f"p99 round trip {p99 * 1000:.1f} ms over {len(times)} while {SCRAPES} scrapes ran"
