"""The management API: bindings (list, show, create, delete), and the bindings of one exchange or queue."""

import urllib.parse

from aiohttp import web

from broker.management import http
from broker.management.resources import (
    access_refused, actor_of, arguments_of, default_binding_json, exchange_name, explicit_binding_json, listing,
    on_disk_or_undo, properties_key, readable_vhosts, sorted_bindings, vhost_bindings,
)
from broker.model import operations

routes = web.RouteTableDef()

DESTINATION_KINDS = {"q": "queue", "e": "exchange"}  # the path letter of a binding's destination -> its kind


@routes.get("/api/bindings")
async def list_all(request: web.Request) -> web.Response:
    return await bindings_listing(request, (binding for vhost in readable_vhosts(request)
                                             for binding in vhost_bindings(vhost)))


@routes.get("/api/bindings/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return await bindings_listing(request, vhost_bindings(http.login_vhost_of(request)))


@routes.get("/api/exchanges/{vhost}/{name}/bindings/{direction:source|destination}")
async def of_exchange(request: web.Request) -> web.Response:
    """The bindings an exchange is the source of, or the destination of (none for a missing one, as RabbitMQ)."""
    vhost = _listed_vhost(request)
    exchange = None if vhost is None else vhost.exchanges.get(exchange_name(request))
    if exchange is None:
        return await bindings_listing(request, [])
    if request.match_info["direction"] == "destination":
        return await bindings_listing(request, (explicit_binding_json(vhost, binding)
                                                for binding in exchange.inbound))
    if exchange is vhost.default_exchange:
        return await bindings_listing(request, (default_binding_json(vhost, name) for name in vhost.queues))
    return await bindings_listing(request, (explicit_binding_json(vhost, binding)
                                            for binding in exchange.live_bindings()))


@routes.get("/api/queues/{vhost}/{name}/bindings")
async def of_queue(request: web.Request) -> web.Response:
    """A queue's bindings, its implicit one to the default exchange first (which RabbitMQ lists for any name)."""
    vhost = _listed_vhost(request)
    if vhost is None:
        return await bindings_listing(request, [])
    name = request.match_info["name"]
    queue = vhost.queues.get(name)
    return await bindings_listing(request, [default_binding_json(vhost, name),
                                            *(explicit_binding_json(vhost, binding)
                                              for binding in (queue.bindings if queue is not None else ()))])


@routes.get("/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}")
async def between(request: web.Request) -> web.Response:
    """The bindings from one exchange to one queue or exchange: none when either is missing, but for the default
    exchange's implicit one to a queue, which RabbitMQ lists for any name."""
    vhost = _listed_vhost(request)
    if vhost is None:
        return await bindings_listing(request, [])
    implicit = _implicitly_bound(request)
    return await bindings_listing(request, [*([] if implicit is None else [default_binding_json(vhost, implicit)]),
                                            *(explicit_binding_json(vhost, binding)
                                              for binding in _between(request, vhost))])


@routes.post("/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}")
async def create(request: web.Request) -> web.Response:
    """Bind, as queue.bind or exchange.bind would; 201 with the new binding's address (relative to this path)."""
    vhost = http.login_vhost_of(request)
    body = await http.json_body(request)
    routing_key, arguments = str(body.get("routing_key", "")), arguments_of(body)
    kind = DESTINATION_KINDS[request.match_info["kind"]]
    destination_name = (request.match_info["destination"] if kind == "queue"
                        else exchange_name(request, "destination"))
    source, destination, created = operations.bind(actor_of(request, vhost), exchange_name(request, "source"), kind,
                                                   destination_name, routing_key, arguments)
    await on_disk_or_undo(request, (lambda: vhost.unbind(source, destination, routing_key, arguments)) if created
                          else None)
    location = "/".join(urllib.parse.quote_plus(part, safe="")
                        for part in (request.match_info["destination"], properties_key(routing_key, arguments)))
    return web.Response(status=201, headers={"Location": location})


@routes.get("/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}/{props}")
async def show(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    implicit = [binding for binding in _implicit(request, vhost)
                if _same_key(binding["properties_key"], request.match_info["props"])]
    return http.reply(implicit[0] if implicit else explicit_binding_json(vhost, _named(request, vhost)))


@routes.delete("/api/bindings/{vhost}/e/{source}/{kind:q|e}/{destination}/{props}")
async def delete(request: web.Request) -> web.Response:
    """Unbind, as queue.unbind or exchange.unbind would."""
    vhost = http.login_vhost_of(request)
    if _implicit(request, vhost):
        raise access_refused()  # the default exchange's bindings are no one's to remove
    binding = _named(request, vhost)
    operations.unbind(actor_of(request, vhost), binding.source.name, DESTINATION_KINDS[request.match_info["kind"]],
                      binding.destination.name, binding.routing_key, binding.arguments)
    await http.on_disk(request)
    return http.no_content()


async def bindings_listing(request: web.Request, bindings) -> web.Response:
    """Bindings in RabbitMQ's order; RabbitMQ serves no pages of them."""
    return await listing(request, sorted_bindings(bindings), pageable=False)


def _listed_vhost(request: web.Request):
    """The path's vhost for a listing of some exchange's or queue's bindings; None where there is no such vhost
    (RabbitMQ lists no bindings there, to anyone, where the vhost's own listings answer 404)."""
    if request.match_info["vhost"] not in http.node_of(request).vhosts:
        return None
    return http.login_vhost_of(request)


def _implicitly_bound(request: web.Request) -> str | None:
    """The queue the path names when its source is the default exchange (the queue's implicit binding), else None."""
    if exchange_name(request, "source") or request.match_info["kind"] != "q":
        return None
    return request.match_info["destination"]


def _implicit(request: web.Request, vhost) -> list[dict]:
    """The default exchange's implicit binding to the path's queue, when the path names those two and it exists."""
    name = _implicitly_bound(request)
    if name is None or name not in vhost.queues:
        return []
    return [default_binding_json(vhost, name)]


def _between(request: web.Request, vhost) -> list:
    """The bindings from the path's source exchange to its destination."""
    source = vhost.exchanges.get(exchange_name(request, "source"))
    if request.match_info["kind"] == "q":
        destination = vhost.queues.get(request.match_info["destination"])
    else:
        destination = vhost.exchanges.get(exchange_name(request, "destination"))
    if source is None or destination is None:
        return []
    return [binding for binding in source.bindings.values() if binding.destination is destination]


def _named(request: web.Request, vhost):
    """The binding the path names by its properties key (404 when there is none)."""
    props = request.match_info["props"]
    for binding in _between(request, vhost):
        if _same_key(properties_key(binding.routing_key, binding.arguments), props):
            return binding
    raise http.not_found()


def _same_key(key: str, named: str) -> bool:
    """Whether a path segment names a binding's properties key: as listed (the quoted key, quoted again in the
    path) or as a client that quotes the key's own text sends it (rabbitmqadmin's properties_key=job.*)."""
    return urllib.parse.unquote_plus(key) == urllib.parse.unquote_plus(named)
