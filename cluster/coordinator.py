"""The coordination interface: a lease, the election, membership and the in-sync replica set, under a group's
prefix in etcd (``Keys`` says where each lives). The leader key holds the leader's Member, bound to its lease; its
create_revision is the epoch. The ISR ({"epoch": E, "replicas": [{"node", "dir", "acked", "epoch"}]}, a replica
being a node's data dir) is written only by the leader of epoch E, fenced on its lease.

Coordinator is what the cluster code speaks; EtcdCoordinator (cluster/etcd.py) is the real one, WalkoverCoordinator
(cluster/walkover.py) the one of a node outside a cluster, MemoryCoordinator (tests/unit/cluster/fake_etcd.py) an
in-memory fake for unit tests, several of which share one MemoryEtcd.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple, Protocol


class CoordinatorError(Exception):
    """The coordination service refused or could not do what was asked."""


class CoordinatorUnavailable(CoordinatorError):
    """etcd did not answer in time (down, unreachable or too slow): nothing was learnt and nothing may be assumed."""


class LeaseExpired(CoordinatorError):
    """This node's lease is gone, so nothing can be bound to it any more: the node has to start over."""


class NodeStillNeeded(CoordinatorError):
    """A node to be forgotten still runs, or is in the in-sync replica set: forgetting it would lose a copy."""


@dataclass(frozen=True)
class Member:
    """A node's addresses, as clients and the other nodes reach it, and whether it has lost its leader."""

    node_id: str
    amqp_host: str
    amqp_port: int
    replication_host: str
    replication_port: int
    dir: str = ""  # the identity of its data dir (cluster.state)
    # the epoch of the leader this node follows but has not heard from for a while (0: none): a leader that
    # cannot keep min_insync copies steps aside for such a node, which etcd still hears and may hold everything
    lost_leader: int = 0
    management_port: int = 0  # its management API's, at amqp_host (0: none)
    amqps_port: int = 0  # its amqps port, at amqp_host, where other nodes forward clients with [cluster] tls (0: none)
    # its hot standby holds all its data dir does (storage.standby): elected, it serves without reading the data dir
    standby: bool = False
    mqtt_port: int = 0  # its MQTT port, at amqp_host, where other nodes forward MQTT clients (0: none)
    mqtt_tls_port: int = 0  # its MQTT over TLS port, where they forward them with [cluster] tls (0: none)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Member:
        """The member a key holds; the fields this version does not know are left out, so that a node of a later
        version may say more of itself while older ones still read it (a rolling upgrade has both)."""
        try:
            given = json.loads(text)
            member = cls(**{name: value for name, value in given.items() if name in MEMBER_FIELDS})
        except (ValueError, TypeError, AttributeError) as error:  # (AttributeError: JSON that is not an object)
            raise CoordinatorError(f"a member or leader key in etcd holds no member: {error}") from None
        if not (isinstance(member.node_id, str) and type(member.amqp_port) is int
                and type(member.replication_port) is int and isinstance(member.dir, str)
                and type(member.lost_leader) is int and type(member.management_port) is int
                and type(member.amqps_port) is int and type(member.standby) is bool
                and type(member.mqtt_port) is int and type(member.mqtt_tls_port) is int):
            raise CoordinatorError(f"a member or leader key in etcd holds a malformed member: {text!r:.200}")
        return member


MEMBER_FIELDS = frozenset(field.name for field in fields(Member))


@dataclass(frozen=True)
class Replica:
    """One copy of the data the ISR vouches for: a node's data dir, named by the identity made with it (a node that
    comes back with a new or wiped data dir is another replica, never in the ISR until it has caught up)."""

    node: str  # the node id
    dir: str  # the data dir's identity (cluster-state's "dir"), made once when the data dir was made
    acked: int = -1  # the highest sequence of ``epoch`` it had acked when the ISR was written (-1: none yet)
    # the leader epoch whose frames it held then: its cluster-state says at least this, unless the data dir was
    # rolled back (a restored snapshot keeps the identity, not what came after)
    epoch: int = 0


def find_copy(replicas: list[Replica], node: str, dir: str) -> Replica | None:
    """The replica of that node's data dir among ``replicas``, if any."""
    return next((replica for replica in replicas if replica.node == node and replica.dir == dir), None)


