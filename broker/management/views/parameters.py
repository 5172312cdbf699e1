"""The management API: runtime parameters of vhosts (RabbitMQ's /api/parameters; the shovel component's).

As RabbitMQ: read and changed by administrators and by policymakers with permissions in the parameter's vhost;
listings show the vhosts the user has permissions in. Each item is ``{"vhost", "component", "name", "value"}``,
the value as it was given (credentials in a shovel's URIs included, as RabbitMQ keeps them)."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.model.vhost import VirtualHost

routes = web.RouteTableDef()


def parameters_of(vhosts: list[VirtualHost], component: str | None = None) -> list[dict]:
    """The items of the vhosts' parameters (of one component, or all), by vhost, component and name."""
    return [{"vhost": vhost.name, "component": kind, "name": name, "value": value}
            for vhost in sorted(vhosts, key=lambda vhost: vhost.name)
            for (kind, name), value in sorted(vhost.parameters.items()) if component in (None, kind)]


def visible(request: web.Request) -> list[VirtualHost]:
    return http.vhosts_for(request, "administrator")


@routes.get("/api/parameters")
async def list_all(request: web.Request) -> web.Response:
    http.require_policymaker(request)
    return await listing(request, parameters_of(visible(request)), pageable=False)


@routes.get("/api/parameters/{component}")
async def list_component(request: web.Request) -> web.Response:
    http.require_policymaker(request)
    return await listing(request, parameters_of(visible(request), request.match_info["component"]),
                         pageable=False)


@routes.get("/api/parameters/{component}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    return await listing(request, parameters_of([vhost], request.match_info["component"]), pageable=False)


def parameter(vhost: VirtualHost, component: str, name: str) -> web.Response:
    """One parameter's item; 404 if there is none."""
    if (component, name) not in vhost.parameters:
        raise http.not_found()
    return http.reply({"vhost": vhost.name, "component": component, "name": name,
                       "value": vhost.parameters[(component, name)]})


@routes.get("/api/parameters/{component}/{vhost}/{name}")
async def get_parameter(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    return parameter(vhost, request.match_info["component"], request.match_info["name"])


@routes.put("/api/parameters/{component}/{vhost}/{name}")
async def put_parameter(request: web.Request) -> web.Response:
    """Set a parameter from its "value" (a shovel's definition), checked by its component: 400 with why not."""
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    body = await http.json_body(request)
    http.require_keys(body, ("value",))
    try:
        new = http.node_of(request).set_parameter(vhost.name, request.match_info["component"],
                                                  request.match_info["name"], body["value"], request[http.USER].name)
    except ValueError as error:
        raise http.bad_request(http.escape_html_tags(str(error))) from None
    await http.on_disk(request)
    return http.created_or_updated(not new)


@routes.delete("/api/parameters/{component}/{vhost}/{name}")
async def delete_parameter(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)
    http.require_policymaker(request, vhost.name)
    if (request.match_info["component"], request.match_info["name"]) not in vhost.parameters:
        raise http.not_found()
    http.node_of(request).clear_parameter(vhost.name, request.match_info["component"], request.match_info["name"])
    await http.on_disk(request)
    return http.no_content()
