"""A node's roles on the in-memory coordinator: a node of a fresh cluster leads; a node outside the ISR never
campaigns, and resigns if it wins all the same; a leader whose lease is gone, or whose disk makes no progress,
stops serving at once and campaigns again with a new epoch."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from broker.config import Config, load_config
from broker.connection.server import Server
from cluster.coordinator import Member, Replica, isr_to_json
from cluster.follower import ReplicaClient
from cluster.node import RETRY, STANDBY_HOLD, ClusterNode, make_coordinator
from cluster.state import identity, write_epoch
from cluster.walkover import WalkoverCoordinator
from storage import writer as writer_module
from tests.conftest import free_port, listening
from tests.unit.cluster.cluster_support import TIMEOUT, until
from tests.unit.cluster.fake_etcd import MemoryCoordinator, MemoryEtcd

TTL = 1.0


class OnlyGroup:
    """The node's one replication group, its broker listening on the node's port (cluster.node.Group): a worker's
    front doors and board are not under test here."""

    number = 0

    def __init__(self) -> None:
        self.maintenance_told: list[bool] = []  # each maintenance() call: into maintenance, or out

    def server(self, config: Config) -> Server:
        return Server(config)

    def announce(self, leader: Member | None) -> None:
        pass

    def hold(self, candidates: list[str]) -> float:
        return 0.0

    def lighter(self, candidates: list[str]) -> str | None:
        return None

    def learnt(self, secret: str) -> None:
        pass

    def maintenance(self, on: bool) -> None:
        self.maintenance_told.append(on)


def make_node(root: Path, etcd: MemoryEtcd, name: str = "n1") -> ClusterNode:
    config = load_config(None, {
        "host": "127.0.0.1", "port": free_port(), "data_dir": str(root / name), "management_port": 0,
        "prometheus_port": 0, "mqtt_port": 0, "cluster_etcd_endpoints": ["127.0.0.1:1"], "cluster_node_id": name,
        "cluster_replication_port": free_port(), "cluster_lease_ttl": TTL, "cluster_ack_timeout": 1.0,
        "cluster_min_insync": 1})
    return ClusterNode(config, MemoryCoordinator(etcd, "/warren/test", name, TTL), OnlyGroup())


class Running:
    """A node's run() as a task, stopped at the end."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.stop = asyncio.Event()
        self.task = asyncio.ensure_future(node.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, TIMEOUT)


async def leader_epoch(etcd: MemoryEtcd) -> int | None:
    observer = MemoryCoordinator(etcd, "/warren/test", "observer", TTL)
    current = await observer.leader()
    return None if current is None else current.epoch


def test_the_node_of_a_fresh_cluster_leads_and_serves(tmp_path):
    async def main():
        etcd = MemoryEtcd()
        running = Running(make_node(tmp_path, etcd))
        await until(lambda: running.node.role == "leader" and running.node.server is not None, "leading")
        assert listening(running.node.config.port)
        assert await MemoryCoordinator(etcd, "/warren/test", "x", TTL).isr() == ["n1"]
        await running.close()
        assert not listening(running.node.config.port)
    asyncio.run(main())


def test_a_node_outside_the_isr_never_campaigns(tmp_path):
    async def main():
        etcd = MemoryEtcd()
        etcd.put("/warren/test/isr", isr_to_json(1, [Replica("other", "its-dir")]))  # another node's copy only
        running = Running(make_node(tmp_path, etcd))
        await asyncio.sleep(3 * TTL)  # nothing may happen: no event to wait for
        assert running.node.role != "leader"
        assert await leader_epoch(etcd) is None
        await running.close()
    asyncio.run(main())


def test_a_node_back_with_a_wiped_data_dir_never_campaigns_and_says_why(tmp_path, caplog):
    async def main():
        etcd = MemoryEtcd()
        # n1 was in sync with another data dir, now gone: none of the ISR's copies is left
        etcd.put("/warren/test/isr", isr_to_json(1, [Replica("n1", "its-old-dir"), Replica("n2", "n2-dir")]))
        running = Running(make_node(tmp_path, etcd))
        await until(lambda: "force-leader" in running.node.waiting_for, "saying why the cluster cannot serve")
        assert running.node.role != "leader" and await leader_epoch(etcd) is None
        assert "no node holding an in-sync replica" in running.node.waiting_for
        await running.close()
    asyncio.run(main())
    said = [record.getMessage() for record in caplog.records if "not electable" in record.getMessage()]
    assert len(said) == 1, said  # once, not at every retry


