"""Network partitions of a three-node cluster under confirmed publishing (issue 27): whatever link is cut, the side
that may serve does, the side that may not confirms nothing it could lose, and after the heal the cluster serves
with every node back in the in-sync replicas and every confirmed message read back.

etcd and the nodes a, b and c each run in a network namespace of their own on a private bridge
(tests/cluster/netns.py); the publisher, the drain and the etcd observer run in the test's own namespace and reach
them through the bridge ("clients"). lease_ttl 2 s, ack_timeout 1 s, min_insync 2, as in test_failover.py. The
publisher (tests.cluster.publisher, 500 persistent publishes unconfirmed) gives no connection up by itself: each
connection that must end (to a leader that stops leading, forwarded by a follower whose leader changes) is the
cluster's to close, as it is for a client without a confirm deadline of its own. A cut lasts 10 s; the same cases
with a 60 s cut run only with WARREN_LONG_CUTS=1. Each case prints its figures: from the cut to the first confirm
from a new leader, the longest pause between confirms, from the heal to the next confirm, and confirmed / lost /
duplicates.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.cluster.drain import Verification
from tests.cluster.etcd import started_etcd
from tests.cluster.netns import Network, network_or_skip
from tests.cluster.nodes import ACK_TIMEOUT, LEASE_TTL, Cluster, Node, wait_for
from tests.cluster.publisher import GAP_RECORDED, PublisherHandle
from tests.cluster.test_failover import (  # noqa: F401 (kill_publishers: the autouse fixture that ends them)
    check_nothing_lost,
    confirms_go_on_without,
    kill_publishers,
    publisher_on,
)

pytestmark = pytest.mark.slow

LONG_CUTS = os.environ.get("WARREN_LONG_CUTS") == "1"
CUT_SECONDS = [10.0, pytest.param(60.0, marks=[
    pytest.mark.skipif(not LONG_CUTS, reason="the 60 s cuts run with WARREN_LONG_CUTS=1 "
                                            "(WARREN_LONG_CUTS=1 pytest tests/cluster/test_partitions.py)"),
    pytest.mark.timeout(400)])]
SERVICE_LIMIT = LEASE_TTL + 3.0  # seconds from a cut, or a heal, to the first confirm of the side that serves
STALL_LIMIT = ACK_TIMEOUT + 1.0  # longest pause of confirms while a follower is cut off (it leaves the ISR)
OLD_LEADER_LIMIT = ACK_TIMEOUT + 1.0  # a leader cut from its followers confirms nothing this long after the cut
DELIVERY = 0.1  # seconds a confirm may take from the node to the publisher's clock
REJOIN_LIMIT = 10.0  # seconds from the heal until every node is back in the ISR
WARM_UP = 2000  # ids confirmed before the cut
EVERY_NODE_TIMEOUT = 30.0  # seconds the publisher and the ISR get to settle after the heal before the test gives up


@pytest.fixture
def network():
    yield from network_or_skip(["etcd", "a", "b", "c"])


@pytest.fixture
def etcd(network):
    yield from started_etcd(network.place("etcd"))


@pytest.fixture
def cluster(tmp_path, network, etcd):
    instance = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd.endpoint,
                       places={name: network.place(name) for name in ("a", "b", "c")})
    instance.start()
    try:
        instance.ready()
        yield instance
    except BaseException:
        print(instance.logs())
        raise
    finally:
        network.heal()  # the nodes stop as they would in service
        instance.stop()


@dataclass
class Partition:
    """One case: a cut under a running publisher, held, healed, and the figures and failed expectations of it."""

    name: str
    cluster: Cluster
    network: Network
    tmp_path: Path
    cut_seconds: float
    leader: Node = field(init=False)  # the leader when the cut came
    publisher: PublisherHandle = field(init=False)  # started by start()
    cut_at: float = 0.0  # time.time() of the cut
    heal_at: float = 0.0  # time.time() of the heal
    new_leader_seen_at: float | None = None  # time.time() etcd was first seen naming another leader
    rejoined: float | None = None  # seconds from the heal until every node was in the ISR again
    problems: list[str] = field(default_factory=list)  # expectations that failed, said at the end all together

    def start(self, pinned: bool = False) -> None:
        """A publisher on every node (``pinned``: on the leader's address only: a client of a node that is cut off
        loses its connection, which is not what a follower's case measures)."""
        self.leader = self.cluster.ready()
        nodes = [self.leader.address] if pinned else None
        self.publisher = publisher_on(self.cluster, self.tmp_path, nodes=nodes)
        self.publisher.wait_confirmed(WARM_UP, timeout=30)

    @property
    def followers(self) -> list[Node]:
        return [node for node in self.cluster.nodes.values() if node is not self.leader]

    def cut(self, *links: tuple[str, str], both_ways: bool = True) -> None:
        """Cut each (one, other) link (tests/cluster/netns.py), both ways or from one to other only."""
        self.cut_at = time.time()
        for one, other in links:
            self.network.cut(one, other, both_ways=both_ways)

    def isolate(self, node: Node) -> None:
        self.cut_at = time.time()
        self.network.isolate(node.name)

    def expect(self, what: str, check: Callable[[], object]) -> None:
        """Run a check that raises (an assertion, a wait that times out); a failure is noted and the case goes on,
        so that every figure is taken and the cluster healed whatever failed."""
        try:
            check()
        except (AssertionError, TimeoutError) as error:
            self.problems.append(f"{what}: {error}")

    def watch_for_a_new_leader(self) -> None:
        """Note when etcd first names a leader other than the cut one, waiting at most until the cut ends."""
        def another():
            current = self.cluster.leader()
            return current is not None and current is not self.leader
        try:
            wait_for(another, max(0.0, self.cut_at + self.cut_seconds - time.time()), "a new leader")
            self.new_leader_seen_at = time.time()
        except TimeoutError:
            pass

    def hold(self) -> None:
        """Keep the cut for its length (nothing to wait for: a partition lasts as long as it lasts)."""
        time.sleep(max(0.0, self.cut_at + self.cut_seconds - time.time()))

    def heal(self) -> None:
        self.heal_at = time.time()
        self.network.heal()
        self.expect("a confirm after the heal", lambda: self.publisher.wait_for(
            lambda progress: (progress["last_confirm_at"] or 0) > self.heal_at, timeout=EVERY_NODE_TIMEOUT))
        try:
            self.cluster.ready(timeout=EVERY_NODE_TIMEOUT)
            self.rejoined = time.time() - self.heal_at
        except TimeoutError as error:
            self.problems.append(f"every node back in the ISR after the heal: {error}")
        if self.rejoined is not None and self.rejoined > REJOIN_LIMIT:
            self.problems.append(f"every node back in the ISR {self.rejoined:.2f} s after the heal, over "
                                 f"{REJOIN_LIMIT} s")

    def finish(self, *, new_leader: bool, stall_limit: float | None = None, old_leader_limit: float | None = None) \
            -> None:
        """Stop the publisher, read everything back, print the figures and fail with every problem noted.

        ``new_leader``: another node must serve within SERVICE_LIMIT of the cut; ``stall_limit``: confirms may pause
        at most this long while cut; ``old_leader_limit``: the cut leader confirms nothing this long after the cut."""
        (self.tmp_path / "stop-publishing").touch()
        stopped_at = time.time()
        result = self.publisher.wait(timeout=30)
        confirms = Confirms(result, stopped_at)
        figures = {"leader before": self.leader.name, "leader after": getattr(self.cluster.leader(), "name", None)}
        if new_leader:
            served = confirms.first_from_a_new_leader(self.cut_at, self.new_leader_seen_at, self.leader.address)
            figures["cut -> first confirm from a new leader"] = _seconds(served)
            if served is None or served > SERVICE_LIMIT:
                self.problems.append(f"no confirm from a new leader within {SERVICE_LIMIT} s of the cut "
                                     f"(first after {_seconds(served)}; etcd named one after "
                                     f"{_seconds(self.new_leader_seen_at and self.new_leader_seen_at - self.cut_at)})")
        figures["longest gap between confirms"] = _seconds(confirms.longest_gap(self.cut_at))
        while_cut = confirms.longest_gap(self.cut_at, self.heal_at)
        if stall_limit is not None and while_cut > stall_limit:
            self.problems.append(f"confirms paused {while_cut:.2f} s while cut, over {stall_limit} s")
        if old_leader_limit is not None:
            late = confirms.latest_from(self.leader.address, self.cut_at, self.heal_at)
            figures["cut -> last confirm from the cut leader"] = _seconds(late)
            if late is not None and late > old_leader_limit + DELIVERY:
                self.problems.append(f"the cut leader {self.leader.name} confirmed {late:.2f} s after the cut, over "
                                     f"{old_leader_limit} s")
        resumed = confirms.next_after(self.heal_at)
        figures["heal -> next confirm"] = _seconds(resumed)
        if resumed is None or resumed > SERVICE_LIMIT:
            self.problems.append(f"no confirm within {SERVICE_LIMIT} s of the heal (first after {_seconds(resumed)})")
        figures["heal -> every node in the ISR"] = _seconds(self.rejoined)
        figures["connections after the cut"] = confirms.describe_links(self.cut_at, {
            node.address: name for name, node in self.cluster.nodes.items()})
        try:
            report = cast(Verification, check_nothing_lost(self.cluster, result,
                                                           rounds=max(1, result["connection_losses"])))
            figures.update(confirmed=report.confirmed, lost=report.missing_count, duplicates=report.duplicates)
        except AssertionError as error:
            self.problems.append(str(error))
        print(f"partition [{self.name}, {self.cut_seconds:.0f} s cut]: "
              + "; ".join(f"{key} {value}" for key, value in figures.items()))
        if self.problems:
            print(self.cluster.logs())
        assert not self.problems, "\n".join(self.problems)


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} s"


