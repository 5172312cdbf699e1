"""A clustered node's replication groups, one per worker slot: worker k of every node is a member of group k, which
holds the vhosts placed on worker k (broker.workers.placement.HashedPlacement). Every node runs the same number of
workers (etcd holds it: agreed on by the first node). Who leads each group, the node's workers post on their board
(broker.workers.board).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.workers.board import group_key
from cluster.coordinator import Member

DEFAULT_GROUP = 0  # where a client goes whose handshake a front door could not read (its leader says what is wrong)


def posted(leader: Member | None) -> dict | None:
    """A group's leader as the board holds it: its node, AMQP address (and amqps port) and management API port."""
    return None if leader is None else {"node": leader.node_id, "host": leader.amqp_host, "port": leader.amqp_port,
                                        "tls_port": leader.amqps_port, "api": leader.management_port}


def led_by(board: dict, node: str, groups: int) -> list[int]:
    """The groups the node leads, as the board says, lowest first."""
    return [group for group in range(groups) if (board.get(group_key(group)) or {}).get("node") == node]


def members_posted(members: Iterable[Member]) -> dict:
    """A group's members as the board holds them: each node's AMQP host and management API port."""
    return {member.node_id: {"host": member.amqp_host, "api": member.management_port} for member in members}
