"""The coordination of a group no other node can follow: each worker of a node outside a cluster (``--workers``) is
a group of one, and leads it by walkover, as LavinMQ's standalone elector wins its campaign ("a cluster of one").

The group runs the cluster's code path (cluster.node, cluster.worker) with nothing to wait for: the campaign is won
at once, the lease never lapses, the node is the only copy of its data, and the leader ships its writes nowhere
(``Unfollowed``): a confirm waits for its own fsync alone, as a one-process broker's does.
"""

from __future__ import annotations

import asyncio
import ssl

from cluster.coordinator import Leader, Member, Replica


class WalkoverCoordinator:
    """cluster.coordinator.Coordinator for a group of one node, which no one else can lead: what such a group asks.
    (Writing the in-sync replicas, putting a node in maintenance and forgetting one are asked only where other nodes
    follow: ``followed``.)"""

    followed = False  # no node follows the group: its leader replicates nothing
    lease_ttl = 24 * 3600.0  # seconds a walkover lease lives: renewed every eight hours, and never refused
    lease_alive = True  # (it never lapses)

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._member: Member | None = None  # as registered
        self._leader: Leader | None = None  # the node, once its campaign is won
        self._epochs = 0  # leaderships so far

    async def start(self) -> None:
        pass

    async def refresh(self) -> bool:
        return True

    async def register(self, member: Member) -> None:
        self._member = member

    async def members(self) -> dict[str, Member]:
        return {self.node_id: self._member} if self._member is not None else {}

    async def known(self) -> dict[str, Member]:
        return await self.members()

    async def campaign(self, leader: Member) -> int | None:
        self._epochs += 1
        self._leader = Leader(leader, self._epochs)
        return self._epochs

    async def leader(self) -> Leader | None:
        return self._leader

    async def wait_leader_change(self, epoch: int | None, timeout: float) -> None:
        if (self._leader.epoch if self._leader is not None else None) == epoch:
            await asyncio.sleep(timeout)

    async def replicas(self) -> list[Replica] | None:
        return None  # (as a fresh cluster's: any copy may lead, and this one is the only one)

    async def secret(self) -> str:
        return ""  # (nothing travels between nodes)

    async def preferred(self) -> str | None:
        return self.node_id

    async def prefer(self, node: str | None) -> None:
        pass

    async def drained(self) -> set[str]:
        return set()

    async def agree(self, name: str, proposal: str) -> str:
        return proposal

    async def resign(self) -> None:
        self._leader = None

    async def close(self) -> None:
        self._leader = None


class Unfollowed:
    """What a leader's replication (cluster.replication.ReplicationServer) does in a group no node follows:
    nothing. No port is opened, no batch is framed, and the store's confirms go out after its own fsync."""

    stepped_aside = False  # (no replica to step aside for)

    def __init__(self) -> None:
        self.store_ready = asyncio.Event()  # (set by the node once the store is recovered, as for a real stream)

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        pass

    def halt(self) -> None:
        pass

    async def stop(self) -> None:
        pass