def test_a_node_whose_data_dir_was_rolled_back_does_not_campaign(tmp_path):
    """Its data dir has the identity the ISR names, but holds an older epoch than the ISR says it acked (a restored
    snapshot of the volume): it may lack confirmed messages, so it does not lead."""
    async def main():
        etcd = MemoryEtcd()
        node = make_node(tmp_path, etcd)
        write_epoch(node.data_dir, 3)
        etcd.put("/warren/test/isr", isr_to_json(9, [Replica("n1", identity(node.data_dir), 120, 9)]))
        running = Running(node)
        await until(lambda: "rolled back" in node.waiting_for, "saying why it does not campaign")
        assert await leader_epoch(etcd) is None
        await running.close()
    asyncio.run(main())


def test_a_winner_outside_the_isr_resigns(tmp_path):
    async def main():
        etcd = MemoryEtcd()
        node = make_node(tmp_path, etcd)
        await node.coordinator.start()
        epoch = await node.coordinator.campaign(node.member)
        assert epoch is not None
        etcd.put("/warren/test/isr", isr_to_json(epoch, [Replica("other", "its-dir")]))  # dropped meanwhile
        await node._lead_or_resign(epoch)
        assert await leader_epoch(etcd) is None
        assert node.server is None
    asyncio.run(main())


@pytest.mark.parametrize("failure", ["lease expired", "disk stalled"])
def test_a_leader_that_cannot_prove_its_lease_stops_serving_and_campaigns_again(tmp_path, failure, monkeypatch):
    disk = threading.Event()  # set: the disk answers again

    def hung_fdatasync(fd: int) -> None:
        disk.wait(TIMEOUT)

    async def main():
        etcd = MemoryEtcd()
        running = Running(make_node(tmp_path, etcd))
        node = running.node
        await until(lambda: node.server is not None, "leading")
        first = await leader_epoch(etcd)
        server = node.server
        if failure == "lease expired":
            etcd.expire_lease(node.coordinator.lease_id)
        else:
            monkeypatch.setattr(writer_module.os, "fdatasync", hung_fdatasync)
            server.store.append_definition("vhost", "written-to-a-hung-disk", {"name": "written-to-a-hung-disk"})
        await until(lambda: not server.serving, "leadership given up")  # its store then waits for the hung write
        disk.set()
        await until(lambda: node.server is not server, "the store handed over")
        assert not server.listener.is_serving()
        await until(lambda: node.server is not None, "leading again")
        assert await leader_epoch(etcd) > first
        await running.close()
    try:
        asyncio.run(main())
    finally:
        disk.set()


def test_a_leader_whose_lease_renewal_gets_no_answer_once_renews_at_once_and_goes_on_leading(tmp_path):
    """One renewal lost (no answer within its third of the TTL: etcd slow, or the loop held meanwhile) is followed
    by the next at once, not a third of the TTL later, when the lease could no longer be proven alive."""
    async def main():
        etcd = MemoryEtcd()
        running = Running(make_node(tmp_path, etcd))
        node = running.node
        await until(lambda: node.server is not None, "leading")
        server, epoch = node.server, await leader_epoch(etcd)
        renew = node.coordinator.refresh
        renewals: list[str] = []  # each renewal asked for since: "lost" for the one that gets no answer

        async def lost_once() -> bool:
            if not renewals:
                renewals.append("lost")
                await asyncio.sleep(TIMEOUT)  # (cancelled when the node gives up on it)
            renewals.append("renewed")
            return await renew()
        node.coordinator.refresh = lost_once
        await until(lambda: len(renewals) >= 5, "four renewals after the lost one")
        assert node.server is server and server.serving
        assert await leader_epoch(etcd) == epoch
        await running.close()
    asyncio.run(main())


def test_a_node_in_maintenance_leads_nothing_until_revived(tmp_path, caplog):
    async def main():
        etcd = MemoryEtcd()
        operator = MemoryCoordinator(etcd, "/warren/test", "operator", TTL)
        await operator.drain("n1", True)  # (it stays in maintenance across a restart: etcd keeps it)
        node = make_node(tmp_path, etcd)
        running = Running(node)
        await until(lambda: node.waiting_for.startswith("this node is in maintenance"), "saying why it waits")
        assert node.group.maintenance_told == [True]
        await asyncio.sleep(3 * TTL)  # nothing may happen: no event to wait for
        assert node.role != "leader" and await leader_epoch(etcd) is None
        await operator.drain("n1", False)
        await until(lambda: node.server is not None, "leading once revived")
        assert node.group.maintenance_told == [True, False]
        await running.close()
    asyncio.run(main())


