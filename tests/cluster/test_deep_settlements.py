"""Settling millions of messages on a cluster's leader (issue 45): a consumer draining a deep queue (prefetch
5,000, a multiple ack every 1,000), one multiple ack of every delivery of a deep queue, the same within a transaction
(rolled back, then again and committed), a multiple nack of every delivery to a dead-letter queue, the purge of a
deep queue and its deletion (a FIFO queue, which keeps most of its messages on disk, a priority queue, which keeps
them all in memory, and a queue whose messages have a TTL) and a policy's lower length limit hold the leader's other
clients under 50 ms at a time and cost no leadership.

On demand, as they take minutes: WARREN_SETTLE_BACKLOG=4000000 (the messages queued, persistent, 16 B) runs them.
Each prints the other client's round trips (p50, p99, max, how many over the bound) and the time each phase took.
"""

from __future__ import annotations

import os
import struct
import time

import pytest
from pamqp import commands

from tests.cluster.nodes import Node
from tests.cluster.test_failover import cluster, leaderships, leadership_story  # noqa: F401 (cluster: a fixture)
from tests.cluster.test_failover_load import QUEUE, queue_depth
from tests.integration.rawclient import RawClient, method_frame_payload, raw_frame
from tests.integration.test_large_settlements import published
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest
from tests.waiting import wait_for

BACKLOG = int(os.environ.get("WARREN_SETTLE_BACKLOG", 0))
DRAIN_PREFETCH = 5_000
ACK_EVERY = 1_000  # deliveries the draining consumer acks at once (multiple)
FILL_RATE = 20_000  # messages a second the fill reaches at least: its timeout
AFTERMATH = 1.0  # seconds the other client goes on after a purge or a deletion (what they let go after their reply)

# (the fill, the deliveries and the operation: 4 million took up to 141 s on this machine, past pytest's 120 s)
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(120 + BACKLOG // 5_000),
              pytest.mark.skipif(not BACKLOG, reason="on demand (minutes): WARREN_SETTLE_BACKLOG=4000000")]

FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size
DELIVER = struct.pack(">HH", 60, 60)  # basic.deliver's class and method ids
METHOD_FRAME = 1


def serving(cluster) -> Node:
    """The leader, once its broker opens connections: etcd names it a moment before, and a client opening then is
    refused with RabbitMQ's 541 for a vhost that is down (to connect again)."""
    leader = cluster.ready()

    def opens() -> bool:
        with RawClient.connect(leader, timeout=30) as client:
            try:
                client.handshake()
            except AssertionError:  # (the 541)
                return False
        return True

    wait_for(opens, 30, "the leader opening an AMQP connection")
    return leader


def fill(leader: Node, count: int, arguments: dict | None = None) -> None:
    """count persistent 16 B messages in the queue (declared with ``arguments``), all of them on the leader's disk
    and its followers'."""
    with RawClient.connect(leader, timeout=30) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=QUEUE, durable=True, arguments=arguments))
        client.expect(commands.Queue.DeclareOk)
        started = time.monotonic()
        published(client, QUEUE, count)
        wait_for(lambda: queue_depth(leader) == count, 60 + count / FILL_RATE, f"{count:,} messages queued")
        print(f"{count:,} queued in {time.monotonic() - started:.1f} s")