def isr_to_json(epoch: int, replicas: list[Replica]) -> str:
    return json.dumps({"epoch": epoch, "replicas": [asdict(replica) for replica in replicas]}, separators=(",", ":"))


def isr_from_json(text: str | bytes) -> list[Replica]:
    """The ISR key's replicas, or CoordinatorError naming what is wrong."""
    try:
        isr = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CoordinatorError(f"the ISR key in etcd is not JSON: {error}") from None
    entries = isr.get("replicas") if isinstance(isr, dict) else None
    if not isinstance(entries, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("node"), str) and isinstance(entry.get("dir"), str)
            and type(entry.get("acked", -1)) is int and type(entry.get("epoch", 0)) is int for entry in entries):
        raise CoordinatorError(f"the ISR key in etcd holds no list of replicas (node, dir, acked, epoch): "
                               f"{text!r:.200}")
    return [Replica(entry["node"], entry["dir"], entry.get("acked", -1), entry.get("epoch", 0)) for entry in entries]


class Leader(NamedTuple):
    """The leader key as read: who leads, and which leadership this is."""

    member: Member
    epoch: int  # the key's create_revision: etcd assigns it, and every new leadership gets a higher one


class Keys:
    """Where each thing lives under a cluster's prefix."""

    def __init__(self, prefix: str, root: str | None = None):
        prefix = prefix.rstrip("/")
        self.prefix = prefix
        # the group each vhost is recorded in: one key per vhost, its name after this, for the whole cluster (root:
        # the cluster's prefix, where a group's own is under it)
        self.vhosts = f"{(root or prefix).rstrip('/')}/vhosts/"
        self.leader = f"{prefix}/leader"
        self.isr = f"{prefix}/isr"
        self.members = f"{prefix}/members/"
        # every node that ever registered, its latest addresses, bound to no lease: the cluster's membership
        self.known = f"{prefix}/known/"
        self.secret = f"{prefix}/secret"
        self.preferred = f"{prefix}/preferred"
        # the nodes in maintenance (drained): one key per node, its id after this, for the whole cluster
        self.maintenance = f"{(root or prefix).rstrip('/')}/maintenance/"

    def member(self, node_id: str) -> str:
        return self.members + node_id

    def known_member(self, node_id: str) -> str:
        return self.known + node_id

    def setting(self, name: str) -> str:
        return f"{self.prefix}/settings/{name}"

    def vhost(self, name: str) -> str:
        return self.vhosts + name


def group_of(key: str, value: str) -> int:
    """A vhost's recorded group, as its key holds it; CoordinatorError for a value that is not one."""
    if not value.isdigit() or not value.isascii():
        raise CoordinatorError(f"{key} holds {value[:40]!r}, not a group number")
    return int(value)


def new_secret() -> str:
    return secrets.token_hex(32)


