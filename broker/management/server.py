"""The HTTP listeners of the management API and of the Prometheus metrics, started beside the AMQP server in the same
event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker.connection.mqtt.websocket import make_web_mqtt_app
from broker.connection.peer_log import PeerLog
from broker.connection.server import StartupError, reason_of
from broker.management.app import make_app
from broker.management.listener import ConnectionSlots, GuardedRequestHandler
from broker.management.prometheus import make_prometheus_app

if TYPE_CHECKING:
    from broker.config import Config
    from broker.connection.server import Server

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # lines about requests that are not HTTP, so that no client can flood the log
DEFAULT_MAX_CONNECTIONS = 64  # connections a listener holds at most unless told
WEB_MQTT_CONNECTIONS = 10_000  # MQTT clients over WebSockets at once, at most


class ManagementServer:
    def __init__(self, runner: web.AppRunner, listener: asyncio.Server, port: int, what: str, slots: ConnectionSlots):
        self.runner = runner  # the aiohttp application runner
        self.listener = listener  # the listening socket's server, taken but not yet answering until serve()
        self.port = port  # the port it listens on (the configured one, or the one picked for 0)
        self.what = what  # what it serves, for the log ("management API", "Prometheus metrics")
        self.slots = slots  # how many connections it holds at most

    async def serve(self) -> None:
        """Start answering on the port take() took, and say so."""
        await self.listener.start_serving()
        host = self.listener.sockets[0].getsockname()[0]
        log.info("%s listening on %s:%d (%d connections at most)", self.what, host, self.port, self.slots.limit)

    async def stop(self) -> None:
        """Stop listening and finish the requests under way."""
        self.listener.close()
        await self.runner.cleanup()


class RequestErrorLog(logging.LoggerAdapter):
    """aiohttp's server log, where a request that is not HTTP (a probe, TLS sent to the plain port, a header line
    without a colon) takes one line about its peer instead of a traceback; an error of a view keeps its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})

    def log(self, level: int, msg: Any, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            super().log(level, msg, *args, exc_info=exc_info, **kwargs)
            return
        peer = str(args[0]) if args else "an unknown address"  # aiohttp's lines end "... from %s", request.remote
        reason = " ".join(exc_info.message.split())
        if level <= logging.DEBUG:  # aiohttp's level for non-HTTP bytes on a connection's first request
            log.debug("malformed HTTP request from %s: %.200s", peer, reason)
        else:
            peer_log.warning(peer, "malformed HTTP request from %s: %.200s", peer, reason)


async def start_management(server: "Server") -> ManagementServer:
    """Answer on the configured management host and port (StartupError when it cannot be had)."""
    return await _serving(take_management(server))


async def start_prometheus(server: "Server") -> ManagementServer:
    """Answer on the configured Prometheus host and port (StartupError when it cannot be had)."""
    return await _serving(take_prometheus(server))


async def _serving(taking) -> ManagementServer:
    """The listener taking makes, answering."""
    listener = await taking
    await listener.serve()
    return listener


async def take_management(server: "Server") -> ManagementServer:
    """Take the configured management host and port (StartupError when that fails); serve() answers on it."""
    config = server.config
    tls = server.tls_context if config.management_tls else None  # HTTPS with the amqps listener's certificate
    return await take(make_app(server), config.management_host, config.management_port,
                      "management API" + (" (HTTPS)" if tls is not None else ""), tls,
                      config.management_max_connections)


async def take_prometheus(server: "Server") -> ManagementServer:
    """Take the configured Prometheus host and port (StartupError when that fails); serve() answers on it."""
    config = server.config
    return await take(make_prometheus_app(server), config.prometheus_host, config.prometheus_port,
                      "Prometheus metrics", max_connections=config.prometheus_max_connections)


async def take_web_mqtt(config: "Config", accept: Callable[[], asyncio.Protocol],
                        sock: socket.socket | None = None) -> ManagementServer:
    """Take [mqtt] web_port (or answer on sock, a worker's copy of the node's) for MQTT over WebSockets, each
    WebSocket's stream read by what accept() makes (StartupError when that fails); serve() answers on it."""
    return await take(make_web_mqtt_app(accept, config.mqtt_max_packet_size), config.host, config.mqtt_web_port,
                      "MQTT over WebSockets", max_connections=WEB_MQTT_CONNECTIONS, sock=sock)


async def listen(app: web.Application, host: str, port: int, what: str, tls: ssl.SSLContext | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> ManagementServer:
    """Answer for app on host:port as take() describes."""
    return await _serving(take(app, host, port, what, tls, max_connections))


async def take(app: web.Application, host: str, port: int, what: str, tls: ssl.SSLContext | None = None,
               max_connections: int = DEFAULT_MAX_CONNECTIONS, sock: socket.socket | None = None) -> ManagementServer:
    """Take host:port for app (0 picks a free port; sock: a socket bound already), over HTTPS with tls, holding
    max_connections connections at most once it serves; StartupError naming what when the port cannot be had."""
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    slots = ConnectionSlots(max_connections)
    error_log = RequestErrorLog()

    def connection() -> GuardedRequestHandler:
        return GuardedRequestHandler(runner.server, slots, loop=loop, logger=error_log, access_log=None)

    loop = asyncio.get_running_loop()
    try:
        where: dict[str, Any] = {"sock": sock} if sock is not None else {"host": host, "port": port,
                                                                          "reuse_address": True}
        listener = await loop.create_server(connection, ssl=tls, start_serving=False, **where)
    except OSError as error:
        await runner.cleanup()
        raise StartupError(f"cannot listen on {host}:{port} for the {what}: {reason_of(error)}") from error
    return ManagementServer(runner, listener, listener.sockets[0].getsockname()[1], what, slots)
