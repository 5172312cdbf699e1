"""The management API: the federation links' status (RabbitMQ's rabbitmq_federation_management) and their restart.

Listings need the monitoring tag and show the vhosts the user has permissions in (every vhost for an
administrator); a restart needs the policymaker tag, with permissions in the vhost (RabbitMQ 4.3: 3.10 asked the
monitoring tag only)."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import link_entries, listing

routes = web.RouteTableDef()


def links(request: web.Request, one_vhost: bool) -> list[dict]:
    return link_entries(request, http.server_of(request).federation.status, one_vhost)


def down(entries: list[dict]) -> list[dict]:
    """The links neither running nor starting."""
    return [link for link in entries if link["status"] not in ("running", "starting")]


@routes.get("/api/federation-links")
async def list_all(request: web.Request) -> web.Response:
    return await listing(request, links(request, False), pageable=False)


@routes.get("/api/federation-links/state/down")
@routes.get("/api/federation-links/state/down/")
async def list_all_down(request: web.Request) -> web.Response:
    return await listing(request, down(links(request, False)), pageable=False)


@routes.get("/api/federation-links/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return await listing(request, links(request, True), pageable=False)


@routes.get("/api/federation-links/{vhost}/state/down")
async def list_vhost_down(request: web.Request) -> web.Response:
    return await listing(request, down(links(request, True)), pageable=False)


@routes.delete("/api/federation-links/vhost/{vhost}/{id}/{node}/restart")
async def restart_link(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    if not http.server_of(request).federation.restart(vhost.name, request.match_info["id"]):
        raise http.not_found()
    return http.no_content()