class Confirms:
    """When the publisher's confirms came, and on which connection, from its result (tests.cluster.publisher: gaps
    and connections). The publisher uses one connection at a time: one ends when the next is ready, at the latest."""

    def __init__(self, result: dict[str, Any], stopped_at: float) -> None:
        self.gaps = result["gaps"]  # [time.time() of a confirm, seconds until the next], pauses over GAP_RECORDED
        self.links = result["connections"]  # one per connection, in order: node, opened_at, first/last_confirm_at
        self.last = max((link["last_confirm_at"] or 0.0 for link in self.links), default=0.0)  # the latest confirm
        self.stopped_at = stopped_at  # when the publisher was told to stop

    def next_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the next confirm (0.0: within GAP_RECORDED); None if none came."""
        if self.last <= moment:
            return None
        for start, length in self.gaps:
            if start <= moment < start + length:
                return start + length - moment
        return 0.0

    def latest_before(self, moment: float) -> float:
        """time.time() of the latest confirm before ``moment`` (``moment`` itself where confirms came within
        GAP_RECORDED of it)."""
        if self.last <= moment:
            return self.last
        for start, length in self.gaps:
            if start <= moment < start + length:
                return start
        return moment

    def longest_gap(self, since: float, until: float | None = None) -> float:
        """The longest pause between confirms that overlaps [since, until] (until: the stop), one that lasted until
        the stop included."""
        until = self.stopped_at if until is None else until
        pauses = [length for start, length in self.gaps if start + length > since and start < until]
        if self.stopped_at - self.last > GAP_RECORDED and self.last < until:
            pauses.append(self.stopped_at - max(self.last, since))
        return max(pauses, default=0.0)

    def first_from_a_new_leader(self, cut_at: float, seen_at: float | None, old_leader: str) -> float | None:
        """Seconds from the cut to the first confirm on a connection made after the cut to another node than the
        cut leader, once etcd named a new leader (before that, such a connection is forwarded to the old one)."""
        if seen_at is None:
            return None
        firsts = [link["first_confirm_at"] for link in self.links
                  if link["opened_at"] > cut_at and link["node"] != old_leader
                  and link["first_confirm_at"] is not None and link["first_confirm_at"] >= seen_at]
        return min(firsts) - cut_at if firsts else None

    def describe_links(self, cut_at: float, names: dict[str, str]) -> str:
        """The connections made after the cut: 'to b +2.41 s (first confirm +2.52 s), ...', times from the cut."""
        return ", ".join(
            f"to {names.get(link['node'], link['node'])} +{link['opened_at'] - cut_at:.2f} s (first confirm "
            f"{_seconds(link['first_confirm_at'] and link['first_confirm_at'] - cut_at)})"
            for link in self.links if link["opened_at"] > cut_at) or "none"

    def latest_from(self, old_leader: str, cut_at: float, heal_at: float) -> float | None:
        """Seconds from the cut to the latest confirm the cut leader gave before the heal: on the connection in use
        at the cut (whichever node took it, that leader served it) or on one made to its address during the cut."""
        ends = [link["opened_at"] for link in self.links[1:]] + [self.stopped_at]
        latest = []
        for link, end in zip(self.links, ends):
            served_by_it = link["opened_at"] <= cut_at < end or (cut_at < link["opened_at"] < heal_at
                                                                   and link["node"] == old_leader)
            until = min(end, heal_at)
            if served_by_it and link["first_confirm_at"] is not None and link["first_confirm_at"] < until:
                latest.append(min(link["last_confirm_at"], self.latest_before(until)))
        return max(latest) - cut_at if latest else None


@pytest.mark.parametrize("cut_seconds", CUT_SECONDS)
def test_a_leader_cut_from_both_followers_gives_way_to_them(cluster, network, tmp_path, cut_seconds):
    """The leader still reaches etcd and the clients, not its followers: the followers' side serves within
    lease_ttl + 3 s; the cut leader confirms nothing ack_timeout + 1 s after the cut."""
    case = Partition("leader cut from both followers", cluster, network, tmp_path, cut_seconds)
    case.start()
    case.cut(*[(case.leader.name, follower.name) for follower in case.followers])
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=OLD_LEADER_LIMIT)


@pytest.mark.parametrize("cut_seconds", CUT_SECONDS)
def test_a_leader_cut_from_etcd_is_replaced(cluster, network, tmp_path, cut_seconds):
    """The leader reaches its followers and the clients, not etcd: another node leads within lease_ttl + 3 s; the
    old one confirms nothing once its lease is lost (lease_ttl after its last renewal, before the cut)."""
    case = Partition("leader cut from etcd", cluster, network, tmp_path, cut_seconds)
    case.start()
    case.cut((case.leader.name, "etcd"))
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=LEASE_TTL)


@pytest.mark.parametrize("cut_seconds", CUT_SECONDS)
def test_a_follower_cut_from_everything_leaves_the_isr_and_returns(cluster, network, tmp_path, cut_seconds):
    """Confirms pause at most ack_timeout + 1 s, the ISR without the follower; after the heal it is back in it."""
    case = Partition("a follower cut from everything", cluster, network, tmp_path, cut_seconds)
    case.start(pinned=True)
    follower = case.followers[0]
    case.isolate(follower)
    case.expect("confirms go on without the follower",
                lambda: confirms_go_on_without(cluster, case.publisher, follower, case.cut_at))
    case.hold()
    case.heal()
    case.finish(new_leader=False, stall_limit=STALL_LIMIT)


@pytest.mark.parametrize("cut_seconds", CUT_SECONDS)
def test_a_leader_whose_packets_to_the_followers_are_lost_gives_way(cluster, network, tmp_path, cut_seconds):
    """One direction only: the leader's packets to both followers are dropped, theirs to it pass. The followers hear
    nothing from it: their side serves within lease_ttl + 3 s, and the leader confirms nothing after ack_timeout +
    1 s (it gets no ack of anything it sent after the cut)."""
    case = Partition("leader -> followers dropped, one way", cluster, network, tmp_path, cut_seconds)
    case.start()
    case.cut(*[(case.leader.name, follower.name) for follower in case.followers], both_ways=False)
    case.watch_for_a_new_leader()
    case.hold()
    case.heal()
    case.finish(new_leader=True, old_leader_limit=OLD_LEADER_LIMIT)


@pytest.mark.parametrize("cut_seconds", CUT_SECONDS)
def test_a_bridged_partition_keeps_serving(cluster, network, tmp_path, cut_seconds):
    """a-b and b-c up, a-c cut, whichever node leads: a leader that reaches one follower keeps min_insync copies,
    so confirms pause at most ack_timeout + 1 s (not at all when b leads)."""
    case = Partition("a-c cut, b bridging", cluster, network, tmp_path, cut_seconds)
    case.start(pinned=True)
    case.cut(("a", "c"))
    case.hold()
    case.heal()
    case.finish(new_leader=False, stall_limit=STALL_LIMIT)
