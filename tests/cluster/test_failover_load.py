"""kill -9 of the leader under load (issue 27): with a consumer reading the queue while the publisher fills it,
behind a deep queue, and behind a million queued messages; every confirmed id is consumed or read back after.

As in test_failover.py: one etcd, three nodes on 127.0.0.1, lease_ttl 2 s, ack_timeout 1 s, min_insync 2, a
publisher process keeping 500 persistent 16 B publishes unconfirmed, a failover measured from the kill to the first
confirm from the new leader. Each test prints its figures: failover p50 / max / all, confirmed, consumed, drained
and duplicates, and for each kill the queue's depth just before it, when the new leader began leading and its
recovery of its data dir (from its log: "recovered N messages, M records, B bytes in X s", "with the hot standby"
when it took its standby, storage.standby).

The million-message case publishes a million messages and reads them back with the consumer: about 45 s on a
2-core machine. It runs by itself (`alone`): its failover is allowed 3 s however deep the queue (the new leader
takes its hot standby rather than read a million messages back), and other tests' load would decide it.
"""

from __future__ import annotations

import os
import re
import statistics
import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tests.cluster.consumer import ConsumerHandle, delivered_ids, start_consumer
from tests.cluster.drain import drain, verify, with_consumed
from tests.cluster.nodes import Cluster, Node
from tests.cluster.test_failover import (  # noqa: F401 (cluster, kill_publishers: fixtures)
    FAILOVER_LIMIT,
    FAILOVER_MEDIAN,
    LOG_TIME,
    WINDOW,
    check_nothing_lost,
    cluster,
    first_confirm_after,
    kill_publishers,
    leaderships,
    leadership_story,
    publisher_on,
)
from tests.conftest import logged_at
from tests.integration.management import request
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ROUNDS = 5
PER_ROUND = 2000  # ids confirmed in each round before its kill (as in test_failover.py)
DEEP_QUEUE = 200_000  # confirmed ids queued, none consumed, at least, before the last kill of the deep-queue test
BACKLOG = int(os.environ.get("WARREN_FAILOVER_BACKLOG", 1_000_000))  # messages queued before the backlog test's kills
BACKLOG_ROUNDS = int(os.environ.get("WARREN_FAILOVER_ROUNDS", 1))  # its kills
BACKLOG_FAILOVER_LIMIT = 3.0  # seconds: what a failover behind any backlog may take
QUEUE = "orders"  # publisher_on's queue

LEADING = re.compile(LOG_TIME + r"leading the cluster \(epoch (\d+)\)", re.MULTILINE)
RECOVERED = re.compile(LOG_TIME + r"recovered (\d+) messages, (\d+) records, (\d+) bytes in ([\d.]+) s( with the hot "
                       r"standby)?", re.MULTILINE)
STANDBY_READ = re.compile(r"the standby of .* has read its data dir")


@dataclass
class Kill:
    """One kill -9 of the leader, and the leadership that followed it."""

    at: float  # time.time() of the kill
    depth: int  # messages in the queue just before it
    killed: str  # the node killed
    restarted_at: int  # the killed node's log length when it was started again
    leader: str  # the node that led next
    epoch: int  # its epoch
    leading_after: float  # seconds from the kill to its "leading the cluster" line (the old lease lapsed, it won)
    recovered_after: float  # seconds from the kill to the end of its store's recovery
    recovery: float  # seconds its store's recovery took, as it logged them
    messages: int  # messages it recovered
    records: int  # records it read
    standby: bool  # its recovery took its hot standby rather than read the data dir

    def describe(self, failover: float) -> str:
        return (f"depth {self.depth:,}: failover {failover:.2f} s = {self.leader} leading after "
                f"{self.leading_after:.2f} s, recovered {self.messages:,} messages ({self.records:,} records) in "
                f"{self.recovery:.2f} s{' with its standby' if self.standby else ''}, done "
                f"{self.recovered_after:.2f} s after the kill, first confirm "
                f"{failover - self.recovered_after:.2f} s later")


STARTED: list[ConsumerHandle] = []  # the consumers of the running test, killed at its end whatever happened


@pytest.fixture(autouse=True)
def kill_consumers():
    yield
    while STARTED:
        STARTED.pop().kill()


def consumer_on(cluster: Cluster, tmp_path) -> ConsumerHandle:
    """A consumer of the publisher's queue trying the nodes in turn, until its stop()."""
    consumer = start_consumer(cluster.addresses, QUEUE, tmp_path / f"con-{uuid.uuid4().hex[:6]}")
    STARTED.append(consumer)
    return consumer


