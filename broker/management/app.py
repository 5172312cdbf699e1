"""The management API application: a 503 while the broker does not serve, authentication, RabbitMQ-shaped errors,
and the routes of every view."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from broker.connection.login_throttle import LoginThrottle
from broker.connection.peer_log import PeerLog
from broker.management import guards, http
from broker.management.forwarding import GROUP, NODE_ITSELF
from broker.management.rates import Rates
from broker.management.resources import api_error
from broker.management.views import (
    bindings, connections, definitions, exchanges, federation, health, leadership, nodes, overview, parameters,
    permissions, policies, queues, shovels, users, vhosts,
)

from protocol import node_proof
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.connection.server import Server

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # refused logins, a few lines per address at most
failed_logins = LoginThrottle()  # consecutive refused logins per address, to answer them more and more slowly

CONSOLE = Path(__file__).parent / "console"  # the web console's static files (no build step)

VIEWS = (overview, nodes, vhosts, leadership, users, permissions, policies, parameters, shovels, federation,
         exchanges, queues, bindings, connections, definitions, health)
HEALTH_CHECKS = "/api/health/checks/"  # the paths whose failures take RabbitMQ's health-check shape
NOT_SERVING = "the broker on this node is not serving: it is starting or stopping"  # the reason of a 503 meanwhile


def unavailable(path: str, reason: str) -> web.Response:
    """503 as RabbitMQ's API gives it: a failed check ({"status": "failed", "reason": ...}) for a health check,
    {"error": "service_unavailable", "reason": ...} for any other path."""
    if path.startswith(HEALTH_CHECKS):
        return health.failed(reason)
    return http.error_response(503, "service_unavailable", reason)


@web.middleware
async def while_serving(request: web.Request, handler):
    """Until the broker serves and once it stops (a cluster leader stepping down), /api/ answers 503: the views read
    listeners and a store that are not there then. The console's static files are still served, as they read nothing
    of the broker: a console already open shows the 503's reason instead of losing its page."""
    if request.path.startswith("/api/") and not http.server_of(request).serving:
        return unavailable(request.path, NOT_SERVING)
    return await handler(request)


@web.middleware
async def authenticated(request: web.Request, handler):
    """Every /api/ call needs HTTP basic credentials of a user with a management tag (as RabbitMQ's). Refused
    credentials are answered more and more slowly to an address that keeps sending them (as AMQP logins are)."""
    if request.path.startswith("/api/"):
        address = request.remote or ""
        forwarded = request.app[http.FORWARDED]  # the supervisor logs, counts and waits, once for the node
        try:
            request[http.USER] = http.authenticate(request)
        except http.LoginRefused as refusal:
            if forwarded:
                request[http.LOGIN] = "refused"
            else:
                peer_log.warning(address, "HTTP login refused from %s: %s", address, refusal.reason)
                await asyncio.sleep(failed_logins.refused(address, http.server_of(request).config.failed_login_delay))
            raise
        if forwarded:
            request[http.LOGIN] = "accepted"
        else:
            failed_logins.accepted(address)
    return await handler(request)


@web.middleware
async def rabbitmq_errors(request: web.Request, handler):
    """Errors as RabbitMQ's API gives them: a JSON body {"error": ..., "reason": ...} with the status code."""
    try:
        return await handler(request)
    except http.ApiError as error:
        return http.error_reply(request, error)
    except AMQPError as error:  # a model call refused what the request asked (a permission, a missing resource...)
        return api_error(error).response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        if error.status == 405:
            return web.Response(status=405)  # RabbitMQ answers a method a path does not take with no body
        reason = "Not Found" if error.status == 404 else error.reason
        return http.error_response(error.status, http.ERROR_NAMES.get(error.status, "error"), reason)


@web.middleware
async def forwarded_client(request: web.Request, handler):
    """On a worker's internal socket, whose one client is the supervisor's API (broker.workers.api), a request's
    client is the one the supervisor names (and a request another node forwarded ends its body with the HMAC whose
    key the supervisor gives); the answer says how its credentials fared. An ask for the worker's own entry in
    /api/nodes needs none: the supervisor has them checked by a worker that leads."""
    if request.headers.get(GROUP) == NODE_ITSELF and request.path == "/api/nodes":  # the supervisor's list of nodes
        return http.reply([nodes.node_json(request)])
    forwarded = request.clone(remote=request.headers.get(http.FORWARDED_CLIENT, ""))
    if http.BODY_KEY_HEADER in request.headers:  # (the supervisor sends a well-formed one: from the proof's key)
        forwarded[http.BODY_KEY] = node_proof.from_hex(request.headers[http.BODY_KEY_HEADER],
                                                       node_proof.PROOF_SIZE) or b""
    response = await handler(forwarded)
    if http.LOGIN in forwarded:
        response.headers[http.LOGIN_OUTCOME] = forwarded[http.LOGIN]
    return response


def make_app(server: "Server", forwarded: bool = False) -> web.Application:
    """The API of server; ``forwarded``: served on a worker's internal socket, behind the supervisor's."""
    config = server.config
    middlewares = [guards.same_origin, while_serving, rabbitmq_errors, authenticated, guards.json_bodies]
    if forwarded:
        middlewares.insert(0, forwarded_client)
    # (a body another node forwards ends with its HMAC: read whole, then checked and taken off: http.read_body)
    app = web.Application(middlewares=middlewares,
                          client_max_size=config.management_max_body_size + node_proof.PROOF_SIZE)
    app[http.SERVER] = server
    app[http.FORWARDED] = forwarded
    app[http.MAX_BODY_SIZE] = config.management_max_body_size
    app[guards.NAMES] = guards.allowed_names(config)
    app.on_response_prepare.append(guards.add_security_headers)
    app[http.STARTED] = time.monotonic()
    rates = app[http.RATES] = Rates(server, server.config.management_collect_statistics_interval)

    async def start_sampling(_app: web.Application) -> None:
        rates.start()

    async def stop_sampling(_app: web.Application) -> None:
        await rates.stop()

    app.on_startup.append(start_sampling)
    app.on_cleanup.append(stop_sampling)
    for view in VIEWS:
        app.add_routes(view.routes)
    app.router.add_get("/", console_page)
    app.router.add_static("/console/", CONSOLE)
    return app


async def console_page(request: web.Request) -> web.FileResponse:
    """The web console: one page of static files that calls this API with the user's credentials."""
    return web.FileResponse(CONSOLE / "index.html")
