"""A node's disk fails under confirmed publishing: a follower's fills up (ENOSPC) or dies (EIO), a leader's hangs.
Whatever the disk does, nothing confirmed is lost, the cluster serves on the other nodes, and a node whose disk is
back (or replaced) returns to the in-sync replicas.

Three nodes on 127.0.0.1 (tests/cluster/nodes.py, lease_ttl 2 s, ack_timeout 1 s, min_insync 2), each with its data
dir on a file system of its own (a tmpfs, tests/tmpfs.py, or an ext4 on a loop device, tests/loopfs.py; the test is
skipped, saying why, where it cannot mount them); a publisher runs throughout (tests/cluster/faults.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ContextManager

import pytest

from tests.cluster.faults import OLD_LEADER_LIMIT, STALL_LIMIT, Fault
from tests.cluster.nodes import Cluster, Node
from tests.cluster.test_failover import confirms_go_on_without, kill_publishers  # noqa: F401 (the autouse fixture)
from tests.loopfs import ext4, freeze, shut_down, thaw
from tests.tmpfs import fill, tmpfs

pytestmark = pytest.mark.slow

FAULT_SECONDS = 10.0  # how long a disk stays full or frozen
TMPFS_SIZE = "size=512m"  # room for what a node writes in a test, and a filler's worth of memory at most


class Disks:
    """A file system of its own under each node's data dir. The data dir is a directory of the file system reached
    through a link (where the node's data dir would be), so that a test can fill the rest of it (a RESET of a follower's copy empties its data dir) or
    point the link at a new disk."""

    def __init__(self, root: Path, make: Callable[[Path], ContextManager[Path]], stack: contextlib.ExitStack) -> None:
        self.root = root  # where the disks are mounted
        self.make = make  # mounts a new file system at a path for as long as the stack lasts
        self.stack = stack
        self.mounts: dict[str, Path] = {}  # each node's current disk, by name
        self._made = 0  # disks made so far (each gets a mount point of its own)

    def give(self, node: Node) -> Path:
        """A new disk for ``node``: its data dir now lives there (empty); its mount point."""
        self._made += 1
        mount = self.stack.enter_context(self.make(self.root / f"disk-{self._made}-{node.name}"))
        (mount / "data").mkdir()
        node.data_dir.unlink(missing_ok=True)
        node.data_dir.symlink_to(mount / "data")
        self.mounts[node.name] = mount
        return mount

    def thaw_all(self) -> None:
        for mount in self.mounts.values():
            thaw(mount)


@contextlib.contextmanager
def cluster_on(tmp_path: Path, etcd_endpoint: str, make: Callable[[Path], ContextManager[Path]]) \
        -> Iterator[tuple[Cluster, Disks]]:
    """A started cluster whose nodes each have a disk of their own made by ``make``; everything stopped, thawed and
    unmounted afterwards."""
    with contextlib.ExitStack() as stack:
        cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint)
        disks = Disks(tmp_path, make, stack)
        for node in cluster.nodes.values():
            disks.give(node)
        cluster.start()
        try:
            cluster.ready()
            yield cluster, disks
        except BaseException as error:
            if not isinstance(error, AssertionError):  # a Fault's failure has printed the logs already
                print(cluster.logs())
            raise
        finally:
            disks.thaw_all()  # a process writing to a frozen disk cannot even be killed
            cluster.stop()


def small_tmpfs(path: Path) -> ContextManager[Path]:
    return tmpfs(path, TMPFS_SIZE)


def test_a_follower_whose_disk_fills_leaves_the_isr_and_returns(tmp_path, etcd_endpoint):
    """The follower's writes fail with ENOSPC: confirms pause at most ack_timeout + 1 s, the ISR without it; once
    there is room again it catches up and is back in the ISR."""
    with cluster_on(tmp_path, etcd_endpoint, small_tmpfs) as (cluster, disks):
        case = Fault("a follower's disk full", cluster, tmp_path, FAULT_SECONDS)
        case.start(pinned=True)
        follower = case.followers[0]
        case.begin(lambda: fill(disks.mounts[follower.name]))
        case.expect("confirms go on without the follower",
                    lambda: confirms_go_on_without(cluster, case.publisher, follower, case.began_at))
        case.hold()
        case.end(lambda: (disks.mounts[follower.name] / "filler").unlink())
        case.finish(new_leader=False, stall_limit=STALL_LIMIT)


def test_a_follower_whose_disk_fails_leaves_the_isr_and_a_new_disk_rejoins(tmp_path, etcd_endpoint):
    """Every read and write of the follower's disk fails with EIO: confirms pause at most ack_timeout + 1 s, the ISR
    without it. The node restarted on a new, empty disk is a new replica: it takes a full copy and enters the ISR."""
    with cluster_on(tmp_path, etcd_endpoint, ext4) as (cluster, disks):
        case = Fault("a follower's disk fails", cluster, tmp_path, FAULT_SECONDS)
        case.start(pinned=True)
        follower = case.followers[0]
        case.begin(lambda: shut_down(disks.mounts[follower.name]))
        case.expect("confirms go on without the follower",
                    lambda: confirms_go_on_without(cluster, case.publisher, follower, case.began_at))
        case.hold()
        case.end(lambda: replace_disk(follower, disks))
        case.finish(new_leader=False, stall_limit=STALL_LIMIT)


def replace_disk(node: Node, disks: Disks) -> None:
    node.stop()
    disks.give(node)
    node.start()


def test_a_leader_whose_disk_hangs_is_replaced(tmp_path, etcd_endpoint):
    """The leader's file system is frozen: its writer stops finishing batches, so it stops renewing its lease and
    another node leads within lease_ttl + 3 s; it confirms nothing after the freeze. Thawed, it rejoins as a
    follower."""
    with cluster_on(tmp_path, etcd_endpoint, ext4) as (cluster, disks):
        case = Fault("the leader's disk hangs", cluster, tmp_path, FAULT_SECONDS)
        case.start()
        mount = disks.mounts[case.leader.name]
        case.begin(lambda: freeze(mount))
        case.watch_for_a_new_leader()
        case.hold()
        case.end(lambda: thaw(mount))
        case.finish(new_leader=True, old_leader_limit=OLD_LEADER_LIMIT)
