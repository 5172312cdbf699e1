"""The in-memory coordinator: the contract every coordinator keeps (tests/coordinator_contract.py, also run against
a real etcd in tests/cluster), then the fake's own clock and its unreachable switch."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from cluster.coordinator import CoordinatorError, CoordinatorUnavailable, Leader, Member
from tests.coordinator_contract import CHECKS, Check, copies, member, won
from tests.unit.cluster.fake_etcd import MemoryCoordinator, MemoryEtcd


class MemoryNodes:
    """Coordinators of one cluster on one MemoryEtcd."""

    def __init__(self, lease_ttl: float = 5.0):
        self.etcd = MemoryEtcd()
        self.lease_ttl = lease_ttl
        self.started: list[MemoryCoordinator] = []

    async def start(self, node_id: str, lease_ttl: float | None = None) -> MemoryCoordinator:
        node = MemoryCoordinator(self.etcd, "/warren/test", node_id, lease_ttl or self.lease_ttl)
        await node.start()
        self.started.append(node)
        return node

    async def expire(self, node: MemoryCoordinator) -> None:
        self.etcd.expire_lease(node.lease_id)

    async def close(self) -> None:
        for node in self.started:
            await node.close()


def run(scenario) -> None:
    async def with_nodes() -> None:
        nodes = MemoryNodes()
        try:
            await scenario(nodes)
        finally:
            await nodes.close()

    asyncio.run(with_nodes())


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_memory_coordinator_keeps_the_contract(check: Check) -> None:
    run(check)


def test_a_lease_lapses_by_the_clock_without_keepalives() -> None:
    async def scenario(nodes: MemoryNodes) -> None:
        a = await nodes.start("a", lease_ttl=0.2)
        b = await nodes.start("b")
        await a.register(member("a"))
        epoch = await won(a)
        started = time.monotonic()
        await b.wait_leader_change(epoch, 5)
        assert 0.15 <= time.monotonic() - started < 1
        assert not a.lease_alive
        assert await b.members() == {}
        assert not await a.refresh()

    run(scenario)


def test_keepalives_hold_a_lease_past_its_ttl() -> None:
    async def scenario(nodes: MemoryNodes) -> None:
        a = await nodes.start("a", lease_ttl=0.3)
        epoch = await won(a)
        for _ in range(6):
            await asyncio.sleep(0.1)
            assert await a.refresh()
        assert await a.leader() == Leader(member("a"), epoch)

    run(scenario)


def test_an_unreachable_etcd_fails_every_call_until_it_returns() -> None:
    async def scenario(nodes: MemoryNodes) -> None:
        a = await nodes.start("a", lease_ttl=0.3)
        epoch = await won(a)
        nodes.etcd.set_reachable(False)
        for call in (a.leader(), a.members(), a.isr(), a.set_isr(copies("a"), epoch), a.campaign(member("a")),
                     a.register(member("a")), a.secret(), a.resign()):
            with pytest.raises(CoordinatorUnavailable):
                await call
        assert not await a.refresh()
        assert a.lease_alive  # the last grant still proves it
        started = time.monotonic()
        await a.wait_leader_change(epoch, 0.5)  # rides out the outage until its timeout
        assert time.monotonic() - started >= 0.5
        assert not a.lease_alive  # past the TTL without a keepalive: no longer proven
        nodes.etcd.set_reachable(True)
        assert await a.leader() == Leader(member("a"), epoch)  # back with every lease renewed, as etcd does
        assert await a.refresh() and a.lease_alive
        assert await a.set_isr(copies("a"), epoch)

    run(scenario)


def test_a_waiter_sees_a_change_made_while_etcd_was_unreachable_once_it_returns() -> None:
    async def scenario(nodes: MemoryNodes) -> None:
        a = await nodes.start("a")
        b = await nodes.start("b")
        epoch = await won(a)
        waiter = asyncio.ensure_future(b.wait_leader_change(epoch, 10))
        nodes.etcd.set_reachable(False)
        nodes.etcd.expire_lease(a.lease_id)  # as if the lease had lapsed just before the outage
        await asyncio.sleep(0.1)
        assert not waiter.done()
        nodes.etcd.set_reachable(True)
        await asyncio.wait_for(waiter, 1)

    run(scenario)


def test_a_member_key_with_fields_of_a_later_version_is_read_and_a_malformed_one_refused() -> None:
    """A rolling upgrade has nodes of two versions reading each other's member keys: one that says more of itself
    than this version knows is read for what this version knows; one that is not a member is refused, saying so."""
    known = Member("b", "10.0.0.2", 5672, "10.0.0.2", 5680, dir="d", management_port=15672, standby=True)
    later = json.loads(known.to_json()) | {"version": "9.9.9", "draining": True}
    assert Member.from_json(json.dumps(later)) == known
    earlier = {name: value for name, value in json.loads(known.to_json()).items() if name != "standby"}
    assert Member.from_json(json.dumps(earlier)).standby is False  # (a node of the version before says nothing)
    for malformed in ('["b"]', '{"node_id": "b"}', '{"node_id": 7, "amqp_host": "h", "amqp_port": 1, '
                      '"replication_host": "h", "replication_port": 2}', "not json",
                      '{"node_id": "b", "amqp_host": "h", "amqp_port": 1, "replication_host": "h", '
                      '"replication_port": 2, "standby": "yes"}'):
        with pytest.raises(CoordinatorError, match="a member or leader key in etcd holds"):
            Member.from_json(malformed)
