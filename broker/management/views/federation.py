"""The management API: the federation links' status (RabbitMQ's rabbitmq_federation_management) and their restart.

Listings need the monitoring tag and show the vhosts the user has permissions in (every vhost for an
administrator); a restart needs the policymaker tag, with permissions in the vhost (RabbitMQ 4.3: 3.10 asked the
monitoring tag only)."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import listing

routes = web.RouteTableDef()


def entries(request: web.Request, vhost: str | None) -> list[dict]:
    node = http.node_name()
    return [{"node": node, **entry} for entry in http.server_of(request).federation.status(vhost)]


def down(links: list[dict]) -> list[dict]:
    """The links neither running nor starting."""
    return [link for link in links if link["status"] not in ("running", "starting")]


@routes.get("/api/federation-links")
async def list_all(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    seen = {vhost.name for vhost in http.vhosts_for(request, "administrator")}
    return await listing(request, [entry for entry in entries(request, None) if entry["vhost"] in seen],
                         pageable=False)


@routes.get("/api/federation-links/state/down")
@routes.get("/api/federation-links/state/down/")
async def list_all_down(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    seen = {vhost.name for vhost in http.vhosts_for(request, "administrator")}
    return await listing(request, down([entry for entry in entries(request, None) if entry["vhost"] in seen]),
                         pageable=False)


@routes.get("/api/federation-links/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    vhost = http.login_vhost_of(request)
    return await listing(request, entries(request, vhost.name), pageable=False)


@routes.get("/api/federation-links/{vhost}/state/down")
async def list_vhost_down(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    vhost = http.login_vhost_of(request)
    return await listing(request, down(entries(request, vhost.name)), pageable=False)


@routes.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart")
async def restart_link(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    if not http.server_of(request).federation.restart(vhost.name, request.match_info["id"]):
        raise http.not_found()
    return http.no_content()