def queue_depth(leader: Node) -> int:
    """Messages in the queue, ready or unacked, as the leader's management API counts them."""
    reply = request(SimpleNamespace(management_url=f"http://{leader.host}:{leader.management_port}"), "GET",
                    f"/api/queues/%2F/{QUEUE}")
    assert reply.status == 200, reply
    return reply.body["messages"]


def leadership_after(node: Node, killed: Node, killed_at: float, restarted_at: int, depth: int) -> Kill:
    """The kill of ``killed`` at ``killed_at`` with the queue ``depth`` deep (its log ``restarted_at`` long when it
    started again), and the latest leadership in ``node``'s log once its store's recovery is logged."""
    def recovered():
        log = node.log()
        leading = [*LEADING.finditer(log)]
        found = RECOVERED.search(log, leading[-1].end()) if leading else None
        return (leading[-1], found) if found else None
    leading, found = wait_for(recovered, 30, f"{node.name}'s recovery in its log")
    return Kill(killed_at, depth, killed.name, restarted_at, node.name, int(leading[2]),
                logged_at(leading[1]) - killed_at, logged_at(found[1]) - killed_at, float(found[5]), int(found[2]),
                int(found[3]), bool(found[6]))


def kill_the_leader(cluster: Cluster, publisher, consumer=None) -> Kill:
    """kill -9 of the leader; returns once the publisher has confirms from the new one (and the consumer, if any,
    has deliveries again) and the killed node, restarted, is back in the ISR."""
    leader = cluster.leader()
    assert leader is not None
    depth = queue_depth(leader)
    losses = publisher.progress()["losses"]
    reconnections = consumer.progress()["reconnections"] if consumer else 0
    killed_at = time.time()
    leader.kill()
    publisher.wait_for(lambda progress: progress["losses"] > losses, timeout=10)
    try:
        publisher.wait_confirmed(publisher.confirmed + WINDOW + 1, timeout=FAILOVER_LIMIT + 5)
    except TimeoutError as error:  # (why no node served: what their logs say of their leaderships)
        raise TimeoutError(f"{error}\n--- the nodes' leaderships\n{leadership_story(cluster)}") from None
    if consumer:
        progress = consumer.wait_for(lambda progress: progress["reconnections"] > reconnections, timeout=10)
        consumer.wait_delivered(progress["delivered"] + 1, timeout=10)
    restarted_at = len(leader.log())
    leader.start()
    new_leader = cluster.ready(timeout=30)
    assert new_leader is not leader
    return leadership_after(new_leader, leader, killed_at, restarted_at, depth)


def read_back(cluster: Cluster, result: dict, consumer, duplicates_allowed: int | None = None) -> dict:
    """Stop the consumer, drain what it left and check that every id the publisher saw confirmed (its ``result``)
    was consumed or drained, with at most ``duplicates_allowed`` duplicates when given; the consumer's result."""
    consumed = consumer.stop(timeout=30)
    drained = drain(cluster.addresses, QUEUE, timeout=60)
    verification = verify(result["confirmed"], with_consumed(drained, delivered_ids(consumed)))
    print(f"{verification.summary}; consumed {consumed['delivered']:,} ({consumed['distinct']:,} ids, "
          f"{consumed['reconnections']} reconnections), drained {drained['read']:,}")
    assert verification.missing_count == 0, verification.summary
    if duplicates_allowed is not None:
        assert verification.duplicates <= duplicates_allowed, verification.summary
    return consumed


def report(name: str, kills: list[Kill], result: dict) -> list[float]:
    """Print each failover with its parts; the failovers, in seconds."""
    failovers = [first_confirm_after(result, kill.at) for kill in kills]
    print(f"{name}: failover p50 {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s, "
          f"all {[round(failover, 2) for failover in failovers]}")
    for number, (kill, failover) in enumerate(zip(kills, failovers), 1):
        print(f"  kill {number}, {kill.describe(failover)}")
    return failovers


