"""Operator commands of a cluster, run beside a node with that node's config:

    python -m cluster force-leader --config node.toml

``force-leader`` is the unclean election: when no node holding one of the in-sync replicas' data dirs can come back
(every disk lost), it makes this node's data dir the only in-sync replica, so that this node campaigns and serves
what its data dir holds. Messages confirmed but not in that data dir are lost: the cluster refuses to do this on its
own. It is refused while a node leads.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from broker.config import ConfigError, load_config
from cluster.coordinator import CoordinatorError, Replica
from cluster.node import make_coordinator
from cluster.state import identity


async def force_leader(config) -> str:
    """Make this node's data dir the only in-sync replica; what was done, or CoordinatorError."""
    coordinator = make_coordinator(config)
    try:
        await coordinator.start()
        before = await coordinator.replicas() or []
        mine = Replica(config.cluster_node_id, identity(Path(config.data_dir)))
        if not await coordinator.force_isr([mine]):
            raise CoordinatorError("a node leads the cluster: an unclean election is refused while one does")
    finally:
        await coordinator.close()
    replaced = ", ".join(f"{replica.node} (data dir {replica.dir})" for replica in before) or "none"
    return (f"the in-sync replicas are now {mine.node} (data dir {mine.dir}) alone, instead of {replaced}: "
            f"{mine.node} campaigns and serves what its data dir holds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster", description="Operator commands of a Warren cluster")
    parser.add_argument("command", choices=["force-leader"],
                        help="force-leader: make this node's data dir the only in-sync replica (an unclean election)")
    parser.add_argument("--config", required=True, help="the config file of the node to make the leader")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, {})
    except ConfigError as error:
        print(f"python -m cluster: {error}", file=sys.stderr)
        return 2
    if not config.cluster_etcd_endpoints:
        print(f"python -m cluster: {args.config} has no [cluster] etcd_endpoints", file=sys.stderr)
        return 2
    try:
        print(asyncio.run(force_leader(config)))
    except CoordinatorError as error:
        print(f"python -m cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
