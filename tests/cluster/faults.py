"""One fault of a three-node cluster under confirmed publishing, from its start to its end and the reading back, with
the figures the fault tests print and check (test_partitions.py: a cut link; test_disk_faults.py: a disk).

    case = Fault("leader cut from etcd", cluster, tmp_path, seconds=10)
    case.start()                       # a publisher (tests.cluster.publisher), 2000 ids confirmed
    case.begin(lambda: ...)            # the fault; its time is the origin of the figures
    case.watch_for_a_new_leader()      # when etcd names another leader, if it does within the fault
    case.hold()                        # the fault lasts its length
    case.end(lambda: ...)              # then a confirm, and every node back in the ISR, are waited for
    case.finish(new_leader=True, old_leader_limit=...)  # stop, read back, print figures, fail with every problem

Every expectation that fails is noted and the case goes on, so that the fault always ends, every figure is taken and
the test fails once, naming them all. The publisher (RATE publishes a second, at most 500 unconfirmed) gives no
connection up by itself (no stall timeout): every connection that has to end (to a leader that stops leading,
forwarded by a follower whose leader changes) is the cluster's to close, as it is for a client without a confirm
deadline of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.cluster.drain import DRAIN_RATE, drain, verify
from tests.cluster.nodes import ACK_TIMEOUT, LEASE_TTL, Cluster, Node
from tests.cluster.publisher import GAP_RECORDED, PublisherHandle
from tests.cluster.test_failover import WINDOW, leadership_story, publisher_on
from tests.waiting import wait_for

SERVICE_LIMIT = LEASE_TTL + 3.0  # seconds from a fault, or its end, to the first confirm of the nodes that may serve
STALL_LIMIT = ACK_TIMEOUT + 1.0  # longest pause of confirms while a follower is lost (it leaves the ISR)
OLD_LEADER_LIMIT = ACK_TIMEOUT + 1.0  # a leader cut from its followers confirms nothing this long after the fault
DELIVERY = 0.1  # seconds a confirm may take from the node to the publisher's clock
REJOIN_LIMIT = 10.0  # seconds from the fault's end until every node is back in the ISR
WARM_UP = 2000  # ids confirmed before the fault
RATE = 5000  # publishes a second: a steady load whose every message the drain reads back in seconds, even after a
# minute's fault (a queue of millions takes the drain minutes, and its one ack of them all stalls the leader's loop)
SETTLE_TIMEOUT = 30.0  # seconds the publisher and the ISR get after the fault's end before the test gives up


@dataclass
class Fault:
    """One fault under a running publisher: its moments, its figures, and the expectations that failed."""

    name: str
    cluster: Cluster
    tmp_path: Path
    seconds: float  # how long the fault lasts
    began: ClassVar[str] = "fault"  # the words the figures use for the fault's start and end
    ended: ClassVar[str] = "end"
    leader: Node = field(init=False)  # the leader when the fault began
    publisher: PublisherHandle = field(init=False)  # started by start()
    began_at: float = 0.0  # time.time() of the fault
    ended_at: float = 0.0  # time.time() of its end
    new_leader_seen_at: float | None = None  # time.time() etcd was first seen naming another leader
    rejoined: float | None = None  # seconds from the end until every node was in the ISR again
    problems: list[str] = field(default_factory=list)  # expectations that failed, said at the end all together

    def start(self, pinned: bool = False) -> None:
        """A publisher on every node (``pinned``: on the leader's address only: a client of a node that is lost
        loses its connection, which is not what a follower's case measures)."""
        self.leader = self.cluster.ready()
        nodes = [self.leader.address] if pinned else None
        self.publisher = publisher_on(self.cluster, self.tmp_path, nodes=nodes, rate=RATE)
        self.publisher.wait_confirmed(WARM_UP, timeout=30)

    @property
    def followers(self) -> list[Node]:
        return [node for node in self.cluster.nodes.values() if node is not self.leader]

    def begin(self, fault: Callable[[], object]) -> None:
        self.began_at = time.time()
        fault()

    def expect(self, what: str, check: Callable[[], object]) -> None:
        """Run a check that raises (an assertion, a wait that times out); a failure is noted and the case goes on."""
        try:
            check()
        except (AssertionError, TimeoutError) as error:
            self.problems.append(f"{what}: {error}")

    def watch_for_a_new_leader(self) -> None:
        """Note when etcd first names a leader other than the one of the fault, waiting at most until it ends."""
        def another():
            current = self.cluster.leader()
            return current is not None and current is not self.leader
        try:
            wait_for(another, max(0.0, self.began_at + self.seconds - time.time()), "a new leader")
            self.new_leader_seen_at = time.time()
        except AssertionError:
            pass

    def hold(self) -> None:
        """Keep the fault for its length (nothing to wait for: it lasts as long as it lasts)."""
        time.sleep(max(0.0, self.began_at + self.seconds - time.time()))

    def end(self, repair: Callable[[], object]) -> None:
        """End the fault, then wait for a confirm and for every running node in the ISR."""
        self.ended_at = time.time()
        repair()
        self.expect(f"a confirm after the {self.ended}", lambda: self.publisher.wait_for(
            lambda progress: (progress["last_confirm_at"] or 0) > self.ended_at, timeout=SETTLE_TIMEOUT))
        try:
            self.cluster.ready(timeout=SETTLE_TIMEOUT)
            self.rejoined = time.time() - self.ended_at
        except AssertionError as error:
            self.problems.append(f"every node back in the ISR after the {self.ended}: {error}")
        if self.rejoined is not None and self.rejoined > REJOIN_LIMIT:
            self.problems.append(f"every node back in the ISR {self.rejoined:.2f} s after the {self.ended}, over "
                                 f"{REJOIN_LIMIT} s")

    def finish(self, *, new_leader: bool, stall_limit: float | None = None, old_leader_limit: float | None = None) \
            -> None:
        """Stop the publisher, read everything back, print the figures and fail with every problem noted.

        ``new_leader``: another node must serve within SERVICE_LIMIT of the fault; ``stall_limit``: confirms may
        pause at most this long during the fault; ``old_leader_limit``: the fault's leader confirms nothing this
        long after the fault began."""
        (self.tmp_path / "stop-publishing").touch()
        stopped_at = time.time()
        result = self.publisher.wait(timeout=30)
        confirms = Confirms(result, stopped_at)
        began, ended = self.began, self.ended
        figures: dict[str, object] = {
            "leader before": self.leader.name, "leader after": getattr(self.cluster.leader(), "name", None)}
        if new_leader:
            served = confirms.first_from_a_new_leader(self.began_at, self.new_leader_seen_at, self.leader.address)
            figures[f"{began} -> first confirm from a new leader"] = seconds(served)
            if served is None or served > SERVICE_LIMIT:
                seen = self.new_leader_seen_at and self.new_leader_seen_at - self.began_at
                self.problems.append(f"no confirm from a new leader within {SERVICE_LIMIT} s of the {began} (first "
                                     f"after {seconds(served)}; etcd named one after {seconds(seen)})")
        figures["longest gap between confirms"] = seconds(confirms.longest_gap(self.began_at))
        during = confirms.longest_gap(self.began_at, self.ended_at)
        if stall_limit is not None and during > stall_limit:
            self.problems.append(f"confirms paused {during:.2f} s during the {began}, over {stall_limit} s")
        if old_leader_limit is not None:
            late = confirms.latest_from(self.leader.address, self.began_at, self.ended_at)
            figures[f"{began} -> last confirm from the old leader"] = seconds(late)
            if late is not None and late > old_leader_limit + DELIVERY:
                self.problems.append(f"the old leader {self.leader.name} confirmed {late:.2f} s after the {began}, "
                                     f"over {old_leader_limit} s")
        resumed = confirms.next_after(self.ended_at)
        figures[f"{ended} -> next confirm"] = seconds(resumed)
        if resumed is None or resumed > SERVICE_LIMIT:
            self.problems.append(f"no confirm within {SERVICE_LIMIT} s of the {ended} (first after "
                                 f"{seconds(resumed)})")
        figures[f"{ended} -> every node in the ISR"] = seconds(self.rejoined)
        figures[f"connections after the {began}"] = confirms.describe_links(self.began_at, {
            node.address: name for name, node in self.cluster.nodes.items()})
        try:
            drained = drain(self.cluster.addresses, "orders", timeout=30 + result["confirmed_count"] / DRAIN_RATE)
        except TimeoutError as error:
            self.problems.append(f"reading the queue back: {error}")
        else:
            report = verify(result["confirmed"], drained)
            figures.update(confirmed=report.confirmed, lost=report.missing_count, duplicates=report.duplicates)
            if not report.ok or report.duplicates > WINDOW * max(1, result["connection_losses"]):
                self.problems.append(report.summary)  # duplicates: at most a window per connection lost
        print(f"{self.name} [{self.seconds:.0f} s]: " + "; ".join(f"{key} {value}" for key, value in figures.items()))
        if self.problems:
            print(f"{self.cluster.logs()}\n--- the nodes' leaderships\n{leadership_story(self.cluster)}")
        assert not self.problems, "\n".join(self.problems)


def seconds(value: float | None) -> str:
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

    def first_from_a_new_leader(self, began_at: float, seen_at: float | None, old_leader: str) -> float | None:
        """Seconds from the fault to the first confirm on a connection made after it to another node than the old
        leader, once etcd named a new leader (before that, such a connection is forwarded to the old one)."""
        if seen_at is None:
            return None
        firsts = [link["first_confirm_at"] for link in self.links
                  if link["opened_at"] > began_at and link["node"] != old_leader
                  and link["first_confirm_at"] is not None and link["first_confirm_at"] >= seen_at]
        return min(firsts) - began_at if firsts else None

    def latest_from(self, old_leader: str, began_at: float, ended_at: float) -> float | None:
        """Seconds from the fault to the latest confirm the old leader gave before the fault's end: on the connection
        in use when it began (whichever node took it, that leader served it) or on one made to its address
        during the fault."""
        ends = [link["opened_at"] for link in self.links[1:]] + [self.stopped_at]
        latest = []
        for link, end in zip(self.links, ends):
            served_by_it = link["opened_at"] <= began_at < end or (began_at < link["opened_at"] < ended_at
                                                                     and link["node"] == old_leader)
            until = min(end, ended_at)
            if served_by_it and link["first_confirm_at"] is not None and link["first_confirm_at"] < until:
                latest.append(min(link["last_confirm_at"], self.latest_before(until)))
        return max(latest) - began_at if latest else None

    def describe_links(self, began_at: float, names: dict[str, str]) -> str:
        """The connections made after the fault: 'to b +2.41 s (first confirm 2.52 s), ...', from the fault."""
        return ", ".join(
            f"to {names.get(link['node'], link['node'])} +{link['opened_at'] - began_at:.2f} s (first confirm "
            f"{seconds(link['first_confirm_at'] and link['first_confirm_at'] - began_at)})"
            for link in self.links if link["opened_at"] > began_at) or "none"
