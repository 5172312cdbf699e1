"""The HTTP listeners of the management API and of the Prometheus metrics, started beside the AMQP server in the same
event loop."""

from __future__ import annotations

import logging
import ssl
from typing import TYPE_CHECKING

from aiohttp import web

from broker.connection.server import StartupError, reason_of
from broker.management.app import make_app
from broker.management.prometheus import make_prometheus_app

if TYPE_CHECKING:
    from broker.connection.server import Server

log = logging.getLogger(__name__)


class ManagementServer:
    def __init__(self, runner: web.AppRunner, port: int):
        self.runner = runner  # the aiohttp application runner
        self.port = port  # the port it listens on (the configured one, or the one picked for 0)

    async def stop(self) -> None:
        """Stop listening and finish the requests under way."""
        await self.runner.cleanup()


async def start_management(server: "Server") -> ManagementServer:
    """Listen on the configured management host and port (StartupError when that fails)."""
    config = server.config
    tls = server.tls_context if config.management_tls else None  # HTTPS with the amqps listener's certificate
    return await _listen(make_app(server), config.management_host, config.management_port,
                         "management API" + (" (HTTPS)" if tls is not None else ""), tls)


async def start_prometheus(server: "Server") -> ManagementServer:
    """Listen on the configured Prometheus host and port (StartupError when that fails)."""
    config = server.config
    return await _listen(make_prometheus_app(server), config.prometheus_host, config.prometheus_port,
                         "Prometheus metrics")


async def _listen(app: web.Application, host: str, port: int, what: str,
                  tls: ssl.SSLContext | None = None) -> ManagementServer:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=tls)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise StartupError(f"cannot listen on {host}:{port} for the {what}: {reason_of(error)}") from error
    port = runner.addresses[0][1]
    log.info("%s listening on %s:%d", what, host, port)
    return ManagementServer(runner, port)
