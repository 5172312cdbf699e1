"""The management API: the shovels' status (RabbitMQ's rabbitmq_shovel_management), their restart and deletion.

Listings need the monitoring tag and show the vhosts the user has permissions in (every vhost for an
administrator); a delete or restart needs the policymaker tag (RabbitMQ 4.3), with permissions in the vhost."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import link_entries, listing
from broker.management.views.parameters import parameter
from broker.shovel.component import COMPONENT

routes = web.RouteTableDef()


@routes.get("/api/shovels")
async def list_all(request: web.Request) -> web.Response:
    return await listing(request, link_entries(request, http.server_of(request).shovels.status, False),
                         pageable=False)


@routes.get("/api/shovels/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return await listing(request, link_entries(request, http.server_of(request).shovels.status, True),
                         pageable=False)


@routes.get("/api/shovels/vhost/{vhost}/{name}")
async def get_shovel(request: web.Request) -> web.Response:
    """The shovel's parameter, as RabbitMQ answers here (not its status)."""
    http.require(request, "monitoring")
    return parameter(http.login_vhost_of(request), COMPONENT, request.match_info["name"])


@routes.delete("/api/shovels/vhost/{vhost}/{name}")
async def delete_shovel(request: web.Request) -> web.Response:
    """The shovel stopped and its parameter cleared; 204 whether or not there was one (as RabbitMQ)."""
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    if (COMPONENT, request.match_info["name"]) in vhost.parameters:
        http.node_of(request).clear_parameter(vhost.name, COMPONENT, request.match_info["name"])
        await http.on_disk(request)
    return http.no_content()


@routes.delete("/api/shovels/vhost/{vhost}/{name}/restart")
async def restart_shovel(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    if not http.server_of(request).shovels.restart(vhost.name, request.match_info["name"]):
        raise http.not_found()
    return http.no_content()
