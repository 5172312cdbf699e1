"""The management API: permissions of users in vhosts (administrators only, as RabbitMQ)."""

from __future__ import annotations

import re

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.model.access import ACCESS_KINDS
from broker.model.patterns import PatternError

routes = web.RouteTableDef()


def permission_of(request: web.Request):
    key = (request.match_info["vhost"], request.match_info["user"])
    permission = http.node_of(request).permissions.get(key)
    if permission is None:
        raise http.not_found()
    return permission


@routes.get("/api/permissions")
async def list_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    permissions = [permission.definition() for permission in http.node_of(request).permissions.values()]
    return await listing(request, http.sorted_by(permissions, "vhost", "user"), pageable=False)


@routes.get("/api/permissions/{vhost}/{user}")
async def get_permission(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return http.reply(permission_of(request).definition())


@routes.put("/api/permissions/{vhost}/{user}")
async def put_permission(request: web.Request) -> web.Response:
    """Set a user's configure, write and read patterns in a vhost (all three required, as RabbitMQ)."""
    http.require(request, "administrator")
    body = await http.json_body(request)
    http.require_keys(body, ACCESS_KINDS)
    patterns = [http.string_field(body, kind) for kind in ACCESS_KINDS]
    node = http.node_of(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    if vhost not in node.vhosts or user not in node.users:
        raise http.bad_request("vhost_or_user_not_found")
    existed = (vhost, user) in node.permissions
    try:
        node.set_permissions(user, vhost, *patterns)
    except re.error as error:
        raise http.bad_request(f"invalid regular expression '{error.pattern}': {error}") from None
    except PatternError as error:
        raise http.bad_request(str(error)) from None
    await http.on_disk(request)
    return http.created_or_updated(existed)


@routes.delete("/api/permissions/{vhost}/{user}")
async def delete_permission(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    permission = permission_of(request)
    http.node_of(request).clear_permissions(permission.user, permission.vhost)
    await http.on_disk(request)
    return http.no_content()
