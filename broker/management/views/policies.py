"""The management API: policies and operator policies of vhosts.

As RabbitMQ: listings show the policies of the vhosts the user has permissions in; a policy itself is read and
changed by administrators and by policymakers with permissions in its vhost; operator policies only by
administrators."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.management import http
from broker.management.resources import listing
from broker.model.policy import PolicyError
from broker.model.turns import reapply_policies

if TYPE_CHECKING:
    from broker.model.policy import Policy
    from broker.model.vhost import VirtualHost

routes = web.RouteTableDef()

KINDS = {"policies": False, "operator-policies": True}  # path segment -> whether it names operator policies


def authorise_one(request: web.Request, operator: bool) -> None:
    """RabbitMQ's refusal unless the user may read and change one (operator) policy of the vhost in the path."""
    if operator:
        http.require(request, "administrator")
        return
    http.require_policymaker(request, request.match_info["vhost"])


async def policies_of(request: web.Request, vhosts: list["VirtualHost"]) -> web.Response:
    operator = KINDS[request.match_info["kind"]]
    return await listing(request, http.sorted_by([policy.export() for vhost in vhosts
                                                  for policy in vhost.policy_table(operator).values()], "priority"),
                         pageable=False)


def existing_policy(request: web.Request, operator: bool) -> "Policy":
    vhost = http.node_of(request).vhosts.get(request.match_info["vhost"])
    policy = vhost.policy_table(operator).get(request.match_info["name"]) if vhost is not None else None
    if policy is None:
        raise http.not_found()
    return policy


@routes.get("/api/{kind:policies|operator-policies}")
async def list_all(request: web.Request) -> web.Response:
    return await policies_of(request, http.vhosts_for(request, None))


@routes.get("/api/{kind:policies|operator-policies}/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    return await policies_of(request, [vhost] if http.has_permissions(request, vhost.name) else [])


@routes.get("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def get_policy(request: web.Request) -> web.Response:
    operator = KINDS[request.match_info["kind"]]
    authorise_one(request, operator)
    return http.reply(existing_policy(request, operator).export())


@routes.put("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def put_policy(request: web.Request) -> web.Response:
    """Set a policy from its pattern and definition (required), priority (0) and apply-to ("all")."""
    operator = KINDS[request.match_info["kind"]]
    authorise_one(request, operator)
    body = await http.json_body(request)
    http.require_keys(body, ("pattern", "definition"))
    vhost = http.node_of(request).vhosts.get(request.match_info["vhost"])
    if vhost is None:
        raise http.ApiError(404, "not_found", "vhost_not_found")
    name = request.match_info["name"]
    existed = name in vhost.policy_table(operator)
    try:
        vhost.set_policy(name, body["pattern"], body["definition"], body.get("priority", 0),
                         body.get("apply-to", "all"), operator, reapply=False)
    except PolicyError as error:
        raise http.bad_request(str(error) if operator else http.escape_html_tags(str(error))) from None
    await reapply_policies(vhost)
    await http.on_disk(request)
    return http.created_or_updated(existed)


@routes.delete("/api/{kind:policies|operator-policies}/{vhost}/{name}")
async def delete_policy(request: web.Request) -> web.Response:
    operator = KINDS[request.match_info["kind"]]
    authorise_one(request, operator)
    policy = existing_policy(request, operator)
    vhost = http.node_of(request).vhosts[policy.vhost]
    vhost.clear_policy(policy.name, operator, reapply=False)
    await reapply_policies(vhost)
    await http.on_disk(request)
    return http.no_content()

