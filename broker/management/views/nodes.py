"""The management API: the node and its name (with several workers, each worker is a node: broker.workers.api; in a
cluster of one-process nodes, the leader's lists every node)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Collection

from aiohttp import web

from broker.connection.alarms.disk import free_bytes
from broker.connection.alarms.memory import resident_bytes
from broker.management import http
from broker.management.resources import listing
from broker.model.exchange import EXCHANGE_TYPES

if TYPE_CHECKING:
    from broker.connection.server import Server

routes = web.RouteTableDef()

RATES_MODE = "basic"  # message rates of the node and of each queue (management.rates), as RabbitMQ's default
# The descriptions RabbitMQ gives its exchange types and login mechanisms.
EXCHANGE_TYPE_DESCRIPTIONS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
    "x-delayed-message": "Delayed Message Exchange.",  # the community plugin's description
}
NOT_CLUSTERED = "{} is for a node of a cluster: this broker is not one"  # (what is asked)
AUTH_MECHANISMS = [
    {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": True},
    {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True},
]


def exchange_types() -> list[dict]:
    return [{"name": kind, "description": EXCHANGE_TYPE_DESCRIPTIONS.get(kind, ""), "enabled": True}
            for kind in sorted(EXCHANGE_TYPES)]


def open_files() -> int:
    """File descriptors this process has open (0 where /proc cannot tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def node_json(request: web.Request) -> dict:
    """The node as RabbitMQ's /api/nodes shows it: its resources, limits and alarms (no rates, no Erlang VM)."""
    server: "Server" = http.server_of(request)
    return node_entry(request.app[http.STARTED], server.data_dir, server.memory_alarm.limit, server.alarms,
                      len(server.connections), server.leadership is not None and server.leadership.being_drained)


def node_entry(started: float, data_dir: Path, memory_limit: int, alarms: Collection[str],
               sockets: int, being_drained: bool = False) -> dict:
    """This process's entry in /api/nodes, up since ``started`` (time.monotonic()); ``alarms``: those in force
    ("memory", "disk"); ``sockets``: the clients it serves; ``being_drained``: the node is in maintenance. (Also a
    clustered node's worker that follows its group's leader, and so runs no broker: cluster.worker.)"""
    file_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return {
        "name": http.node_name(), "type": "disc", "running": True, "partitions": [], "cluster_links": [],
        "os_pid": str(os.getpid()), "processors": os.cpu_count() or 1,
        "uptime": int((time.monotonic() - started) * 1000),
        "mem_used": resident_bytes(), "mem_limit": memory_limit,
        "mem_alarm": "memory" in alarms, "mem_calculation_strategy": "rss",
        "disk_free": free_bytes(data_dir) or 0, "disk_free_limit": 0, "disk_free_alarm": "disk" in alarms,
        "fd_used": open_files(), "fd_total": file_limit, "sockets_used": sockets,
        "sockets_total": file_limit, "rates_mode": RATES_MODE, "db_dir": str(data_dir),
        "exchange_types": exchange_types(), "auth_mechanisms": AUTH_MECHANISMS,
        "enabled_plugins": ["rabbitmq_management"], "being_drained": being_drained,
    }


def down_node(name: str) -> dict:
    """A node of the cluster that does not run now (its lease gone, or its API silent), as RabbitMQ lists a
    stopped node: its name, and what it is."""
    return {"name": name, "type": "disc", "running": False, "being_drained": False, "partitions": [],
            "cluster_links": []}


@routes.get("/api/nodes")
async def list_nodes(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    return await listing(request, [node_json(request)], pageable=False)


@routes.get("/api/nodes/{name}")
async def get_node(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    if request.match_info["name"] != http.node_name():
        raise http.not_found()
    return http.reply(node_json(request))


@routes.put("/api/nodes/{name}/maintenance")
@routes.delete("/api/nodes/{name}/maintenance")
async def maintenance(request: web.Request) -> web.Response:
    """A node of a cluster put in maintenance (PUT: ``warrenctl drain``) or revived (DELETE: ``warrenctl revive``):
    done by the node's supervisor (broker.workers.api) once a group's leader has checked the request here."""
    http.require(request, "administrator")
    if not http.check_only(request):
        raise http.bad_request(NOT_CLUSTERED.format("maintenance mode"))
    return web.Response(status=204)


@routes.delete("/api/nodes/{name}")
async def forget_node(request: web.Request) -> web.Response:
    """A node that left the cluster for good forgotten (``warrenctl forget_cluster_node``): done by the supervisor
    (broker.workers.api) once a group's leader has checked the request here."""
    http.require(request, "administrator")
    if not http.check_only(request):
        raise http.bad_request(NOT_CLUSTERED.format("forgetting a node"))
    return web.Response(status=204)


@routes.get("/api/cluster-name")
async def cluster_name(request: web.Request) -> web.Response:
    return http.reply({"name": http.server_of(request).config.cluster_name})
