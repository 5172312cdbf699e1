"""The management port of a cluster node that does not lead.

While it follows a leader it hears, it answers for the whole cluster, as each node of a RabbitMQ cluster does: the
console's files here, and every /api/ request forwarded to the leader's API, proven with the cluster's secret
(broker.management.forwarding), with the client's address; the leader checks the credentials and answers. The
Host and Origin are checked here, against this node's names. The leader's /api/nodes asks this node for its own
entry the same way, proven.

Otherwise (no leader known, or not heard yet, or none at all: a node starting, or a cluster that cannot elect
anyone) every request is answered 503 with a sentence telling why this node does not serve the API, so that an
operator's health check can tell such a node from one that is down. It asks for no credentials then, as that
sentence is all it reveals."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Callable

from aiohttp import web

from broker.management import guards, http
from broker.management.app import CONSOLE, console_page, unavailable
from broker.management.forwarding import LEADERS_GROUP, ApiClient, body_of, for_another_node, from_other_nodes
from broker.management.server import DEFAULT_MAX_CONNECTIONS, ManagementServer, listen

log = logging.getLogger(__name__)

UNKNOWN_STATE = "this node does not lead the cluster: the management API runs on the leader"  # when state() fails


@dataclass
class Forwarding:
    """How a node that follows answers for the cluster."""
    leader: Callable[[], tuple[str, int] | None]  # the leader's API while this node follows it and hears it
    client: ApiClient  # proves requests with the cluster's secret, speaks HTTPS where the nodes' APIs do
    entry: Callable[[], dict]  # this node's own entry in /api/nodes
    names: frozenset[str]  # the names a Host header may give for this node (guards.allowed_names)


async def start_standby(host: str, port: int, state: Callable[[], str], tls: ssl.SSLContext | None = None,
                        forwarding: Forwarding | None = None,
                        max_connections: int = DEFAULT_MAX_CONNECTIONS) -> ManagementServer:
    """Listen on host:port (over HTTPS with tls, holding max_connections connections at most) and answer for the
    cluster through ``forwarding`` while it names a leader, every request 503 with state() as the reason otherwise
    (StartupError when the port cannot be had)."""
    async def answer(request: web.Request) -> web.StreamResponse:
        """The leader's answer, or 503 with the node's state, in the health-check shape for /api/health/checks/
        paths; neither the credentials nor the body are read here (a request without credentials is answered as
        the leader would)."""
        leader = forwarding.leader() if forwarding is not None else None
        if forwarding is None or leader is None:
            return unavailable(request.path, told(state))
        refused = http.without_credentials(request)  # (no forward for a request that the leader could only refuse)
        if refused is not None:
            return refused
        return (await forwarding.client.ask_at(leader, LEADERS_GROUP, request, body_of(request))).response()

    if forwarding is None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", answer)
    else:
        app = web.Application(middlewares=[from_other_nodes(forwarding.client.secret, for_this_follower(forwarding)),
                                           guards.same_origin])
        app[guards.NAMES] = forwarding.names
        app.on_response_prepare.append(guards.add_security_headers)
        app.router.add_get("/", console_page)
        app.router.add_static("/console/", CONSOLE)
        app.router.add_route("*", r"/api/{path:[\s\S]*}", answer)  # names may hold line breaks
    return await listen(app, host, port, "standby management API" + (" (HTTPS)" if tls is not None else ""), tls,
                        max_connections)


def for_this_follower(forwarding: Forwarding):
    """The leader's /api/nodes asks for this node's entry, proven; any other request another node proved is for the
    leader, which this node is not (or no longer): 503."""
    async def answer(request: web.Request, group: int | str, handler) -> web.StreamResponse:
        return for_another_node(request, group, forwarding.entry) or http.error_response(
            503, "service_unavailable", "this node does not lead the cluster now")
    return answer


def told(state: Callable[[], str]) -> str:
    """state(), or UNKNOWN_STATE with one log line should it fail: the sentence is all this listener has to give."""
    try:
        return state()
    except Exception as error:
        log.error("cannot tell this node's state: %.200r", error)
        return UNKNOWN_STATE
