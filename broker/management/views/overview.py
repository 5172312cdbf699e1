"""The management API: the overview of the node (versions, totals, listeners)."""

from __future__ import annotations

from aiohttp import web

from broker.management import http
from broker.management.views.health import listeners
from broker.management.views.nodes import RATES_MODE, exchange_types
from broker.model.definitions import RABBITMQ_VERSION

routes = web.RouteTableDef()

# The RabbitMQ release whose management API Warren answers as (tools look at these fields).


def totals(request: web.Request) -> tuple[dict, dict]:
    """Queue totals (messages) and object totals over the vhosts the user may see."""
    server = http.server_of(request)
    vhosts = http.vhosts_for(request, "monitoring")
    names = {vhost.name for vhost in vhosts}
    connections = [c for c in server.connections if c.vhost is not None and c.vhost.name in names]
    channels = [channel for connection in connections for channel in connection.channels.values()]
    # (as the queues hold them: count_ready() would first let each one's expired messages go, 256 a queue)
    ready = sum(queue.ready_as_held() for vhost in vhosts for queue in vhost.queues.values())
    unacked = sum(len(channel.unacked) for channel in channels)
    queue_totals = {"messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked}
    object_totals = {"connections": len(connections), "channels": len(channels),
                     "consumers": sum(len(channel.consumers) for channel in channels),
                     "exchanges": sum(len(vhost.exchanges) for vhost in vhosts),
                     "queues": sum(len(vhost.queues) for vhost in vhosts)}
    return queue_totals, object_totals


@routes.get("/api/overview")
async def overview(request: web.Request) -> web.Response:
    server = http.server_of(request)
    queue_totals, object_totals = totals(request)
    data = {
        "management_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": http.PRODUCT_NAME, "product_version": server.version, "rates_mode": RATES_MODE,
        "cluster_name": server.config.cluster_name, "exchange_types": exchange_types(), "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": http.message_stats(request, request.app[http.RATES].node), "queue_totals": queue_totals,
        "object_totals": object_totals, "statistics_db_event_queue": 0,
    }
    if "monitoring" in http.rights_of(request[http.USER]):
        data["node"] = http.node_name()
        config = server.config
        hosts = {"amqp": config.host, "amqp/ssl": config.host, "http": config.management_host,
                 "https": config.management_host, "http/prometheus": config.prometheus_host}
        data["listeners"] = [{"node": http.node_name(), "protocol": protocol, "ip_address": hosts[protocol],
                              "port": port} for protocol, port in listeners(request).items()]
    return http.reply(data)
