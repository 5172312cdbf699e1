"""The management port of a cluster node that does not lead: every request is answered 503 with a sentence telling
why this node does not serve the API (and where the leader's is), so that an operator's health check can tell a
follower, or a node of a cluster that cannot elect anyone, from a node that is down. It asks for no credentials, as
that sentence is all it reveals."""

from __future__ import annotations

import logging
import ssl
from typing import Callable

from aiohttp import web

from broker.management.app import unavailable
from broker.management.server import ManagementServer, listen

log = logging.getLogger(__name__)

UNKNOWN_STATE = "this node does not lead the cluster: the management API runs on the leader"  # when state() fails


async def start_standby(host: str, port: int, state: Callable[[], str],
                        tls: ssl.SSLContext | None = None) -> ManagementServer:
    """Listen on host:port (over HTTPS with tls) and answer every request 503 with state() as the reason
    (StartupError when the port cannot be had)."""
    async def answer(request: web.Request) -> web.Response:
        """503 with the node's state, in the health-check shape for /api/health/checks/ paths; neither the
        credentials nor the body are read."""
        return unavailable(request.path, told(state))

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    return await listen(app, host, port, "standby management API" + (" (HTTPS)" if tls is not None else ""), tls)


def told(state: Callable[[], str]) -> str:
    """state(), or UNKNOWN_STATE with one log line should it fail: the sentence is all this listener has to give."""
    try:
        return state()
    except Exception as error:
        log.error("cannot tell this node's state: %.200r", error)
        return UNKNOWN_STATE
