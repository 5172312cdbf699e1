"""The management API: users, and who the caller is."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.management.views.connections import close_connections
from broker.management.views.permissions import topic_permissions_where
from broker.model.access import DEFAULT_HASHING

routes = web.RouteTableDef()


def user_of(request: web.Request):
    user = http.node_of(request).users.get(request.match_info["name"])
    if user is None:
        raise http.not_found()
    return user


@routes.get("/api/whoami")
async def whoami(request: web.Request) -> web.Response:
    user = request[http.USER]
    return http.reply({"name": user.name, "tags": list(user.tags)})


@routes.get("/api/users")
async def list_users(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await listing(request, http.sorted_by([user.definition() for user in http.node_of(request).users.values()]),
                         pageable=False)


@routes.get("/api/users/{name}")
async def get_user(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return http.reply(user_of(request).definition())


@routes.put("/api/users/{name}")
async def put_user(request: web.Request) -> web.Response:
    """Create or replace a user: "tags" is required (as RabbitMQ), with "password", or "password_hash" and
    "hashing_algorithm", or neither: then, as in RabbitMQ, the user cannot log in with a password (an existing
    user loses its password)."""
    http.require(request, "administrator")
    body = await http.json_body(request)
    if "tags" not in body:
        raise http.bad_request("tags_not_present")
    tags = http.tag_list(body["tags"], "tags")
    password = http.string_field(body, "password")
    password_hash = http.string_field(body, "password_hash", "")
    algorithm = http.string_field(body, "hashing_algorithm", DEFAULT_HASHING)
    node = http.node_of(request)
    name = request.match_info["name"]
    existed = name in node.users
    try:
        node.put_user(name, password, password_hash, algorithm, tags)
    except ValueError as error:
        raise http.bad_request(str(error)) from None
    await http.on_disk(request)
    return http.created_or_updated(existed)


@routes.delete("/api/users/{name}")
async def delete_user(request: web.Request) -> web.Response:
    """Delete a user with its permissions and close its connections."""
    http.require(request, "administrator")
    name = user_of(request).name
    http.node_of(request).delete_user(name)
    close_connections(http.server_of(request), f"user '{name}' is deleted", lambda c: c.user == name)
    await http.on_disk(request)
    return http.no_content()


@routes.get("/api/users/{name}/permissions")
async def user_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    name = user_of(request).name
    return await listing(request, http.sorted_by([permission.definition() for (_, user), permission in
                                                  http.node_of(request).permissions.items() if user == name],
                                                 "vhost", "user"), pageable=False)


@routes.get("/api/users/{name}/topic-permissions")
async def user_topic_permissions(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await listing(request, topic_permissions_where(request, user=user_of(request).name), pageable=False)
