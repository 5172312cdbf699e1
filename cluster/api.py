"""The management APIs of a cluster of one-process nodes, answering as one, as each node of a RabbitMQ cluster does:
a follower's forwards every request to the leader's (broker.management.standby), proven with the cluster's secret;
the leader's believes those requests and lists every node in /api/nodes, each asked for its own entry
(broker.management.app's other_nodes), and has the node an operator names lead (PUT /api/vhosts/{vhost}/leader:
every vhost, as they all live in the cluster's one replication group). A cluster of worker processes does the same
through its supervisors (broker.workers.api)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from broker.connection.alarms.memory import memory_limit
from broker.management import guards
from broker.management.forwarding import NODE_ITSELF, ApiClient, other_nodes_context
from broker.management.standby import Forwarding
from broker.management.views.nodes import node_entry
from cluster.coordinator import CoordinatorError, Member

if TYPE_CHECKING:
    from cluster.node import ClusterNode


class ClusterApis:
    """What one node's API knows of the others."""

    def __init__(self, node: "ClusterNode") -> None:
        self.node = node
        self.client = ApiClient(lambda: node.secret, other_nodes_context(node.config))
        self.members: dict[str, Member] = {}  # the nodes registered in etcd, as this node last read them
        self.started = time.monotonic()  # when this node started: its uptime while it follows

    # --- on the leader (broker.management.forwarding.OtherNodes) ------------------------------------------------
    def secret(self) -> str:
        return self.node.secret

    async def entries(self, request: web.Request) -> list[dict]:
        others = [(member.amqp_host, member.management_port) for name, member in self.members.items()
                  if name != self.node.node and member.management_port]
        answers = await asyncio.gather(*(self.client.ask_at(address, NODE_ITSELF, request, path_qs="/api/nodes",
                                                            method="GET") for address in others))
        return [entry for answer in answers if answer.status == 200 for entry in answer.json()]

    # --- on the leader (broker.connection.server.Leadership) ---------------------------------------------------
    async def state(self, vhost: str) -> dict:
        try:
            pinned = await self.node.coordinator.preferred()
        except CoordinatorError as error:
            raise RuntimeError(f"etcd cannot be reached: {error}") from None
        return {"node": self.node.node, "pinned": pinned}

    async def pin(self, vhost: str, node: str | None) -> None:
        """(A node is named by its node_id, or by its name in /api/nodes: node_id@host.)"""
        try:
            await self.node.prefer(node.partition("@")[0] if node is not None else None)
        except CoordinatorError as error:
            raise RuntimeError(f"etcd cannot be reached: {error}") from None

    # --- on a follower ----------------------------------------------------------------------------------------
    def forwarding(self) -> Forwarding:
        return Forwarding(self.node.leader_api, self.client, self.entry, guards.allowed_names(self.node.config))

    def entry(self) -> dict:
        """This node's entry in /api/nodes while it follows (and so runs no broker)."""
        config = self.node.config
        return node_entry(self.started, Path(config.data_dir).absolute(),
                          memory_limit(config.memory_high_watermark, config.memory_limit), (), self.node.clients())