class Consumer:
    """A consumer on the leader that counts its deliveries from the bytes it reads (a delivery's tag is its number
    on the channel) rather than decode millions of frames."""

    def __init__(self, leader: Node, prefetch: int) -> None:
        self.client = RawClient.connect(leader, timeout=60)
        self.client.handshake()
        self.client.open_channel(1)
        self.client.send(1, commands.Basic.Qos(prefetch_count=prefetch))
        self.client.expect(commands.Basic.QosOk)
        self.client.sock.settimeout(60)
        self.delivered = 0
        self.answers = 0  # method frames other than deliveries read (consume-ok, a reply)
        self.pending = b""  # bytes read that end in the middle of a frame
        self.answered(commands.Basic.Consume(queue=QUEUE, consumer_tag="settle"))

    def read(self) -> int:
        """Read what has come, counting its deliveries; their count so far."""
        data = self.pending + self.client.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the leader closed the consumer's connection")
        offset = 0
        while offset + 7 <= len(data):
            kind, _, size = FRAME_HEADER.unpack_from(data, offset)
            end = offset + 7 + size + 1
            if end > len(data):
                break
            if kind == METHOD_FRAME and data[offset + 7:offset + 11] == DELIVER:
                self.delivered += 1
            elif kind == METHOD_FRAME:
                self.answers += 1
            offset = end
        self.pending = data[offset:]
        return self.delivered

    def ack(self, tag: int, multiple: bool = True) -> None:
        self.send(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    def send(self, method: object) -> None:
        self.client.send_raw(raw_frame(METHOD_FRAME, 1, method_frame_payload(method)))

    def answered(self, method: object) -> None:
        """Send a method that the broker answers, and read until its answer (a method frame that is not a
        delivery)."""
        answers = self.answers
        self.send(method)
        while self.answers == answers:
            self.read()

    def close(self) -> None:
        self.client.close()


def settled(leader: Node, timeout: float) -> None:
    wait_for(lambda: queue_depth(leader) == 0, timeout, "the queue empty, every delivery acked")


def judged(cluster, done: str, times: list[tuple[float, float]]) -> None:
    """What was done, with the other client's round trips meanwhile: the leader kept its leadership, and no round
    trip took longer than the bound."""
    print(f"{done}; {describe(times)}; leaderships {leaderships(cluster)}")
    assert leaderships(cluster) == 1, f"the leader lost its leadership:\n{leadership_story(cluster)}"
    assert slowest(times) <= ROUND_TRIP_BOUND, describe(times, cluster.logs())


def test_a_consumer_draining_millions_holds_no_other_client_and_costs_no_leadership(cluster):  # noqa: F811
    leader = serving(cluster)
    fill(leader, BACKLOG)
    probe = RoundTrips(leader)
    started = time.monotonic()
    consumer = Consumer(leader, DRAIN_PREFETCH)
    acked = 0
    while acked < BACKLOG:
        delivered = consumer.read()
        if delivered - acked >= ACK_EVERY or delivered == BACKLOG:
            consumer.ack(delivered)
            acked = delivered
    settled(leader, 60)
    took = time.monotonic() - started
    times = probe.stop()
    consumer.close()
    judged(cluster, f"drained {BACKLOG:,} in {took:.1f} s", times)


def test_a_multiple_ack_of_millions_holds_no_other_client_and_costs_no_leadership(cluster):  # noqa: F811
    leader = serving(cluster)
    fill(leader, BACKLOG)
    probe = RoundTrips(leader)
    started = time.monotonic()
    consumer = Consumer(leader, 0)
    while consumer.read() < BACKLOG:
        pass
    delivered_at = time.monotonic()
    consumer.ack(BACKLOG)
    settled(leader, 120)
    acked_at = time.monotonic()
    times = probe.stop()
    consumer.close()
    judged(cluster, f"delivered {BACKLOG:,} in {delivered_at - started:.1f} s, acked in "
                    f"{acked_at - delivered_at:.1f} s", times)


def test_a_transactions_multiple_ack_of_millions_its_rollback_and_its_commit_hold_no_other_client(
        cluster):  # noqa: F811
    leader = serving(cluster)
    fill(leader, BACKLOG)
    probe = RoundTrips(leader)
    consumer = Consumer(leader, 0)
    consumer.answered(commands.Tx.Select())
    while consumer.read() < BACKLOG:
        pass
    phases = []
    for last in (commands.Tx.Rollback(), commands.Tx.Commit()):
        started = time.monotonic()
        consumer.ack(BACKLOG)
        consumer.answered(last)
        phases.append(f"ack and {type(last).__name__.lower()} in {time.monotonic() - started:.1f} s")
    settled(leader, 120)
    times = probe.stop()
    consumer.close()
    judged(cluster, ", ".join(phases), times)


def test_a_multiple_nack_of_millions_to_a_dead_letter_queue_holds_no_other_client(cluster):  # noqa: F811
    leader = serving(cluster)
    dead = f"{QUEUE}-dead"
    with RawClient.connect(leader, timeout=30) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=dead, durable=True))
        client.expect(commands.Queue.DeclareOk)
    fill(leader, BACKLOG, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    probe = RoundTrips(leader)
    consumer = Consumer(leader, 0)
    while consumer.read() < BACKLOG:
        pass
    started = time.monotonic()
    consumer.send(commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=False))
    settled(leader, 600)
    took = time.monotonic() - started
    times = probe.stop()
    consumer.close()
    dead_lettered = leader.api("GET", f"/api/queues/%2F/{dead}")[1]["messages"]
    assert dead_lettered == BACKLOG
    judged(cluster, f"dead-lettered {dead_lettered:,} in {took:.1f} s", times)


def test_a_lower_length_limit_on_millions_holds_no_other_client(cluster):  # noqa: F811
    leader = serving(cluster)
    fill(leader, BACKLOG)
    probe = RoundTrips(leader)
    started = time.monotonic()
    status, _ = leader.api("PUT", "/api/policies/%2F/lower", {"pattern": f"^{QUEUE}$", "apply-to": "queues",
                                                               "definition": {"max-length": 1000}})
    assert status in (201, 204)
    wait_for(lambda: queue_depth(leader) == 1000, 300, "the queue down to its new limit")
    took = time.monotonic() - started
    time.sleep(AFTERMATH)
    times = probe.stop()
    judged(cluster, f"trimmed to 1,000 in {took:.1f} s", times)


KINDS = pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 10}, {"x-message-ttl": 3_600_000}],
                                ids=["fifo", "priority", "ttl"])


def one_call(cluster, arguments: dict, method: object, reply: type) -> object:
    """Fill the queue (declared with ``arguments``), then send ``method`` on a connection of its own while the other
    client makes round trips, until AFTERMATH after its reply (what the call lets go after it); the reply, once
    judged (the leader kept its leadership, no round trip took longer than the bound)."""
    leader = serving(cluster)
    fill(leader, BACKLOG, arguments)
    probe = RoundTrips(leader)
    with RawClient.connect(leader, timeout=120) as client:
        client.handshake()
        client.open_channel(1)
        started = time.monotonic()
        client.send(1, method)
        answer = client.expect(reply, timeout=120)
        took = time.monotonic() - started
    time.sleep(AFTERMATH)
    times = probe.stop()
    judged(cluster, f"{type(method).__name__.lower()} of {answer.message_count:,} in {took:.2f} s", times)
    return answer


@KINDS
def test_a_purge_of_millions_holds_no_other_client_and_costs_no_leadership(cluster, arguments):  # noqa: F811
    answer = one_call(cluster, arguments, commands.Queue.Purge(queue=QUEUE), commands.Queue.PurgeOk)
    assert answer.message_count == BACKLOG
    assert queue_depth(cluster.ready()) == 0


@KINDS
def test_the_deletion_of_a_queue_of_millions_holds_no_other_client_and_costs_no_leadership(
        cluster, arguments):  # noqa: F811
    answer = one_call(cluster, arguments, commands.Queue.Delete(queue=QUEUE), commands.Queue.DeleteOk)
    assert answer.message_count == BACKLOG
