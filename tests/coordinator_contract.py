"""What every Coordinator does, as checks that run against each implementation: the in-memory fake
(tests/unit/cluster/test_coordinator.py) and etcd (tests/cluster/test_etcd_coordinator.py) must answer alike.

A check takes Nodes, which starts coordinators of one cluster and can make a node's lease lapse at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol

import pytest

from cluster.coordinator import Coordinator, Leader, LeaseExpired, Member, NodeStillNeeded, Replica

WAKE_BOUND = 1.0  # seconds within which a waiter must see a change of leader


class Nodes(Protocol):
    async def start(self, node_id: str) -> Coordinator:
        """A started coordinator for node_id (closed at the end of the check)."""

    async def expire(self, node: Coordinator) -> None:
        """End node's lease now, as if its TTL had passed without a keepalive."""


Check = Callable[[Nodes], Awaitable[None]]
CHECKS: list[Check] = []


def check(function: Check) -> Check:
    CHECKS.append(function)
    return function


def member(node_id: str) -> Member:
    return Member(node_id, "127.0.0.1", 5672, "127.0.0.1", 25672)


async def won(node: Coordinator) -> int:
    """The epoch of node's campaign, which it must win."""
    epoch = await node.campaign(member(node.node_id))
    assert epoch is not None
    return epoch


def copies(*node_ids: str) -> list[Replica]:
    """Replicas of these nodes, each with a data dir identity of its own."""
    return [Replica(node_id, f"dir-of-{node_id}", 7) for node_id in node_ids]


async def leading(nodes: Nodes, node_id: str) -> tuple[Coordinator, int]:
    """A started node that won the election, and its epoch."""
    node = await nodes.start(node_id)
    return node, await won(node)


async def returns_within(seconds: float, waiter: asyncio.Task) -> None:
    await asyncio.wait_for(waiter, seconds)


@check
async def nobody_leads_and_there_is_no_isr_in_a_fresh_cluster(nodes: Nodes) -> None:
    a = await nodes.start("a")
    assert await a.leader() is None
    assert await a.isr() is None
    assert await a.members() == {}


