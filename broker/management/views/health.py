"""The management API: health checks, as RabbitMQ's /api/health/checks/... and /api/aliveness-test."""

from __future__ import annotations

import datetime

from aiohttp import web

from broker.connection.tls import expiring

from broker.management import http, messages
from broker.management.resources import actor_of, channel_error
from broker.model import operations
from protocol.errors import AMQPError

routes = web.RouteTableDef()

# How RabbitMQ's alarm checks name each resource whose alarm is on.
ALARM_RESOURCES = {"memory": "memory", "disk": "disk space"}
ALIVENESS_QUEUE = "aliveness-test"  # the queue RabbitMQ's aliveness test goes through
ALIVENESS_MESSAGE = {"properties": {}, "routing_key": ALIVENESS_QUEUE, "payload": "test_message",
                     "payload_encoding": "string"}  # what it publishes there, as a publish request's body
PROTOCOL_ALIASES = {"amqp": "amqp", "amqp091": "amqp", "amqp0-9-1": "amqp", "http": "http", "https": "https",
                    "amqps": "amqp/ssl", "amqp/ssl": "amqp/ssl"}


def ok(**details) -> web.Response:
    return http.reply({"status": "ok", **details})


def failed(reason: str, **details) -> web.Response:
    """A failed check: 503 with its reason, as RabbitMQ."""
    return http.reply({"status": "failed", "reason": reason, **details}, status=503)


def listeners(request: web.Request) -> dict[str, int]:
    """Protocol -> port of what this node listens on (RabbitMQ's protocol names)."""
    server = http.server_of(request)
    if request.app[http.FORWARDED]:  # on a worker's internal socket: the port is the supervisor's
        management_port = server.config.management_port
    else:
        management_port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
    found = {"amqp": server.port, "http" if not server.config.management_tls else "https": management_port}
    if server.tls_port is not None:
        found["amqp/ssl"] = server.tls_port
    if server.config.prometheus_port:  # rabbitmq_prometheus's listener, as RabbitMQ's checks count it
        found["http/prometheus"] = server.config.prometheus_port
    return found


def alarms(request: web.Request, reason: str) -> web.Response:
    """ok, or 503 listing the resources whose alarm is on."""
    active = sorted(http.server_of(request).alarms)
    if not active:
        return ok()
    return failed(reason, alarms=[{"resource": ALARM_RESOURCES[name], "node": http.node_name()} for name in active])


@routes.get("/api/health/checks/alarms")
async def cluster_alarms(request: web.Request) -> web.Response:
    return alarms(request, "There are alarms in effect in the cluster")


@routes.get("/api/health/checks/local-alarms")
async def local_alarms(request: web.Request) -> web.Response:
    return alarms(request, "There are alarms in effect on the node")


@routes.get("/api/health/checks/virtual-hosts")
async def virtual_hosts(request: web.Request) -> web.Response:
    return ok()  # every vhost of a Warren node runs in the broker's one process


@routes.get("/api/health/checks/node-is-quorum-critical")
@routes.get("/api/health/checks/node-is-mirror-sync-critical")
async def single_node(request: web.Request) -> web.Response:
    return ok(reason="single node cluster")


# RabbitMQ's units of the certificate-expiration check, in days
EXPIRY_UNITS = {"days": 1, "weeks": 7, "months": 30, "years": 365}


@routes.get("/api/health/checks/certificate-expiration/{within}/{unit}")
async def certificates(request: web.Request) -> web.Response:
    """503 listing the served certificates (the amqps listener's, and its CA file) that expire within the given
    time, as RabbitMQ's check."""
    within, unit = http.integer_text(request.match_info["within"]), request.match_info["unit"]
    if within is None:
        raise http.bad_request("Invalid expiration value.")
    if unit not in EXPIRY_UNITS:
        raise http.bad_request(f"Time unit not recognised. Supported units: {', '.join(EXPIRY_UNITS)}.")
    config = http.server_of(request).config
    files = [path for path in (config.tls_certfile, config.tls_cacertfile) if path]
    found = expiring(files, _days_from_now(within * EXPIRY_UNITS[unit]))
    if not found:
        return ok()
    return failed("Certificates expiring", expired=found)


def _days_from_now(days: int) -> datetime.timedelta:
    """days, kept within the dates a datetime holds (a longer period reaches past every certificate's expiry)."""
    now = datetime.datetime.now()
    latest, earliest = (datetime.datetime.max - now).days - 1, (datetime.datetime.min - now).days + 1
    return datetime.timedelta(days=min(max(days, earliest), latest))


@routes.get("/api/health/checks/port-listener/{port}")
async def port_listener(request: web.Request) -> web.Response:
    port = http.integer_text(request.match_info["port"])
    if port is None:
        raise http.bad_request("Invalid port")
    ports = sorted(set(listeners(request).values()), reverse=True)
    if port in ports:
        return ok(port=port)
    return failed("No active listener", missing=port, ports=ports)


@routes.get("/api/health/checks/protocol-listener/{protocol}")
async def protocol_listener(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"]
    protocol = PROTOCOL_ALIASES.get(asked.lower(), asked)
    if protocol in listeners(request):
        return ok(protocol=protocol)
    return failed("No active listener", missing=asked, protocols=sorted(listeners(request)))


@routes.get("/api/aliveness-test/{vhost}")
async def aliveness(request: web.Request) -> web.Response:
    """As RabbitMQ, acting as the user with the user's permissions: declare the queue aliveness-test in the vhost,
    publish a message to it and get (without ack) the message at its head. A refused step is reported as
    RabbitMQ's API reports a failed channel method."""
    vhost = http.login_vhost_of(request)
    actor = actor_of(request, vhost)
    try:
        operations.declare_queue(actor, ALIVENESS_QUEUE, False, False, False, False, {})
        routing_keys, message = messages.from_request(ALIVENESS_MESSAGE, "", request[http.USER].name)
        operations.publish(actor, "", routing_keys, message)
        queue = operations.readable_queue(actor, ALIVENESS_QUEUE)
    except AMQPError as error:
        raise channel_error(error) from None
    taken: list = []
    await messages.take(queue, 1, True, taken.append)
    if not taken:
        return failed("aliveness-test queue is empty")
    queue.forget(taken)
    return ok()


@routes.get("/api/healthchecks/node")
async def node_health(request: web.Request) -> web.Response:
    return ok()
