"""Operator commands of a cluster, run beside a node with that node's config:

    python -m cluster force-leader --config node.toml [--group K]

``force-leader`` is the unclean election of one replication group (group 0, the only one of a cluster of
one-process nodes; with workers, group K is worker K's): when no node holding one of the group's in-sync replicas
can come back (every disk lost), it makes this node's copy of the group (worker K's data dir) the only in-sync
replica, so that this node campaigns and serves what it holds. Messages confirmed but not in that copy are lost:
the cluster refuses to do this on its own. It is refused while a node leads the group.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from broker.config import ConfigError, load_config
from broker.workers.placement import worker_data_dir
from cluster.coordinator import CoordinatorError, Replica
from cluster.node import make_coordinator
from cluster.state import identity


async def force_leader(config, group: int = 0) -> str:
    """Make this node's copy of the group the only in-sync replica; what was done, or CoordinatorError."""
    coordinator = make_coordinator(config, group)
    try:
        await coordinator.start()
        before = await coordinator.replicas() or []
        mine = Replica(config.cluster_node_id, identity(worker_data_dir(Path(config.data_dir), group)))
        if not await coordinator.force_isr([mine]):
            raise CoordinatorError(f"a node leads group {group}: an unclean election is refused while one does")
    finally:
        await coordinator.close()
    replaced = ", ".join(f"{replica.node} (data dir {replica.dir})" for replica in before) or "none"
    return (f"the in-sync replicas of group {group} are now {mine.node} (data dir {mine.dir}) alone, instead of "
            f"{replaced}: {mine.node} campaigns and serves what its copy holds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster", description="Operator commands of a Warren cluster")
    parser.add_argument("command", choices=["force-leader"],
                        help="force-leader: make this node's data dir the only in-sync replica (an unclean election)")
    parser.add_argument("--config", required=True, help="the config file of the node to make the leader")
    parser.add_argument("--group", type=int, default=0,
                        help="the replication group (with workers, worker K's; 0, the only one, without)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, {})
    except ConfigError as error:
        print(f"python -m cluster: {error}", file=sys.stderr)
        return 2
    if not config.cluster_etcd_endpoints:
        print(f"python -m cluster: {args.config} has no [cluster] etcd_endpoints", file=sys.stderr)
        return 2
    if not 0 <= args.group < config.workers:
        print(f"python -m cluster: group {args.group} is not one of {args.config}'s: its node runs {config.workers} "
              f"worker{'s' if config.workers > 1 else ''}, groups 0 to {config.workers - 1}", file=sys.stderr)
        return 2
    try:
        print(asyncio.run(force_leader(config, args.group)))
    except CoordinatorError as error:
        print(f"python -m cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
