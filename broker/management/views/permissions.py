"""The management API: permissions and topic permissions of users in vhosts (administrators only, as RabbitMQ)."""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.model.access import ACCESS_KINDS, READ, WRITE
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
    vhost, user = _vhost_and_user(request)
    existed = (vhost, user) in node.permissions
    with _refused_patterns():
        node.set_permissions(user, vhost, *patterns)
    await http.on_disk(request)
    return http.created_or_updated(existed)


def _vhost_and_user(request: web.Request) -> tuple[str, str]:
    """The vhost and user a PUT names, both of which must exist (RabbitMQ's 400 otherwise)."""
    node = http.node_of(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    if vhost not in node.vhosts or user not in node.users:
        raise http.bad_request("vhost_or_user_not_found")
    return vhost, user


@contextlib.contextmanager
def _refused_patterns() -> Iterator[None]:
    """A pattern that cannot be used is the client's 400, saying why."""
    try:
        yield
    except re.error as error:
        raise http.bad_request(f"invalid regular expression '{error.pattern}': {error}") from None
    except PatternError as error:
        raise http.bad_request(str(error)) from None


@routes.delete("/api/permissions/{vhost}/{user}")
async def delete_permission(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    permission = permission_of(request)
    http.node_of(request).clear_permissions(permission.user, permission.vhost)
    await http.on_disk(request)
    return http.no_content()


# --- topic permissions ----------------------------------------------------------------------------------------
def topic_permissions_where(request: web.Request, vhost: str | None = None, user: str | None = None) -> list[dict]:
    """The topic permissions of a vhost, of a user or of both (None: any), as RabbitMQ lists them."""
    return http.sorted_by([permission.definition()
                           for (held_in, held_by), held in http.node_of(request).topic_permissions.items()
                           if vhost in (None, held_in) and user in (None, held_by) for permission in held.values()],
                          "vhost", "user", "exchange")


@routes.get("/api/topic-permissions")
async def list_topic_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await listing(request, topic_permissions_where(request), pageable=False)


@routes.get("/api/topic-permissions/{vhost}/{user}")
async def get_topic_permissions(request: web.Request) -> web.Response:
    """The user's topic permissions in the vhost, a list (404 when it has none there, as RabbitMQ)."""
    http.require(request, "administrator")
    found = topic_permissions_where(request, request.match_info["vhost"], request.match_info["user"])
    if not found:
        raise http.not_found()
    return await listing(request, found, pageable=False)


@routes.put("/api/topic-permissions/{vhost}/{user}")
async def put_topic_permission(request: web.Request) -> web.Response:
    """Set a user's write and read patterns on one exchange of a vhost (exchange, write and read all required, as
    RabbitMQ); 201 when the user had no topic permission in the vhost yet, else 204, as RabbitMQ."""
    http.require(request, "administrator")
    body = await http.json_body(request)
    http.require_keys(body, ("exchange", WRITE, READ))
    exchange, write, read = (http.string_field(body, key) for key in ("exchange", WRITE, READ))
    node = http.node_of(request)
    vhost, user = _vhost_and_user(request)
    existed = (vhost, user) in node.topic_permissions
    with _refused_patterns():
        node.set_topic_permissions(user, vhost, exchange, write, read)
    await http.on_disk(request)
    return http.created_or_updated(existed)


@routes.delete("/api/topic-permissions/{vhost}/{user}")
async def delete_topic_permissions(request: web.Request) -> web.Response:
    """Clear the user's topic permissions in the vhost: all of them, as RabbitMQ's API, or with ?exchange= those on
    that exchange alone (as rabbitmqctl clear_topic_permissions with an exchange)."""
    http.require(request, "administrator")
    node = http.node_of(request)
    vhost, user = request.match_info["vhost"], request.match_info["user"]
    exchange = request.query.get("exchange")
    held = node.topic_permissions.get((vhost, user), {})
    if not held or (exchange is not None and exchange not in held):
        raise http.not_found()
    node.clear_topic_permissions(user, vhost, exchange)
    await http.on_disk(request)
    return http.no_content()
