"""The management API: which node leads a vhost, an operator's choice of it, and a vhost or one of its queues moved
to another group (Warren's own).

Each worker slot of a node of workers is a replication group, and a vhost lives in one group (cluster.worker).
- ``.../leader``: moving a vhost's leadership moves its group's, with the other vhosts of that group, and no data:
  every node holds a copy of every group. (A cluster of one-process nodes has one group: moving one vhost's
  leadership moves the cluster's; a node outside a cluster leads every group itself.)
- ``.../group``: on a node of workers outside a cluster, the vhost's data moves to another worker's group: the
  worker that leads it checks the request, and the supervisor moves it (broker.workers.api, broker.workers.moving).
  A cluster's vhosts stay in the group recorded for them (broker.workers.placement).
- ``/api/queues/{vhost}/{name}/group``: the same for one durable queue of the vhost (a queue's owner is the group
  that keeps its messages and runs it: broker.crossing)."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import find_queue

routes = web.RouteTableDef()

NOT_HERE = ("a vhost's leader and group are chosen among the workers of a broker with several ([server] workers), or "
            "the nodes of a cluster; this broker runs one process of its own")


def leadership_of(request: web.Request):
    """The vhost must exist, and this broker be a worker of several, or lead a cluster or a group of one."""
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
        state = await leadership.state(request.match_info["vhost"])
    except RuntimeError as error:
        raise http.ApiError(503, "service_unavailable", str(error)) from None
    return http.reply({"vhost": request.match_info["vhost"], **state})


async def asked(request: web.Request, key: str):
    """An administrator's request about a vhost's leadership: the leadership, and the body, which holds ``key``."""
    http.require(request, "administrator")
    leadership = leadership_of(request)
    body = await http.json_body(request)
    http.require_keys(body, (key,))
    return leadership, body


@routes.put("/api/vhosts/{vhost}/leader")
async def pin_leader(request: web.Request) -> web.Response:
    leadership, body = await asked(request, "node")
    return await changed(leadership, request.match_info["vhost"], http.string_field(body, "node"))


@routes.delete("/api/vhosts/{vhost}/leader")
async def unpin_leader(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await changed(leadership_of(request), request.match_info["vhost"], None)


@routes.put("/api/vhosts/{vhost}/group")
async def move_to_group(request: web.Request) -> web.Response:
    """Checked here, by the worker that leads the vhost; moved by the supervisor once this answers 204."""
    leadership, group = await group_asked(request)
    try:
        leadership.check_move(request.match_info["vhost"], group)
    except ValueError as error:
        raise http.bad_request(str(error)) from None
    return web.Response(status=204)


@routes.put("/api/queues/{vhost}/{name}/group")
async def move_queue_to_group(request: web.Request) -> web.Response:
    """Checked here, by the worker that leads the queue's vhost; moved by the supervisor once this answers 204."""
    leadership, group = await group_asked(request)
    queue = find_queue(http.named_vhost(request), request.match_info["name"])
    try:
        leadership.check_queue_move(request.match_info["vhost"], queue, group)
    except ValueError as error:
        raise http.bad_request(str(error)) from None
    return web.Response(status=204)


async def group_asked(request: web.Request):
    """An administrator's request to move something to a group: the leadership, and the group's number."""
    leadership, body = await asked(request, "group")
    group = body["group"]
    if type(group) is not int:
        raise http.bad_request(f"group must be a number, got {group!r:.100}")
    return leadership, group


async def changed(leadership, vhost: str, node: str | None) -> web.Response:
    try:
        await leadership.pin(vhost, node)
    except ValueError as error:
        raise http.bad_request(str(error)) from None
    except RuntimeError as error:
        raise http.ApiError(503, "service_unavailable", str(error)) from None
    return web.Response(status=204)
