"""The management API: exchanges (list, show, declare, delete, publish)."""

from aiohttp import web

from broker.management import http, messages
from broker.management.resources import (
    actor_of, arguments_of, exchange_json, exchange_name, find_exchange, flag, named_listing, on_disk_or_undo,
    parse_bool, readable_vhosts,
)
from broker.model import operations
from broker.model.turns import deleted_in_slices
from protocol.errors import AMQPError

routes = web.RouteTableDef()


@routes.get("/api/exchanges")
async def list_all(request: web.Request) -> web.Response:
    return await _listed(request, readable_vhosts(request))


@routes.get("/api/exchanges/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return await _listed(request, [http.login_vhost_of(request)])


async def _listed(request: web.Request, vhosts: list) -> web.Response:
    """The exchanges of vhosts, each one's JSON made only where the listing needs it (a page made every one)."""
    return await named_listing(request, [(vhost, exchange) for vhost in vhosts for exchange in _by_name(vhost)],
                               lambda pair: pair[1].name, lambda pair: exchange_json(*pair))


@routes.get("/api/exchanges/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    data = exchange_json(vhost, find_exchange(vhost, exchange_name(request)))
    data.update(incoming=[], outgoing=[])  # publishing rates per peer: Warren keeps no such statistics
    return http.reply(data)


@routes.put("/api/exchanges/{vhost}/{name}")
async def declare(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    body = await http.json_body(request)
    kind = body.get("type", "direct")
    durable, auto_delete, internal = (parse_bool(body, key) for key in ("durable", "auto_delete", "internal"))
    exchange, created = operations.declare_exchange(actor_of(request, vhost), exchange_name(request), str(kind),
                                                    False, durable, auto_delete, internal, arguments_of(body))
    await on_disk_or_undo(request, (lambda: vhost.delete_exchange(exchange.name, if_unused=False)) if created
                          else None)
    return http.created_or_updated(not created)


@routes.delete("/api/exchanges/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    name = exchange_name(request)
    if name and name not in vhost.exchanges:
        raise http.not_found()
    exchange = operations.exchange_to_delete(actor_of(request, vhost), name, flag(request, "if-unused"))
    if exchange is not None:
        await deleted_in_slices(vhost, exchange)
    await http.on_disk(request)
    return http.no_content()


@routes.post("/api/exchanges/{vhost}/{name}/publish")
async def publish(request: web.Request) -> web.Response:
    """Publish one message through the exchange, as basic.publish would; {"routed": false} when no queue took it.
    A persistent message is on disk before the reply. What a channel would refuse is a 400 naming the AMQP error."""
    vhost = http.login_vhost_of(request)
    name = exchange_name(request)
    body = await http.json_body(request)
    routing_keys, message = messages.from_request(body, name, request[http.USER].name)
    try:
        # RabbitMQ's API publishes mandatory, on a channel in confirm mode, and counts it as such
        routed = operations.publish(actor_of(request, vhost), name, routing_keys, message, mandatory=True,
                                    confirm=True).routed
    except AMQPError as error:
        raise http.bad_request(f"{error.reply_code} {error.text}") from None
    if routed:
        await http.on_disk(request)
    return http.reply({"routed": routed})


def _by_name(vhost) -> list:
    """A vhost's exchanges in RabbitMQ's listing order."""
    return sorted(vhost.exchanges.values(), key=lambda exchange: exchange.name)
