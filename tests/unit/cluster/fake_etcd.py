"""An in-memory etcd and a Coordinator on it (cluster.coordinator's interface), for unit tests: the same answers
as EtcdCoordinator, without a server."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

from cluster.coordinator import (
    CoordinatorUnavailable,
    Leader,
    LeaseExpired,
    LeaseHolder,
    Member,
    NodeStillNeeded,
    Replica,
    group_of,
    isr_from_json,
    isr_to_json,
    new_secret,
)


@dataclass
class _Entry:
    """One key of the in-memory etcd."""

    value: str
    create_revision: int  # the revision that created the key, as etcd's create_revision
    lease: int  # the lease the key is bound to, 0 for none


@dataclass
class _Lease:
    ttl: float  # seconds a keepalive grants
    lapses_at: float  # time.monotonic() at which the lease and its keys go


class MemoryEtcd:
    """The state of one etcd, shared by the MemoryCoordinators of one process: keys with etcd's revisions, leases
    that lapse by time.monotonic(), and a switch that makes it unreachable. Whatever a coordinator does between
    two awaits is atomic, as an etcd transaction is."""

    def __init__(self) -> None:
        self.revision = 0  # etcd's store revision: one more at every write
        self.keys: dict[str, _Entry] = {}
        self.written: dict[str, int] = {}  # key -> the revision of its last put or delete
        self.leases: dict[int, _Lease] = {}
        self.reachable = True  # False: every coordinator call fails as with an etcd that does not answer
        self._lease_ids = itertools.count(1)
        self._changed = asyncio.Event()  # set at every write (then replaced): what wait_change() sleeps on

    def set_reachable(self, reachable: bool) -> None:
        """Cut every coordinator off, or let them through again. As etcd does when it comes back, every lease then
        gets its whole TTL anew: none lapses for want of keepalives that could not reach it."""
        if reachable and not self.reachable:
            for lease in self.leases.values():
                lease.lapses_at = time.monotonic() + lease.ttl
        self.reachable = reachable
        self._notify()

    def expire_lease(self, lease_id: int) -> None:
        """Let a lease lapse now, as if its TTL had passed without a keepalive."""
        self.revoke(lease_id)

    def check(self) -> None:
        """Every coordinator call starts here: fail as an unreachable etcd would, and let lapsed leases go."""
        if not self.reachable:
            raise CoordinatorUnavailable("the in-memory etcd is set unreachable")
        now = time.monotonic()
        for lease_id in [lease_id for lease_id, lease in self.leases.items() if lease.lapses_at <= now]:
            self.revoke(lease_id)

    def grant(self, ttl: float) -> int:
        lease_id = next(self._lease_ids)
        self.leases[lease_id] = _Lease(ttl, time.monotonic() + ttl)
        return lease_id

    def keepalive(self, lease_id: int) -> bool:
        lease = self.leases.get(lease_id)
        if lease is None:
            return False
        lease.lapses_at = time.monotonic() + lease.ttl
        return True

    def revoke(self, lease_id: int) -> None:
        self.leases.pop(lease_id, None)
        for key in [key for key, entry in self.keys.items() if entry.lease == lease_id]:
            self.delete(key)

    def get(self, key: str) -> _Entry | None:
        return self.keys.get(key)

    def get_prefix(self, prefix: str) -> dict[str, _Entry]:
        return {key: entry for key, entry in self.keys.items() if key.startswith(prefix)}

    def put(self, key: str, value: str, lease: int = 0) -> _Entry:
        if lease and lease not in self.leases:
            raise LeaseExpired(f"lease {lease} is gone")
        self.revision += 1
        previous = self.keys.get(key)
        entry = _Entry(value, previous.create_revision if previous else self.revision, lease)
        self.keys[key] = entry
        self.written[key] = self.revision
        self._notify()
        return entry

    def delete(self, key: str) -> None:
        if self.keys.pop(key, None) is not None:
            self.revision += 1
            self.written[key] = self.revision
            self._notify()

    def written_since(self, prefix: str, revision: int) -> bool:
        """Whether a key of prefix was put or deleted after revision."""
        return any(written > revision for key, written in self.written.items() if key.startswith(prefix))

    async def wait_change(self, timeout: float) -> None:
        """Sleep until the next write, the next lease lapse, or timeout, whichever comes first. Nothing lapses
        while unreachable."""
        lapses = [lease.lapses_at for lease in self.leases.values()] if self.reachable else []
        next_lapse = min(lapses, default=float("inf"))
        try:
            await asyncio.wait_for(self._changed.wait(), min(timeout, max(next_lapse - time.monotonic(), 0.0)))
        except TimeoutError:
            pass

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class MemoryCoordinator(LeaseHolder):
    """A Coordinator on a MemoryEtcd, for unit tests: the same answers as EtcdCoordinator, without a server."""

    def __init__(self, etcd: MemoryEtcd, prefix: str, node_id: str, lease_ttl: float, root: str | None = None):
        super().__init__(prefix, node_id, lease_ttl, root)
        self.etcd = etcd  # shared with the other nodes' coordinators

    async def start(self) -> None:
        self.etcd.check()
        self._lease_id = self.etcd.grant(self.lease_ttl)
        self._proven_until = time.monotonic() + self.lease_ttl

    async def refresh(self) -> bool:
        sent_at = time.monotonic()
        try:
            self.etcd.check()
        except CoordinatorUnavailable:
            return False
        if not self.etcd.keepalive(self._lease_id):
            self._proven_until = 0.0
            return False
        self._proven_until = sent_at + self.lease_ttl
        return True

    async def register(self, member: Member) -> None:
        self.etcd.check()
        self.etcd.put(self.keys.member(member.node_id), member.to_json(), self._lease_id)
        self.etcd.put(self.keys.known_member(member.node_id), member.to_json())

    async def members(self) -> dict[str, Member]:
        return self._members_under(self.keys.members)

    async def known(self) -> dict[str, Member]:
        return self._members_under(self.keys.known)

    def _members_under(self, prefix: str) -> dict[str, Member]:
        self.etcd.check()
        entries = self.etcd.get_prefix(prefix)
        return {key.removeprefix(prefix): Member.from_json(entry.value) for key, entry in entries.items()}

    async def campaign(self, leader: Member) -> int | None:
        self.etcd.check()
        if self.etcd.get(self.keys.leader) is not None:
            return None
        return self.etcd.put(self.keys.leader, leader.to_json(), self._lease_id).create_revision

    async def leader(self) -> Leader | None:
        self.etcd.check()
        entry = self.etcd.get(self.keys.leader)
        return Leader(Member.from_json(entry.value), entry.create_revision) if entry else None

    async def wait_leader_change(self, epoch: int | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if self.etcd.reachable and self._leader_epoch() != epoch:
                return
            await self.etcd.wait_change(remaining)

    async def replicas(self) -> list[Replica] | None:
        self.etcd.check()
        entry = self.etcd.get(self.keys.isr)
        return isr_from_json(entry.value) if entry else None

    async def set_isr(self, replicas: list[Replica], epoch: int) -> bool:
        self.etcd.check()
        held = self.etcd.get(self.keys.leader)
        if held is None or held.create_revision != epoch or held.lease != self._lease_id:
            return False
        self.etcd.put(self.keys.isr, isr_to_json(epoch, replicas))
        return True

    async def force_isr(self, replicas: list[Replica]) -> bool:
        self.etcd.check()
        if self.etcd.get(self.keys.leader) is not None:
            return False
        self.etcd.put(self.keys.isr, isr_to_json(0, replicas))
        return True

    async def secret(self) -> str:
        self.etcd.check()
        if (entry := self.etcd.get(self.keys.secret)) is None:
            entry = self.etcd.put(self.keys.secret, new_secret())
        return entry.value

    async def preferred(self) -> str | None:
        self.etcd.check()
        entry = self.etcd.get(self.keys.preferred)
        return entry.value if entry is not None else None

    async def prefer(self, node: str | None) -> None:
        self.etcd.check()
        if node is None:
            self.etcd.delete(self.keys.preferred)
        else:
            self.etcd.put(self.keys.preferred, node)

    async def drained(self) -> set[str]:
        self.etcd.check()
        return {key.removeprefix(self.keys.maintenance) for key in self.etcd.get_prefix(self.keys.maintenance)}

    async def drain(self, node: str, on: bool) -> None:
        self.etcd.check()
        if on:
            self.etcd.put(self.keys.maintenance + node, "drained")
        else:
            self.etcd.delete(self.keys.maintenance + node)

    async def forget(self, node: str) -> None:
        self.etcd.check()
        if node in await self.members():
            raise NodeStillNeeded(f"node {node} is running")
        if node in {replica.node for replica in await self.replicas() or []}:
            raise NodeStillNeeded(f"node {node} is in the in-sync replica set")
        self.etcd.delete(self.keys.known_member(node))

    async def agree(self, name: str, proposal: str) -> str:
        self.etcd.check()
        if (entry := self.etcd.get(self.keys.setting(name))) is None:
            entry = self.etcd.put(self.keys.setting(name), proposal)
        return entry.value

    async def record_vhost(self, vhost: str, group: int) -> int:
        self.etcd.check()
        key = self.keys.vhost(vhost)
        if (entry := self.etcd.get(key)) is None:
            entry = self.etcd.put(key, str(group))
        return group_of(key, entry.value)

    async def forget_vhosts(self, vhosts: list[str]) -> None:
        self.etcd.check()
        for vhost in vhosts:
            self.etcd.delete(self.keys.vhost(vhost))

    async def vhost_groups(self, revision: int | None, timeout: float) -> tuple[dict[str, int], int]:
        self.etcd.check()
        deadline = time.monotonic() + timeout
        while revision is not None and not self.etcd.written_since(self.keys.vhosts, revision) and (
                left := deadline - time.monotonic()) > 0:
            await self.etcd.wait_change(left)
            self.etcd.check()
        records = self.etcd.get_prefix(self.keys.vhosts)
        return {key[len(self.keys.vhosts):]: group_of(key, entry.value) for key, entry in records.items()}, (
            self.etcd.revision)

    async def resign(self) -> None:
        self.etcd.check()
        held = self.etcd.get(self.keys.leader)
        if held is not None and held.lease == self._lease_id:
            self.etcd.delete(self.keys.leader)

    async def close(self) -> None:
        if self.etcd.reachable:
            self.etcd.revoke(self._lease_id)
        self._proven_until = 0.0

    def _leader_epoch(self) -> int | None:
        self.etcd.check()
        entry = self.etcd.get(self.keys.leader)
        return entry.create_revision if entry else None