@pytest.mark.timeout(300)
def test_kill_9_of_the_leader_with_a_consumer_loses_nothing(cluster, tmp_path):
    """Five rounds of kill -9 of the leader while a publisher and a consumer run through any node: every confirmed
    id is consumed or drained, every failover within 5 s and their median within 3 s, one new epoch each, the
    killed node restarted and back in the ISR before the next round."""
    consumer = consumer_on(cluster, tmp_path)
    publisher = publisher_on(cluster, tmp_path)
    kills = []
    for _ in range(ROUNDS):
        publisher.wait_confirmed(publisher.confirmed + PER_ROUND, timeout=30)
        consumer.wait_delivered(consumer.delivered + 1, timeout=10)
        kills.append(kill_the_leader(cluster, publisher, consumer))
    (tmp_path / "stop-publishing").touch()
    result = publisher.wait(timeout=30)
    failovers = report("kill -9 of the leader with a consumer", kills, result)
    consumed = read_back(cluster, result, consumer)
    assert consumed["reconnections"] >= ROUNDS
    assert max(failovers) <= FAILOVER_LIMIT
    assert statistics.median(failovers) <= FAILOVER_MEDIAN
    assert leaderships(cluster) == 1 + ROUNDS, (f"a failover took more than one new epoch:\n"
                                                f"{leadership_story(cluster)}")


@pytest.mark.timeout(300)
def test_kill_9_of_the_leader_behind_a_deep_queue_loses_nothing(cluster, tmp_path):
    """Five rounds of kill -9 of the leader, nothing consumed, the last one behind at least 200,000 queued persistent
    messages (the publisher goes on while each killed node starts again: 320,000 to 575,000 here): every confirmed
    id is read back, every failover within 5 s, one new epoch each."""
    publisher = publisher_on(cluster, tmp_path)
    kills = []
    for number in range(1, ROUNDS + 1):
        publisher.wait_confirmed(DEEP_QUEUE if number == ROUNDS else publisher.confirmed + PER_ROUND, timeout=120)
        kills.append(kill_the_leader(cluster, publisher))
    (tmp_path / "stop-publishing").touch()
    result = publisher.wait(timeout=30)
    failovers = report("kill -9 of the leader behind a deep queue", kills, result)
    print(f"queue depth at the last kill: {kills[-1].depth:,}")
    check_nothing_lost(cluster, result, rounds=ROUNDS)
    assert max(failovers) <= FAILOVER_LIMIT
    assert leaderships(cluster) == 1 + ROUNDS, (f"a failover took more than one new epoch:\n"
                                                f"{leadership_story(cluster)}")


@pytest.mark.timeout(300 + BACKLOG // 5_000 * BACKLOG_ROUNDS)
@pytest.mark.alone
def test_kill_9_of_the_leader_behind_a_million_queued_messages_loses_nothing(cluster, tmp_path):
    """1,000,000 persistent 16 B messages queued (nothing consumed before the kill, so their records stay
    uncompacted), then kill -9 of the leader: the new leader starts from its hot standby, so the failover takes at
    most 3 s however deep the queue, and every confirmed id is consumed afterwards. On demand, a deeper backlog and
    more rounds: WARREN_FAILOVER_BACKLOG=3000000 WARREN_FAILOVER_ROUNDS=3 (each round waits until the node killed
    before it is back in the ISR and its standby has read its data dir)."""
    publisher = publisher_on(cluster, tmp_path)
    started = time.monotonic()
    publisher.wait_confirmed(BACKLOG, timeout=max(180, BACKLOG // 10_000))
    print(f"{BACKLOG:,} confirmed in {time.monotonic() - started:.1f} s")
    kills = []
    for _ in range(BACKLOG_ROUNDS):
        if kills:  # the node killed last has read its copy: it may lead next
            killed = cluster.nodes[kills[-1].killed]
            wait_for(lambda: STANDBY_READ.search(killed.log(), kills[-1].restarted_at), 120,
                     f"{killed.name}'s standby reading its data dir")
        kills.append(kill_the_leader(cluster, publisher))
    (tmp_path / "stop-publishing").touch()
    result = publisher.wait(timeout=30)
    failovers = report(f"kill -9 of the leader behind {BACKLOG:,} queued messages", kills, result)
    started = time.monotonic()
    consumer = consumer_on(cluster, tmp_path)
    consumer.wait_delivered(queue_depth(cluster.ready()), timeout=120 + BACKLOG // 10_000)
    consumed = read_back(cluster, result, consumer, duplicates_allowed=WINDOW * BACKLOG_ROUNDS)
    print(f"read back in {time.monotonic() - started:.1f} s ({consumed['delivered']:,} consumed)")
    assert all(kill.standby for kill in kills), "a new leader read its data dir rather than take its standby"
    assert max(failovers) <= BACKLOG_FAILOVER_LIMIT
