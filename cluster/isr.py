"""The in-sync replica set (ISR) of a leader: the copies its confirms wait for, as committed to etcd.

The ISR wanted is this leader and every follower in sync (cluster.replication says when one is). Below
``min_insync`` no confirm can go out whatever the ISR says, so it then also keeps every replica of the committed ISR
that is not connected: that replica still holds all that was confirmed (none could be without it), and may lead
instead. A change is committed to etcd, fenced on the leader's lease, before any confirm that did not wait for it:
cluster.replication's gate reads ``committed``. A leader left below ``min_insync`` while such a replica tells etcd
it lost this leader (``Member.lost_leader``: a cut link, not a dead node) steps aside, so that the side holding the
copies serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from cluster.coordinator import Coordinator, CoordinatorUnavailable, Replica

log = logging.getLogger("cluster.replication")
Answer = TypeVar("Answer")

ISR_RETRY = 0.2  # seconds between attempts to read or write the ISR while etcd does not answer


class InSyncReplicas:
    """One leader's ISR: what it wants, what etcd holds, and when leadership must end for it."""

    def __init__(self, coordinator: Coordinator, node: str, epoch: int, min_insync: int,
                 live: Callable[[], tuple[Replica, ...]], connected: Callable[[], Collection[str]],
                 committed: Callable[[], None], lost: Callable[[str], None]) -> None:
        self._coordinator = coordinator
        self._node = node
        self._epoch = epoch
        self._min_insync = min_insync
        self._live = live  # this leader and every follower in sync, as replicas
        self._connected = connected  # the nodes of the followers connected now, in sync or not
        self._on_commit = committed  # called once an ISR is committed: confirms that waited for it may go
        self._lost = lost  # called once if etcd says another node leads now, or leadership is to go elsewhere
        self.committed: tuple[Replica, ...] = ()  # the ISR as last written to etcd (confirms wait for all of it)
        self.changed = asyncio.Event()  # the wanted ISR may differ from the committed one
        self.stepped_aside = False  # leadership ended for want of min_insync copies, in favour of a replica

    def enough(self, copies: int) -> bool:
        return copies >= self._min_insync

    def wanted(self) -> tuple[Replica, ...]:
        """The live copies; below min_insync, also every replica of the committed ISR that is not connected (one that
        connects again leaves, since its copy is about to be rewritten)."""
        live = self._live()
        if self.enough(len(live)):
            return live
        connected = self._connected()
        return (*live, *(replica for replica in self.committed
                         if replica.node != self._node and replica.node not in connected))

    async def start(self) -> bool:
        """Read the previous epoch's ISR, and commit this epoch's first (its replicas kept as long as they are needed
        to make min_insync); False if etcd refuses it: another node leads."""
        previous = await self._retrying(self._coordinator.replicas,
                                        "cannot read the in-sync replicas from etcd (%s): retrying")
        self.committed = tuple(previous or ())
        return await self._commit(self.wanted())

    async def keep(self) -> None:
        """Write the wanted ISR to etcd whenever it changes; confirms wait meanwhile."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            wanted = self.wanted()
            if not same_copies(wanted, self.committed) and not await self._commit(wanted):
                self._lost("etcd refused the ISR write: another node leads now")
                return

    async def _commit(self, isr: tuple[Replica, ...]) -> bool:
        """Commit ``isr`` (fenced on this node's leadership), retrying while etcd is unreachable; False if stale."""
        nodes = ", ".join(replica.node for replica in isr)
        if not await self._retrying(lambda: self._coordinator.set_isr(list(isr), self._epoch),
                                    "cannot write the in-sync replicas %s to etcd (%s): confirms wait", nodes):
            return False
        if not same_copies(isr, self.committed):
            log.info("in-sync replicas: %s", nodes)
        self.committed = isr
        self._on_commit()
        return True

    async def _retrying(self, request: Callable[[], Awaitable[Answer]], warning: str, *args: object) -> Answer:
        """``request()``'s answer, asked again every ISR_RETRY while etcd does not answer (logging ``warning``)."""
        while True:
            try:
                return await request()
            except CoordinatorUnavailable as error:
                log.warning(warning, *args, error)
                await asyncio.sleep(ISR_RETRY)

    async def left(self, node: str) -> None:
        """Wait until node is out of the committed ISR (a joining follower, whose copy is about to be rewritten)."""
        while any(replica.node == node for replica in self.committed):
            self.changed.set()
            await asyncio.sleep(ISR_RETRY / 4)

    async def step_aside_when_outnumbered(self, period: float) -> None:
        """Below min_insync no confirm can go out here. When a replica of the ISR that is not connected tells etcd
        it lost this leader (so it is alive, and may hold everything confirmed: the ISR kept it), leadership ends
        in its favour; the node then waits before campaigning again, so that the replica's side takes over."""
        while True:
            await asyncio.sleep(period)
            if self.enough(len(self._live())):
                continue
            try:
                members = await self._coordinator.members()
            except CoordinatorUnavailable:
                continue
            connected = self._connected()
            lost = sorted(replica.node for replica in self.committed
                          if replica.node != self._node and replica.node not in connected
                          and (member := members.get(replica.node)) is not None
                          and member.lost_leader == self._epoch)
            if lost:
                self.stepped_aside = True
                self._lost(f"it cannot keep {self._min_insync} copies and {', '.join(lost)} of the in-sync replicas "
                           "lost it but still reach etcd: stepping aside")
                return


def same_copies(one: tuple[Replica, ...], other: tuple[Replica, ...]) -> bool:
    """Whether two ISRs name the same data dirs (how far each acked aside)."""
    return [(r.node, r.dir) for r in one] == [(r.node, r.dir) for r in other]
