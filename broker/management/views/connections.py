"""The management API: connections, channels and consumers (read, and connections closed by an operator)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from aiohttp import web

if TYPE_CHECKING:
    from broker.connection.connection import Connection
    from broker.connection.server import Server

routes = web.RouteTableDef()


def close_connections(server: "Server", reason: str, which: Callable[["Connection"], bool]) -> None:
    """Close every open connection which selects, with 320 CONNECTION_FORCED and reason (RabbitMQ's texts)."""
    for connection in list(server.connections):
        if which(connection):
            connection.close_by_operator(reason)
