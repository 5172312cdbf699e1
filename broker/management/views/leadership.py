"""The management API: which node leads a vhost, and an operator's choice of it (Warren's own: in a cluster whose
nodes run several workers, each worker slot is a replication group whose leaders spread over the nodes, and a
vhost lives in one group; cluster.worker). Moving a vhost's leadership moves its group's, with the other vhosts
of that group, and no data: every node holds a copy of every group."""

from __future__ import annotations

from aiohttp import web

from broker.management import http

routes = web.RouteTableDef()

NOT_HERE = ("a vhost's leadership moves between the nodes of a cluster whose nodes run several workers ([server] "
            "workers with [cluster]); this broker is not one")


def leadership_of(request: web.Request):
    """The vhost must exist, and this broker lead a group of such a cluster."""
    http.named_vhost(request)
    leadership = http.server_of(request).leadership
    if leadership is None:
        raise http.bad_request(NOT_HERE)
    return leadership


@routes.get("/api/vhosts/{vhost}/leader")
async def get_leader(request: web.Request) -> web.Response:
    http.require(request, "monitoring")
    leadership = leadership_of(request)
    try:
        state = await leadership.state()
    except RuntimeError as error:
        raise http.ApiError(503, "service_unavailable", str(error)) from None
    return http.reply({"vhost": request.match_info["vhost"], **state})


@routes.put("/api/vhosts/{vhost}/leader")
async def pin_leader(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    leadership = leadership_of(request)
    body = await http.json_body(request)
    http.require_keys(body, ("node",))
    node = http.string_field(body, "node")
    return await changed(leadership, node)


@routes.delete("/api/vhosts/{vhost}/leader")
async def unpin_leader(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await changed(leadership_of(request), None)


async def changed(leadership, node: str | None) -> web.Response:
    try:
        await leadership.pin(node)
    except ValueError as error:
        raise http.bad_request(str(error)) from None
    except RuntimeError as error:
        raise http.ApiError(503, "service_unavailable", str(error)) from None
    return web.Response(status=204)
