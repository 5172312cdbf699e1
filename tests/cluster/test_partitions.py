"""Network partitions of a three-node cluster under confirmed publishing (issue 27): whatever link is cut, the side
that may serve does, the side that may not confirms nothing it could lose, and after the heal the cluster serves
with every node back in the in-sync replicas and every confirmed message read back.

etcd and the nodes a, b and c each run in a network namespace of their own on a private bridge
(tests/cluster/netns.py); the publisher, the drain and the etcd observer run in the test's own namespace and reach
them through the bridge ("clients"). lease_ttl 2 s, ack_timeout 1 s, min_insync 2, as in test_failover.py; a
publisher runs throughout (tests/cluster/faults.py). A cut lasts 10 s; the same cases with a 60 s cut run only with
WARREN_LONG_CUTS=1. Each case prints its figures: from the cut to the first confirm from a new leader, the longest
pause between confirms, from the heal to the next confirm, and confirmed / lost / duplicates.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.cluster.faults import OLD_LEADER_LIMIT, STALL_LIMIT, Fault
from tests.cluster.netns import Network
from tests.cluster.nodes import LEASE_TTL, Cluster, Node
from tests.cluster.test_failover import confirms_go_on_without, kill_publishers  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.slow

LONG_CUTS = os.environ.get("WARREN_LONG_CUTS") == "1"
CUT_SECONDS = [10.0, pytest.param(60.0, marks=[
    pytest.mark.skipif(not LONG_CUTS, reason="the 60 s cuts run with WARREN_LONG_CUTS=1 "
                                            "(WARREN_LONG_CUTS=1 pytest tests/cluster/test_partitions.py)"),
    pytest.mark.timeout(400)])]


@pytest.fixture
def cluster(tmp_path, network, etcd):
    with Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd.endpoint,
                 places={name: network.place(name) for name in ("a", "b", "c")}).running() as instance:
        try:
            yield instance
        finally:
            network.heal()  # the nodes stop as they would in service


class Partition(Fault):
    """A fault that cuts links of the private network (tests/cluster/netns.py), then heals them."""

    began = "cut"
    ended = "heal"

    def __init__(self, name: str, cluster: Cluster, network: Network, tmp_path: Path, seconds: float) -> None:
        super().__init__(name, cluster, tmp_path, seconds)
        self.network = network

    def cut(self, *links: tuple[str, str], both_ways: bool = True) -> None:
        """Cut each (one, other) link, both ways or from one to other only."""
        def cut_them() -> None:
            for one, other in links:
                self.network.cut(one, other, both_ways=both_ways)
        self.begin(cut_them)

    def isolate(self, node: Node) -> None:
        self.begin(lambda: self.network.isolate(node.name))

    def heal(self) -> None:
        self.end(self.network.heal)


@pytest.mark.parametrize("seconds", CUT_SECONDS)
def test_a_leader_cut_from_both_followers_gives_way_to_them(cluster, network, tmp_path, seconds):
    """The leader still reaches etcd and the clients, not its followers: the followers' side serves within
    lease_ttl + 3 s; the cut leader confirms nothing ack_timeout + 1 s after the cut."""
    case = Partition("leader cut from both followers", cluster, network, tmp_path, seconds)
    case.start()
    case.cut(*[(case.leader.name, follower.name) for follower in case.followers])
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=OLD_LEADER_LIMIT)


@pytest.mark.parametrize("seconds", CUT_SECONDS)
def test_a_leader_cut_from_etcd_is_replaced(cluster, network, tmp_path, seconds):
    """The leader reaches its followers and the clients, not etcd: another node leads within lease_ttl + 3 s; the
    old one confirms nothing once its lease is lost (lease_ttl after its last renewal, before the cut)."""
    case = Partition("leader cut from etcd", cluster, network, tmp_path, seconds)
    case.start()
    case.cut((case.leader.name, "etcd"))
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=LEASE_TTL)


@pytest.mark.parametrize("seconds", CUT_SECONDS)
def test_a_follower_cut_from_everything_leaves_the_isr_and_returns(cluster, network, tmp_path, seconds):
    """Confirms pause at most ack_timeout + 1 s, the ISR without the follower; after the heal it is back in it."""
    case = Partition("a follower cut from everything", cluster, network, tmp_path, seconds)
    case.start(pinned=True)
    follower = case.followers[0]
    case.isolate(follower)
    case.expect("confirms go on without the follower",
                lambda: confirms_go_on_without(cluster, case.publisher, follower, case.began_at))
    case.hold()
    case.heal()
    case.finish(new_leader=False, stall_limit=STALL_LIMIT)


@pytest.mark.parametrize("seconds", CUT_SECONDS)
def test_a_leader_whose_packets_to_the_followers_are_lost_gives_way(cluster, network, tmp_path, seconds):
    """One direction only: the leader's packets to both followers are dropped, theirs to it pass. The followers hear
    nothing from it: their side serves within lease_ttl + 3 s, and the leader confirms nothing after ack_timeout +
    1 s (it gets no ack of anything it sent after the cut)."""
    case = Partition("leader -> followers dropped, one way", cluster, network, tmp_path, seconds)
    case.start()
    case.cut(*[(case.leader.name, follower.name) for follower in case.followers], both_ways=False)
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=OLD_LEADER_LIMIT)


@pytest.mark.parametrize("seconds", CUT_SECONDS)
@pytest.mark.parametrize("bridge", ["a follower", "the leader"])
def test_a_bridged_partition_keeps_serving(cluster, network, tmp_path, seconds, bridge):
    """Two nodes cut from each other, both reaching the third (the bridge), whichever node leads: with a follower
    as the bridge the leader still reaches one follower and keeps min_insync copies, so confirms pause at most
    ack_timeout + 1 s; with the leader as the bridge it reaches both and confirms go on as before."""
    case = Partition(f"a cut bridged by {bridge}", cluster, network, tmp_path, seconds)
    case.start(pinned=True)
    one, other = case.followers
    case.cut((one.name, other.name) if bridge == "the leader" else (case.leader.name, one.name))
    case.hold()
    case.heal()
    case.finish(new_leader=False, stall_limit=STALL_LIMIT)