class Coordinator(Protocol):
    """One node's view of the cluster's coordination state. Every call is bounded in time: when etcd cannot be
    reached it raises CoordinatorUnavailable promptly (refresh() returns False instead, wait_leader_change() keeps
    trying until its timeout). Nothing runs in the background: the caller keeps the lease alive with refresh(). A
    group of one (cluster.walkover) has what it is asked: not the writes of the ISR, draining or forgetting a node,
    nor the record of the vhosts, which only a group other nodes follow asks for."""

    node_id: str
    lease_ttl: float  # seconds the lease lives without a keepalive
    followed: bool  # other nodes follow the group's leader (False: a group of one, cluster.walkover)

    @property
    def lease_alive(self) -> bool:
        """Whether the lease can still be proven alive: granted or renewed less than its TTL ago, counted from
        when the request was sent. A node that leads stops serving once this turns False."""

    async def start(self) -> None:
        """Connect and grant this node's lease."""

    async def refresh(self) -> bool:
        """One keepalive of the lease. False when the lease is gone (lease_alive turns False at once) or etcd did
        not answer within about lease_ttl/3 (lease_alive then lapses on its own unless a later refresh succeeds)."""

    async def register(self, member: Member) -> None:
        """Publish this node's addresses under members/, bound to the lease (gone when the lease goes), and under
        known/, bound to none. Raises LeaseExpired when the lease is gone."""

    async def members(self) -> dict[str, Member]:
        """The registered members by node id."""

    async def known(self) -> dict[str, Member]:
        """Every node that ever registered, running or not, by node id (as RabbitMQ lists its cluster's stopped
        nodes)."""

    async def campaign(self, leader: Member) -> int | None:
        """One attempt to become leader: create the leader key bound to the lease if there is none. The epoch
        when won, None when someone else leads. Raises LeaseExpired when the lease is gone."""

    async def leader(self) -> Leader | None:
        """The current leader and its epoch, None when nobody leads."""

    async def wait_leader_change(self, epoch: int | None, timeout: float) -> None:
        """Return once the leader key's epoch differs from epoch (the key deleted, or created anew; with None: once
        somebody leads), or when timeout seconds have passed. Rides out etcd being unreachable meanwhile."""

    async def replicas(self) -> list[Replica] | None:
        """The in-sync replica set; None when none was ever written (a fresh cluster)."""

    async def set_isr(self, replicas: list[Replica], epoch: int) -> bool:
        """Write the in-sync replica set, but only while this node holds the leader key of that epoch with its
        lease. False when it does not (stale: the caller stops leading)."""

    async def force_isr(self, replicas: list[Replica]) -> bool:
        """An operator's unclean election: write the ISR while nobody leads (False if somebody does)."""

    async def secret(self) -> str:
        """The cluster's shared replication secret, created by whichever node asks first."""

    async def preferred(self) -> str | None:
        """The node an operator asked to lead (None: whichever the election gives)."""

    async def prefer(self, node: str | None) -> None:
        """Ask for ``node`` to lead from now on (None: let the election decide again)."""

    async def drained(self) -> set[str]:
        """The nodes an operator put in maintenance (of the whole cluster): they lead no group until revived."""

    async def drain(self, node: str, on: bool) -> None:
        """Put ``node`` in maintenance (on) or take it out (revive)."""

    async def forget(self, node: str) -> None:
        """Take ``node`` off the group's membership (known/) for good, as RabbitMQ's forget_cluster_node: only while
        it is not registered (its lease gone: it is down) and not in the in-sync replica set, checked and done in
        one step. CoordinatorError says why not (NodeStillNeeded when it runs or is in sync)."""

    async def agree(self, name: str, proposal: str) -> str:
        """A setting every node must share (the workers a node runs): the value stored under ``name``, which is
        ``proposal`` if nobody stored one before."""

    async def record_vhost(self, vhost: str, group: int) -> int:
        """The group recorded for a vhost (for the whole cluster): ``group``, unless one was recorded before. (A group
        of one has its vhosts recorded by its node: broker.workers.placement.)"""

    async def forget_vhosts(self, vhosts: list[str]) -> None:
        """Take the vhosts' records off (deleted vhosts)."""

    async def vhost_groups(self, revision: int | None, timeout: float) -> tuple[dict[str, int], int]:
        """Every vhost's recorded group, and the revision they were read at: at once with None, else once a record
        changed after that revision, or timeout seconds passed."""

    async def resign(self) -> None:
        """Give up leadership: delete the leader key if this node's lease holds it."""

    async def close(self) -> None:
        """Revoke the lease (its keys go with it) and disconnect. Never raises for an unreachable etcd."""


class LeaseHolder:
    """What every coordinator keeps of its node: its keys, its id, its lease and until when it surely lives."""

    followed = True  # (Coordinator.followed)

    def __init__(self, prefix: str, node_id: str, lease_ttl: float, root: str | None = None) -> None:
        self.keys = Keys(prefix, root)
        self.node_id = node_id
        self.lease_ttl = lease_ttl
        self._lease_id = 0  # granted by start()
        # time.monotonic() until which the lease surely lives: the TTL etcd last granted, counted from the moment that
        # grant or keepalive was sent (etcd renewed it later than that); 0 before a grant and once lost
        self._proven_until = 0.0

    @property
    def lease_id(self) -> int:
        return self._lease_id

    @property
    def lease_alive(self) -> bool:
        return time.monotonic() < self._proven_until

    async def replicas(self) -> list[Replica] | None:
        raise NotImplementedError

    async def isr(self) -> list[str] | None:
        replicas = await self.replicas()
        return None if replicas is None else [replica.node for replica in replicas]
