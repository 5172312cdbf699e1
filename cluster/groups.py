"""A clustered node's replication groups, one per worker slot: worker k of every node is a member of group k. Which
group a vhost lives in is the same on every node without asking anyone: the group its [[vhosts]] table pins it to,
else a hash of its name. Every node runs the same number of workers (etcd holds it: agreed on by the first node).
"""

from __future__ import annotations

import math
import zlib

from cluster.coordinator import Member

DEFAULT_GROUP = 0  # where a client goes whose handshake a front door could not read (its leader says what is wrong)


class Groups:
    """The vhosts' groups, and who leads each as the node's workers posted it (broker.workers.board)."""

    def __init__(self, count: int, pins: dict[str, int]):
        self.count = count  # groups: the workers of each node
        self.pins = pins  # vhost -> group, from [[vhosts]] worker = k

    def of(self, vhost: str) -> int:
        pinned = self.pins.get(vhost)
        return pinned if pinned is not None else zlib.crc32(vhost.encode()) % self.count


def board_key(group: int) -> str:
    """The board's key for who leads a group."""
    return f"group {group}"


def posted(leader: Member | None) -> dict | None:
    """A group's leader as the board holds it."""
    return None if leader is None else {"node": leader.node_id, "host": leader.amqp_host, "port": leader.amqp_port}


def led_by(board: dict, node: str) -> int:
    """How many groups the node leads, as the board says."""
    return sum(1 for key, leader in board.items() if key.startswith("group ") and leader.get("node") == node)


def fair_share(groups: int, nodes: int) -> int:
    """The most groups one node should lead while the others lead fewer."""
    return math.ceil(groups / max(nodes, 1))