@check
async def the_first_campaign_wins_and_the_others_lose(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    assert epoch > 0
    assert await b.campaign(member("b")) is None
    assert await a.campaign(member("a")) is None  # one attempt, not a re-entry: the key exists
    assert await b.leader() == Leader(member("a"), epoch)


@check
async def every_new_leadership_has_a_higher_epoch(nodes: Nodes) -> None:
    a, first = await leading(nodes, "a")
    b = await nodes.start("b")
    await a.resign()
    assert await b.leader() is None
    second = await b.campaign(member("b"))
    assert second is not None and second > first
    await nodes.expire(b)
    _, third = await leading(nodes, "c")
    assert third > second
    assert await a.leader() == Leader(member("c"), third)


@check
async def the_leader_writes_the_isr(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    assert await a.set_isr(copies("a", "b"), epoch)
    assert await b.isr() == ["a", "b"]
    assert await a.set_isr(copies("a"), epoch)
    assert await b.isr() == ["a"]
    assert await b.replicas() == copies("a")  # each with its data dir's identity and how far it acked


@check
async def an_unclean_election_writes_the_isr_only_while_nobody_leads(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    assert await a.set_isr(copies("a"), epoch)
    assert not await b.force_isr(copies("b"))
    assert await b.replicas() == copies("a")
    await a.resign()
    assert await b.force_isr(copies("b"))
    assert await a.replicas() == copies("b")


@check
async def an_isr_write_is_refused_to_a_node_that_does_not_lead(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    assert await a.set_isr(copies("a", "b"), epoch)
    assert not await b.set_isr(copies("b"), epoch)  # the right epoch, but not b's lease
    assert not await a.set_isr(copies("a"), epoch + 1)  # a's lease, but another epoch
    assert await b.isr() == ["a", "b"]


@check
async def an_isr_write_is_refused_once_the_leaders_lease_lapsed(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    await nodes.expire(a)
    assert not await a.set_isr(copies("a"), epoch)
    assert await a.isr() is None


@check
async def an_isr_write_is_refused_to_a_deposed_leader(nodes: Nodes) -> None:
    a, old = await leading(nodes, "a")
    b = await nodes.start("b")
    await a.resign()
    new = await b.campaign(member("b"))
    assert new is not None
    assert not await a.set_isr(copies("a"), old)
    assert not await a.set_isr(copies("a"), new)
    assert await b.set_isr(copies("b"), new)
    assert await a.isr() == ["b"]


@check
async def members_vanish_with_their_lease(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    await a.register(member("a"))
    await b.register(member("b"))
    assert await a.members() == {"a": member("a"), "b": member("b")}
    await nodes.expire(a)
    assert await b.members() == {"b": member("b")}
    assert await b.known() == {"a": member("a"), "b": member("b")}  # (a node known, running or not)


@check
async def only_a_node_that_is_down_and_out_of_sync_is_forgotten(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    c = await nodes.start("c")
    for node in (a, b, c):
        await node.register(member(node.node_id))
    with pytest.raises(NodeStillNeeded, match="node b is running"):
        await a.forget("b")
    assert await a.set_isr(copies("a", "b"), epoch)
    await nodes.expire(b)
    with pytest.raises(NodeStillNeeded, match="node b is in the in-sync replica set"):
        await a.forget("b")
    await nodes.expire(c)
    await a.forget("c")
    assert await a.known() == {"a": member("a"), "b": member("b")}
    await a.forget("c")  # (forgotten already: nothing to do)
    assert await a.set_isr(copies("a"), epoch)
    await a.forget("b")
    assert await a.known() == {"a": member("a")}


@check
async def refresh_keeps_the_lease_until_it_is_gone(nodes: Nodes) -> None:
    a = await nodes.start("a")
    assert a.lease_alive
    assert await a.refresh()
    assert a.lease_alive
    await nodes.expire(a)
    assert a.lease_alive  # nothing tells the node before it asks
    assert not await a.refresh()
    assert not a.lease_alive


@check
async def nothing_can_be_bound_to_a_lapsed_lease(nodes: Nodes) -> None:
    a = await nodes.start("a")
    await nodes.expire(a)
    with pytest.raises(LeaseExpired):
        await a.register(member("a"))
    with pytest.raises(LeaseExpired):
        await a.campaign(member("a"))


@check
async def the_leader_key_goes_with_the_leaders_lease(nodes: Nodes) -> None:
    a, _ = await leading(nodes, "a")
    b = await nodes.start("b")
    await nodes.expire(a)
    assert await b.leader() is None
    assert await b.campaign(member("b")) is not None


@check
async def resign_leaves_another_nodes_leadership_alone(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    await b.resign()
    assert await b.leader() == Leader(member("a"), epoch)


@check
async def close_revokes_the_lease_and_its_keys(nodes: Nodes) -> None:
    a, _ = await leading(nodes, "a")
    await a.register(member("a"))
    b = await nodes.start("b")
    await a.close()
    assert not a.lease_alive
    assert await b.leader() is None
    assert await b.members() == {}


@check
async def every_node_reads_the_same_secret(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    secret = await a.secret()
    assert len(secret) >= 32
    assert await b.secret() == secret
    assert await a.secret() == secret


@check
async def the_first_proposal_of_a_setting_is_the_one_every_node_reads(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    assert await a.agree("workers", "2") == "2"
    assert await b.agree("workers", "3") == "2"
    assert await b.agree("other", "3") == "3"
    assert await a.agree("workers", "2") == "2"


@check
async def the_first_group_recorded_for_a_vhost_is_the_one_every_node_reads(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    assert (await a.vhost_groups(None, 1))[0] == {}
    assert await a.record_vhost("orders", 1) == 1
    assert await b.record_vhost("orders", 0) == 1  # (two nodes making it at once: the first record stands)
    names = ["/", "a/b", "../secret", "workers", "ünïcode"]  # each its own key, whatever it holds
    for group, name in enumerate(names):
        assert await b.record_vhost(name, group) == group
    assert (await a.vhost_groups(None, 1))[0] == {"orders": 1, **{name: group for group, name in enumerate(names)}}
    assert await a.agree("workers", "2") == "2"  # a vhost's record is no setting
    await a.forget_vhosts(["orders", "a/b", "never recorded"])
    assert "orders" not in (await b.vhost_groups(None, 1))[0]
    assert await b.record_vhost("orders", 0) == 0  # made again after it was deleted: recorded anew


@check
async def a_reader_of_the_vhosts_records_wakes_when_one_changes(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    _, revision = await b.vhost_groups(None, 1)
    waiter = asyncio.ensure_future(b.vhost_groups(revision, 10))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await a.prefer("b")  # (not a record: it goes on waiting)
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await a.record_vhost("orders", 1)
    await returns_within(WAKE_BOUND, waiter)
    records, revision = waiter.result()
    assert records == {"orders": 1}
    waiter = asyncio.ensure_future(b.vhost_groups(revision, 10))
    await asyncio.sleep(0.1)
    await a.forget_vhosts(["orders"])
    await returns_within(WAKE_BOUND, waiter)
    assert waiter.result()[0] == {}
    started = time.monotonic()
    assert (await b.vhost_groups(waiter.result()[1], 0.3))[0] == {}  # nothing changes: back after the timeout
    assert 0.3 <= time.monotonic() - started < 0.3 + WAKE_BOUND


@check
async def the_preferred_leader_is_what_was_asked_last(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    assert await b.preferred() is None
    await a.prefer("b")
    assert await b.preferred() == "b"
    await a.prefer(None)
    assert await b.preferred() is None
    await a.prefer(None)  # (nothing to take back)


@check
async def a_node_in_maintenance_stays_there_until_revived_whoever_asked(nodes: Nodes) -> None:
    a = await nodes.start("a")
    b = await nodes.start("b")
    assert await b.drained() == set()
    await a.drain("b", True)
    await a.drain("c", True)  # (a node need not run to be put in maintenance)
    assert await b.drained() == {"b", "c"}
    await b.drain("b", False)
    assert await a.drained() == {"c"}
    await b.drain("b", False)  # (nothing to take back)
    await nodes.expire(a)
    assert await b.drained() == {"c"}  # not bound to a lease: it outlives the node that asked


@check
async def a_waiter_wakes_when_the_leader_resigns(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    waiter = asyncio.ensure_future(b.wait_leader_change(epoch, 10))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await a.resign()
    await returns_within(WAKE_BOUND, waiter)


@check
async def a_waiter_wakes_when_the_leaders_lease_lapses(nodes: Nodes) -> None:
    a, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    waiter = asyncio.ensure_future(b.wait_leader_change(epoch, 10))
    await asyncio.sleep(0.1)
    await nodes.expire(a)
    await returns_within(WAKE_BOUND, waiter)


@check
async def a_waiter_for_no_leader_wakes_when_someone_leads(nodes: Nodes) -> None:
    b = await nodes.start("b")
    waiter = asyncio.ensure_future(b.wait_leader_change(None, 10))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await leading(nodes, "a")
    await returns_within(WAKE_BOUND, waiter)


@check
async def a_waiter_returns_at_once_when_its_epoch_is_already_past(nodes: Nodes) -> None:
    a, old = await leading(nodes, "a")
    await a.resign()
    b, _ = await leading(nodes, "b")
    await returns_within(WAKE_BOUND, asyncio.ensure_future(b.wait_leader_change(old, 10)))
    await returns_within(WAKE_BOUND, asyncio.ensure_future(b.wait_leader_change(None, 10)))


@check
async def a_waiter_returns_after_its_timeout_when_nothing_changes(nodes: Nodes) -> None:
    _, epoch = await leading(nodes, "a")
    b = await nodes.start("b")
    started = time.monotonic()
    await b.wait_leader_change(epoch, 0.3)
    assert 0.3 <= time.monotonic() - started < 0.3 + WAKE_BOUND
