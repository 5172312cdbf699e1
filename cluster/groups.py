"""A clustered node's replication groups, one per worker slot: worker k of every node is a member of group k, which
holds the vhosts recorded in group k (broker.workers.placement: one rule on one node and in a cluster; in a cluster
the record is etcd's, ``VhostRecord``). Every node runs the same number of workers (etcd holds it: agreed on by the
first node). Who leads each group, and the record, the node's workers post on their board (broker.workers.board).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Callable

from broker.workers.board import group_key
from broker.workers.placement import place_new
from cluster.coordinator import Coordinator, CoordinatorError, Member

log = logging.getLogger("cluster")

RETRY = 0.5  # seconds before the record is read again after etcd did not answer

DEFAULT_GROUP = 0  # where a client goes whose handshake a front door could not read (its leader says what is wrong)


def posted(leader: Member | None) -> dict | None:
    """A group's leader as the board holds it: its node, AMQP address (and amqps port), management API port and MQTT
    ports."""
    return None if leader is None else {"node": leader.node_id, "host": leader.amqp_host, "port": leader.amqp_port,
                                        "tls_port": leader.amqps_port, "api": leader.management_port,
                                        "mqtt_port": leader.mqtt_port, "mqtt_tls_port": leader.mqtt_tls_port}


def led_by(board: dict, node: str, groups: int) -> list[int]:
    """The groups the node leads, as the board says, lowest first."""
    return [group for group in range(groups) if (board.get(group_key(group)) or {}).get("node") == node]


def members_posted(members: Iterable[Member]) -> dict:
    """A group's members as the board holds them: each node's AMQP host and management API port."""
    return {member.node_id: {"host": member.amqp_host, "api": member.management_port} for member in members}


class VhostRecord:
    """The cluster's record of which group holds each vhost, in etcd (a key per vhost), as a worker reads and
    writes it."""

    def __init__(self, coordinator: Coordinator, group: int, workers: int, pins: dict[str, int]) -> None:
        self.coordinator = coordinator
        self.group = group  # the group of the worker that reads and writes it
        self.workers = workers  # groups in the cluster
        self.pins = pins  # vhost -> group, from the node's [[vhosts]] worker = k

    async def record(self, vhosts: list[str], found: list[str]) -> dict[str, int]:
        """Every vhost of vhosts recorded where it is not yet: by the one rule, but a vhost whose contents this
        group's store holds (found) in this group, where its data is (a cluster of an earlier version, which placed
        vhosts by a hash of their names, or one whose etcd lost its keys); the whole record after."""
        leaders, _ = await self.coordinator.vhost_groups(None, 0)
        missing = [name for name in vhosts if name not in leaders]
        held = set(found)
        proposals = {name: self.group for name in missing if name in held}
        proposals.update(place_new({**leaders, **proposals}, missing, self.workers, self.pins))
        for name, group in proposals.items():
            leaders[name] = await self.coordinator.record_vhost(name, group)
        for name in vhosts:
            if self.pins.get(name, leaders[name]) != leaders[name]:
                log.error("vhost '%s' is pinned to group %d ([[vhosts]] worker), but the cluster records it in group "
                          "%d, where its data is: it stays there (remove the pin)", name, self.pins[name],
                          leaders[name])
        return leaders

    async def asked(self, request: dict) -> dict:
        """The supervisor's request to record vhosts made through its node's API ({"record": [...]}) or to forget
        deleted ones ({"forget": [...]}), answered with the whole record, or why not (broker.workers.control)."""
        try:
            if "record" in request:
                return {"placement": await self.record(request["record"], [])}
            await self.coordinator.forget_vhosts(request["forget"])  # (deleted vhosts)
            return {"placement": (await self.coordinator.vhost_groups(None, 0))[0]}
        except CoordinatorError as error:  # (etcd does not answer, or a record is damaged: the text says which)
            return {"refused": str(error)}

    async def follow(self, changed: Callable[[dict[str, int]], None], timeout: float) -> None:
        """Hand every new state of the record to ``changed``, as long as this runs (what keeps it from reading the
        record is logged once, until it reads it again)."""
        revision = None
        said = ""  # the last failure logged
        while True:
            try:
                leaders, revision = await self.coordinator.vhost_groups(revision, timeout)
            except CoordinatorError as error:  # (read whole again: the revision may be compacted meanwhile)
                if str(error) != said:
                    log.error("cannot read the cluster's record of its vhosts: %s", error)
                    said = str(error)
                revision = None
                await asyncio.sleep(RETRY)
                continue
            said = ""
            changed(leaders)
