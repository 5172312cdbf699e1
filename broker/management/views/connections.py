"""The management API: connections, channels and consumers (read, and connections closed by an operator).

As RabbitMQ: monitoring users see every connection, channel and consumer, other users their own; the listings of
one vhost's connections and channels are for administrators and users with permissions there; a connection is
closed by an administrator or its own user."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from aiohttp import web

from broker.management import http
from broker.management.messages import json_value
from broker.management.resources import consumer_json, listing, named_listing
from protocol.constants import CONNECTION_FORCED, REPLY_NAMES
from protocol.errors import reply_text

if TYPE_CHECKING:
    from broker.connection.connection import Connection
    from broker.connection.server import Server
    from broker.model.vhost import VirtualHost
    from broker.session.channel import Channel

routes = web.RouteTableDef()

DEFAULT_CLOSE_REASON = "Closed via management plugin"  # RabbitMQ's reason when the DELETE gives no X-Reason


def close_connections(server: "Server", reason: str, which: Callable[["Connection"], bool]) -> None:
    """Close every open connection which selects, with 320 CONNECTION_FORCED and reason (RabbitMQ's texts)."""
    reason = _fitting(reason)
    for connection in list(server.connections):
        if which(connection):
            connection.close_by_operator(reason)


def _fitting(reason: str) -> str:
    """reason, cut as RabbitMQ cuts the reply text "CONNECTION_FORCED - reason" to fit AMQP's 255 bytes (252 and
    "..."); bytes of a header that are not UTF-8 become U+FFFD."""
    reason = reason.encode(errors="surrogateescape").decode(errors="replace")
    return reply_text(CONNECTION_FORCED, reason).removeprefix(f"{REPLY_NAMES[CONNECTION_FORCED]} - ")


# --- what the API shows ----------------------------------------------------------------------------------------
def open_connections(request: web.Request) -> list["Connection"]:
    """The connections past connection.open, by name, that the user may see."""
    user = request[http.USER]
    monitor = "monitoring" in http.rights_of(user)
    found = [connection for connection in http.server_of(request).connections
             if connection.vhost is not None and (monitor or connection.user == user.name)]
    return sorted(found, key=lambda connection: connection.name)


def connection_json(request: web.Request, connection: "Connection") -> dict:
    """A connection as RabbitMQ's /api/connections shows it (without the byte and Erlang process counters)."""
    local = connection.local
    data = {
        "name": connection.name, "node": http.node_name(), "vhost": connection.vhost.name,
        "user": connection.user, "user_who_performed_action": connection.user, "state": connection_state(connection),
        "type": "network", "protocol": connection.protocol,
        "ssl": connection.tls,
        "host": local[0] if local else None, "port": local[1] if local else None, **http.peer(connection),
        "channels": len(connection.channels), "channel_max": connection.channel_max,
        "frame_max": connection.frame_max, "timeout": connection.heartbeat, "connected_at": connection.connected_at,
        "client_properties": json_value(connection.client_properties),
    }
    provided = connection.client_properties.get("connection_name")
    if provided is not None:
        data["user_provided_name"] = json_value(provided)
    stats = http.message_stats(request, request.app[http.RATES].connections.get(connection))
    for key, value in (("recv_oct", connection.received_bytes), ("send_oct", connection.sent_bytes)):
        data[key] = value  # bytes so far, and their rate at the last sample
        data[f"{key}_details"] = stats.get(f"{key}_details", {"rate": 0.0})
    return data


def connection_state(connection: "Connection") -> str:
    if connection.transport is None or connection.transport.is_closing():
        return "closed"
    return "blocked" if connection.blocked else "running"


def channel_json(request: web.Request, channel: "Channel") -> dict:
    """A channel as RabbitMQ's /api/channels shows it (without rates)."""
    connection = channel.connection
    tx = channel.tx
    return {
        "name": http.channel_name(channel), "number": channel.number, "node": http.node_name(),
        "vhost": connection.vhost.name, "user": connection.user, "user_who_performed_action": connection.user,
        "state": "running", "confirm": channel.confirms is not None, "transactional": tx is not None,
        "consumer_count": len(channel.consumers), "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.unacked.global_prefetch,
        "messages_unacknowledged": len(channel.unacked),
        "messages_uncommitted": len(tx.publishes) if tx is not None else 0,
        "acks_uncommitted": sum(len(deliveries) for deliveries, *_ in tx.settles) if tx is not None else 0,
        "connection_details": {"name": connection.name, **http.peer(connection)},
        **_message_stats(request, channel),
    }


def _message_stats(request: web.Request, channel: "Channel") -> dict:
    """The channel's publish, deliver_get and ack totals and rates, once it has been sampled."""
    stats = http.message_stats(request, request.app[http.RATES].channels.get(channel))
    return {"message_stats": stats} if stats else {}


def consumers_json(channels: Iterable["Channel"]) -> list[dict]:
    return [consumer_json(channel.connection.vhost, consumer.queue, consumer)
            for channel in channels for consumer in channel.consumers.values()]


def channels_of(connections: Iterable["Connection"]) -> list["Channel"]:
    return [channel for connection in connections for channel in connection.channels.values()]


# --- lookups with RabbitMQ's refusals --------------------------------------------------------------------------
def connection_of(request: web.Request, may: str) -> "Connection":
    """The connection named in the path, if the user owns it or its tags grant may ("monitoring" to read,
    "administrator" to close); else RabbitMQ's 401 (for one that does not exist too), or 404 for those who may
    see every connection."""
    name = request.match_info["name"]
    found = next((c for c in http.server_of(request).connections
                  if c.vhost is not None and c.name == name), None)
    user = request[http.USER]
    if may not in http.rights_of(user) and (found is None or found.user != user.name):
        raise http.not_authorised("User not authorised to access object")
    if found is None:
        raise http.not_found()
    return found


def channel_of(request: web.Request) -> "Channel":
    name = request.match_info["name"]
    found = next((channel for channel in channels_of(http.server_of(request).connections)
                  if channel.connection.vhost is not None and http.channel_name(channel) == name), None)
    user = request[http.USER]
    if "monitoring" not in http.rights_of(user) and (found is None or found.connection.user != user.name):
        raise http.not_authorised("User not authorised to access object")
    if found is None:
        raise http.not_found()
    return found


def in_vhost(request: web.Request, vhost: "VirtualHost") -> list["Connection"]:
    return [connection for connection in open_connections(request) if connection.vhost is vhost]


# --- connections -----------------------------------------------------------------------------------------------
@routes.get("/api/connections")
async def list_connections(request: web.Request) -> web.Response:
    return await _connections_listed(request, open_connections(request))


@routes.get("/api/vhosts/{vhost}/connections")
async def vhost_connections(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)  # RabbitMQ: administrators, and users with permissions there
    return await _connections_listed(request, in_vhost(request, vhost))


async def _connections_listed(request: web.Request, connections: list["Connection"]) -> web.Response:
    """Each connection's JSON made only where the listing needs it (a page made every one)."""
    return await named_listing(request, connections, lambda connection: connection.name,
                               lambda connection: connection_json(request, connection))


@routes.get("/api/connections/{name}")
async def get_connection(request: web.Request) -> web.Response:
    return http.reply(connection_json(request, connection_of(request, "monitoring")))


@routes.delete("/api/connections/{name}")
async def close_connection(request: web.Request) -> web.Response:
    """Close a connection with 320 and the X-Reason header's text (RabbitMQ's default reason without one)."""
    connection = connection_of(request, "administrator")
    connection.close_by_operator(_fitting(request.headers.get("X-Reason") or DEFAULT_CLOSE_REASON))
    return http.no_content()


@routes.get("/api/connections/{name}/channels")
async def connection_channels(request: web.Request) -> web.Response:
    connection = connection_of(request, "monitoring")
    return http.reply([channel_json(request, channel) for channel in channels_of([connection])])


# --- channels --------------------------------------------------------------------------------------------------
@routes.get("/api/channels")
async def list_channels(request: web.Request) -> web.Response:
    return await _channels_listed(request, channels_of(open_connections(request)))


@routes.get("/api/vhosts/{vhost}/channels")
async def vhost_channels(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    return await _channels_listed(request, channels_of(in_vhost(request, vhost)))


async def _channels_listed(request: web.Request, channels: list["Channel"]) -> web.Response:
    """Each channel's JSON made only where the listing needs it."""
    return await named_listing(request, channels, http.channel_name, lambda channel: channel_json(request, channel))


@routes.get("/api/channels/{name}")
async def get_channel(request: web.Request) -> web.Response:
    channel = channel_of(request)
    return http.reply({**channel_json(request, channel), "consumer_details": consumers_json([channel]), "deliveries": [],
                       "publishes": []})


# --- consumers -------------------------------------------------------------------------------------------------
@routes.get("/api/consumers")
async def list_consumers(request: web.Request) -> web.Response:
    return await listing(request, consumers_json(channels_of(open_connections(request))), pageable=False)


@routes.get("/api/consumers/{vhost}")
async def vhost_consumers(request: web.Request) -> web.Response:
    vhost = http.named_vhost(request)  # no permission needed: the consumers shown are filtered by owner
    return await listing(request, consumers_json(channels_of(in_vhost(request, vhost))), pageable=False)
