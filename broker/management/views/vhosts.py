"""The management API: virtual hosts."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.management.views.connections import close_connections
from broker.management.views.permissions import topic_permissions_where
from broker.model.node import FULL_ACCESS
from broker.model.operations import shortstr_problem
from broker.model.turns import in_slices

if TYPE_CHECKING:
    from broker.connection.server import Server
    from broker.model.vhost import VirtualHost

routes = web.RouteTableDef()


def unacked_by_vhost(server: "Server") -> dict[str, int]:
    """Deliveries awaiting ack on the channels of each vhost's connections."""
    counts: dict[str, int] = {}
    for connection in server.connections:
        if connection.vhost is not None:
            unacked = sum(len(channel.unacked) for channel in connection.channels.values())
            counts[connection.vhost.name] = counts.get(connection.vhost.name, 0) + unacked
    return counts


def vhost_json(vhost: "VirtualHost", unacked: int) -> dict:
    """A vhost as RabbitMQ's /api/vhosts shows it (without the message rates)."""
    ready = sum(queue.ready_as_held() for queue in vhost.queues.values())  # (see overview.totals)
    return {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags),
            "default_queue_type": vhost.default_queue_type or "undefined",
            "metadata": {"description": vhost.description, "tags": list(vhost.tags)}, "tracing": False,
            "cluster_state": {http.node_name(): "running"},
            "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}


@routes.get("/api/vhosts")
async def list_vhosts(request: web.Request) -> web.Response:
    unacked = unacked_by_vhost(http.server_of(request))
    return await listing(request, http.sorted_by([vhost_json(vhost, unacked.get(vhost.name, 0))
                                                  for vhost in http.vhosts_for(request, "monitoring")]))


@routes.get("/api/vhosts/{vhost}")
async def get_vhost(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    vhost = http.named_vhost(request)
    return http.reply(vhost_json(vhost, unacked_by_vhost(http.server_of(request)).get(vhost.name, 0)))


@routes.put("/api/vhosts/{vhost}")
async def put_vhost(request: web.Request) -> web.Response:
    """Create a vhost, or set an existing one's description and tags (both optional, as RabbitMQ). As RabbitMQ,
    the user who creates a vhost gets full permissions in it."""
    http.require(request, "administrator")
    body = await http.json_body(request)
    description = http.string_field(body, "description", "")
    tags = http.tag_list(body.get("tags", []), "tags")
    default_queue_type = http.string_field(body, "default_queue_type")
    node = http.node_of(request)
    name = request.match_info["vhost"]
    if problem := shortstr_problem("vhost", name):  # connection.open could not name it
        raise http.bad_request(problem)
    if http.check_only(request):  # (the supervisor of several workers places the vhost once this is accepted)
        return http.no_content()
    await node.vhost_deleted(name)  # (one of that name being deleted is gone first)
    existed = name in node.vhosts
    node.add_vhost(name, description, tags, default_queue_type)
    if not existed:
        user = request[http.USER].name
        node.set_permissions(user, name, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)
    await http.on_disk(request)
    return http.created_or_updated(existed)


@routes.delete("/api/vhosts/{vhost}")
async def delete_vhost(request: web.Request) -> web.Response:
    """Delete a vhost with everything in it, and close its connections."""
    http.require(request, "administrator")
    vhost = http.named_vhost(request)
    if http.check_only(request):
        return http.no_content()
    steps = http.node_of(request).delete_vhost(vhost.name)
    next(steps)  # (the vhost leaves the node before its connections are told: none can open meanwhile)
    close_connections(http.server_of(request), f"vhost '{vhost.name}' is deleted",
                      lambda connection: connection.vhost is vhost)
    # (the rest a slice a loop turn; a client that leaves meanwhile does not stop it)
    await asyncio.shield(asyncio.ensure_future(in_slices(steps)))
    await http.on_disk(request)
    return http.no_content()


@routes.get("/api/vhosts/{vhost}/permissions")
async def vhost_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    name = http.named_vhost(request).name
    return await listing(request, http.sorted_by([permission.definition() for (vhost, _), permission in
                                                  http.node_of(request).permissions.items() if vhost == name],
                                                 "vhost", "user"), pageable=False)


@routes.get("/api/vhosts/{vhost}/topic-permissions")
async def vhost_topic_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    name = http.named_vhost(request).name
    return await listing(request, topic_permissions_where(request, vhost=name), pageable=False)