def test_a_leader_put_in_maintenance_with_no_node_to_take_over_goes_on_leading_and_says_so(tmp_path, caplog):
    async def main():
        etcd = MemoryEtcd()
        node = make_node(tmp_path, etcd)
        running = Running(node)
        await until(lambda: node.server is not None, "leading")
        await MemoryCoordinator(etcd, "/warren/test", "operator", TTL).drain("n1", True)
        await until(lambda: "no other node can lead the group" in caplog.text, "saying it goes on leading")
        assert node.group.maintenance_told == [True]
        assert node.role == "leader" and node.server is not None
        await running.close()
    asyncio.run(main())


def test_a_node_hands_over_and_gives_way_first_to_a_node_whose_hot_standby_is_whole(tmp_path):
    """The member keys say whose standby is whole: a leader in maintenance steps aside for such a node first, and a
    candidate whose own standby is not whole holds its campaign for one that is."""
    node = make_node(tmp_path, MemoryEtcd())
    members = {name: Member(name, "127.0.0.1", 5672, "127.0.0.1", 5680, dir=f"{name}-dir", standby=name == "n3")
               for name in ("n1", "n2", "n3", "n4")}
    node.drained = {"n4"}
    assert node._others_that_can_lead(members, None) == ["n3", "n2"]  # (a fresh cluster: any member could lead)
    assert node._others_that_can_lead(members, [Replica("n2", "n2-dir"), Replica("n1", "n1-dir")]) == ["n2"]


def test_a_candidate_whose_standby_is_not_whole_gives_one_whose_standby_is_a_head_start(tmp_path):
    async def main():
        etcd = MemoryEtcd()
        other = MemoryCoordinator(etcd, "/warren/test", "n2", TTL)  # a member that could lead, its standby whole
        await other.start()
        await other.register(Member("n2", "127.0.0.1", 5672, "127.0.0.1", 5680, dir="n2-dir", standby=True))

        async def keep_alive():
            while True:
                await other.refresh()
                await asyncio.sleep(TTL / 4)
        alive = asyncio.ensure_future(keep_alive())
        started = time.monotonic()
        running = Running(make_node(tmp_path, etcd))  # (no standby: it has followed no leader)
        await until(lambda: running.node.server is not None, "leading once n2 did not campaign")
        assert time.monotonic() - started >= STANDBY_HOLD
        alive.cancel()
        await running.close()
    asyncio.run(main())


def test_a_group_no_node_follows_leads_by_walkover_and_listens_for_no_follower(tmp_path):
    """Outside a cluster (each worker of --workers) the campaign is won at once, and the leader opens no replication
    port: its confirms wait for its own fsync alone."""
    async def main():
        replication_port = free_port()
        config = load_config(None, {
            "host": "127.0.0.1", "port": free_port(), "data_dir": str(tmp_path / "n1"), "management_port": 0,
            "prometheus_port": 0, "mqtt_port": 0, "cluster_node_id": "n1",
            "cluster_replication_port": replication_port})
        node = ClusterNode(config, make_coordinator(config), OnlyGroup())
        assert isinstance(node.coordinator, WalkoverCoordinator)
        running = Running(node)
        await until(lambda: node.role == "leader" and node.server is not None, "leading")
        assert listening(config.port) and not listening(replication_port)
        assert node.server.store._gate is None and node.server.store._writer.tap is None  # (nothing taps its batches)
        await running.close()
        assert not listening(config.port)
    asyncio.run(main())


def test_a_follower_whose_stream_fails_unforeseen_retries_at_its_pace_and_says_why_once(tmp_path, monkeypatch,
                                                                                        caplog):
    """An error the follower's stream does not foresee ends that stream as a failure does: logged with the error,
    tried again after RETRY (it started the next one at once, thousands a second, each logged as never retrieved);
    the same failure again is logged again only after a stream that heard the leader (a leader out of reach wrote
    five lines a second)."""
    started: list[float] = []

    def failing(client, host, port):
        started.append(time.monotonic())
        if len(started) == 2:  # (this one heard the leader before it failed)
            client.heard_at = time.monotonic()
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(ReplicaClient, "_stream", failing)

    async def main():
        etcd = MemoryEtcd()
        leader = Running(make_node(tmp_path, etcd, "n1"))
        await until(lambda: leader.node.role == "leader", "n1 leading")
        follower = Running(make_node(tmp_path, etcd, "n2"))
        await until(lambda: len(started) >= 3, "three tries of the follower's stream")
        await follower.close()
        await leader.close()
    asyncio.run(main())
    assert all(later - earlier >= RETRY * 0.9 for earlier, later in zip(started, started[1:])), started
    said = [record.getMessage() for record in caplog.records if "follower of n1" in record.getMessage()]
    assert len(said) == 2, said  # (the first try's and the second's; not the third's and later)
    assert all("RuntimeError('unforeseen')" in line and "trying again every 0.2 s" in line for line in said), said
