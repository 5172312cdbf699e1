"""The management API: queues (list, show, declare, delete, purge, get messages)."""

import asyncio
import operator

from aiohttp import web

from broker.collector import unwalked
from broker.management import http, messages
from broker.management.resources import (
    actor_of, arguments_of, channel_error, consumer_json, find_queue, flag, named_listing,
    on_disk_or_undo, parse_bool, queue_json, readable_vhosts,
)
from broker.model import operations
from broker.model.remote import RemoteQueue
from broker.model.turns import deleted_in_slices
from broker.session.consumer import Consumer
from protocol.errors import AMQPError

routes = web.RouteTableDef()

# ackmode of a get -> whether the messages go back to the queue, and whether the ones that do not are rejected
# (dead-lettered) rather than acked
ACK_MODES = {
    "ack_requeue_true": (True, False), "reject_requeue_true": (True, True),
    "ack_requeue_false": (False, False), "reject_requeue_false": (False, True),
}


def _with_rates(request: web.Request, queue, data: dict) -> dict:
    """The queue's JSON with its message_stats (left out until the queue has been sampled, as RabbitMQ)."""
    stats = http.message_stats(request, request.app[http.RATES].queues.get(queue))
    if stats:
        data["message_stats"] = stats
    return data


@routes.get("/api/queues")
async def list_all(request: web.Request) -> web.Response:
    return await _listed(request, readable_vhosts(request))


@routes.get("/api/queues/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    return await _listed(request, [http.login_vhost_of(request)])


async def _listed(request: web.Request, vhosts: list) -> web.Response:
    """The queues of vhosts, each one's JSON made only where the listing needs it, sorted on a thread (which lets
    the event loop have the interpreter back every few milliseconds: sorting 100,000 queues took 35 ms)."""
    queues = await asyncio.to_thread(_each_by_name, [unwalked(list(vhost.queues.values())) for vhost in vhosts])
    return await named_listing(request, queues, _name_of,
                               lambda queue: _with_rates(request, queue, queue_json(queue.vhost, queue)))


@routes.get("/api/queues/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    data = _with_rates(request, queue, queue_json(vhost, queue))
    # (the consumers of this process's clients: those of another process's, at a queue here, that process lists)
    data["consumer_details"] = [consumer_json(vhost, queue, consumer) for consumer in queue.consumers
                                if isinstance(consumer, Consumer)]
    data.update(deliveries=[], incoming=[])  # rates per peer: Warren keeps no such statistics
    return http.reply(data)


@routes.put("/api/queues/{vhost}/{name}")
async def declare(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    body = await http.json_body(request)
    durable, auto_delete = parse_bool(body, "durable"), parse_bool(body, "auto_delete")
    queue, created = operations.declare_queue(actor_of(request, vhost), request.match_info["name"], False, durable,
                                              False, auto_delete, arguments_of(body))
    await on_disk_or_undo(request, (lambda: vhost.delete_queue(queue)) if created else None)
    return http.created_or_updated(not created)


@routes.delete("/api/queues/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    if_unused, if_empty = flag(request, "if-unused"), flag(request, "if-empty")
    if (if_unused or if_empty) and isinstance(queue, RemoteQueue):  # (its owner counts what it has, and where)
        queue.count_there()
        vhost.counted_there = None
        await http.on_disk(request)
    queue = operations.queue_to_delete(actor_of(request, vhost), queue.name, if_unused, if_empty)
    if queue is not None:
        await deleted_in_slices(vhost, queue)
    await http.on_disk(request)
    return http.no_content()


@routes.delete("/api/queues/{vhost}/{name}/contents")
async def purge(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    operations.purge(actor_of(request, vhost), queue.name)
    await http.on_disk(request)
    return http.no_content()


@routes.post("/api/queues/{vhost}/{name}/get")
async def get(request: web.Request) -> web.Response:
    """Take up to count messages from the head of the queue, as basic.get would, then ack, reject or requeue them
    (requeued ones go back to their places, flagged redelivered). When a message's properties cannot be decoded,
    every message taken goes back and the reply says so."""
    vhost = http.login_vhost_of(request)
    body = await http.json_body(request)
    count = _integer(messages.required(body, "count"))
    requeue, reject = _ack_mode(messages.required(body, "ackmode"))
    encoding = messages.required(body, "encoding")
    if encoding not in ("auto", "base64"):
        raise http.bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = _integer(body["truncate"]) if body.get("truncate") not in (None, "") else None
    try:
        queue = operations.readable_queue(actor_of(request, vhost), request.match_info["name"])
    except AMQPError as error:
        raise channel_error(error) from None
    taken, replies = [], []
    no_ack = not requeue and not reject  # RabbitMQ's ack_requeue_false gets with no_ack, the others with acks

    def reply(entry) -> None:
        taken.append(entry)
        replies.append(_message_json(queue, entry, encoding, truncate))

    try:
        await messages.take(queue, count, no_ack, reply)
    except AMQPError as error:
        _settle(queue, taken, True, False)
        raise _undecodable(error, len(taken)) from None
    _settle(queue, taken, requeue, reject)
    await http.on_disk(request)
    return http.reply(replies)


def _message_json(queue, entry, encoding: str, truncate: int | None) -> dict:
    """A message a get took, as its reply shows it; AMQPError when its properties cannot be decoded."""
    message = entry.message
    return {"payload_bytes": len(message.body), "redelivered": entry.redelivered, "exchange": message.exchange,
            "routing_key": message.routing_key, "message_count": queue.count_ready(),
            "properties": messages.properties_json(message.properties),
            **messages.payload_json(message.body, encoding, truncate)}


def _undecodable(error: AMQPError, position: int) -> http.ApiError:
    """A get stopped by a message whose properties do not decode: 500 as RabbitMQ's channel would fail it (541)."""
    return http.ApiError(500, "internal_error",
                         f"{error.text}: the properties of message {position} could not be decoded; the messages "
                         "taken are back in the queue")


_name_of = operator.attrgetter("name")


def _each_by_name(queues_of_each: list[list]) -> list:
    """The queues of each vhost (its list sorted in place) in RabbitMQ's listing order, one vhost after the other,
    in a list out of the collector's sight as theirs are (collector.unwalked)."""
    ordered = unwalked([])
    for queues in queues_of_each:
        queues.sort(key=_name_of)
        ordered += queues
    return ordered


def _settle(queue, taken: list, requeue: bool, reject: bool) -> None:
    """Messages a get took go back (marked delivered on disk, as a basic.get's), or are done with: acked, or
    rejected and dead-lettered."""
    if not taken or queue.deleted:  # (a queue deleted while a get waited for it has none to take back)
        return
    if requeue:
        queue.mark_delivered(taken)
    queue.settle(taken, True if requeue else False if reject else None, failed=reject)


def _ack_mode(mode) -> tuple[bool, bool]:
    if not isinstance(mode, str) or mode not in ACK_MODES:
        raise http.bad_request(f"Unsupported ackmode {mode!r}. Please use one of {', '.join(ACK_MODES)}.")
    return ACK_MODES[mode]


def _integer(value) -> int:
    """count and truncate: an integer, or a string of one (RabbitMQ reads both)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (number := http.integer_text(value)) is not None:
        return number
    raise http.ApiError(400, "bad_request", ["not_integer", value])
