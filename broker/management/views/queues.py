"""The management API: queues (list, show, declare, delete, purge, get messages)."""

from aiohttp import web

from broker.management import http, messages
from broker.management.resources import (
    UnackedCounts, arguments_of, check_permission, consumer_json, find_queue, flag, listing, on_disk_or_undo,
    parse_bool, queue_json, readable_vhosts,
)
from broker.model.vhost import OPERATOR_OWNER
from protocol.constants import ACCESS_REFUSED, NOT_FOUND
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
    unacked = UnackedCounts(http.server_of(request).connections)
    return listing(request, [_with_rates(request, queue, queue_json(vhost, queue, unacked))
                             for vhost in readable_vhosts(request) for queue in _by_name(vhost)])


@routes.get("/api/queues/{vhost}")
async def list_vhost(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    unacked = UnackedCounts(http.server_of(request).connections)
    return listing(request, [_with_rates(request, queue, queue_json(vhost, queue, unacked))
                             for queue in _by_name(vhost)])


@routes.get("/api/queues/{vhost}/{name}")
async def show(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    data = _with_rates(request, queue, queue_json(vhost, queue, UnackedCounts(http.server_of(request).connections)))
    data["consumer_details"] = [consumer_json(vhost, queue, consumer) for consumer in queue.consumers]
    data.update(deliveries=[], incoming=[])  # rates per peer: Warren keeps no such statistics
    return http.reply(data)


@routes.put("/api/queues/{vhost}/{name}")
async def declare(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    name = request.match_info["name"]
    body = await http.json_body(request)
    durable, auto_delete = parse_bool(body, "durable"), parse_bool(body, "auto_delete")
    check_permission(request, vhost, "queue", name, "configure")
    existed = name in vhost.queues
    queue = vhost.declare_queue(name, OPERATOR_OWNER, False, durable, False, auto_delete, arguments_of(body))
    await on_disk_or_undo(request, None if existed else lambda: vhost.delete_queue(queue))
    return http.created_or_updated(existed)


@routes.delete("/api/queues/{vhost}/{name}")
async def delete(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    check_permission(request, vhost, "queue", queue.name, "configure")
    if flag(request, "if-unused") and queue.consumers:
        raise http.bad_request(f"queue '{queue.name}' in vhost '{vhost.name}' in use")
    if flag(request, "if-empty") and queue.has_ready():
        raise http.bad_request(f"queue '{queue.name}' in vhost '{vhost.name}' not empty")
    vhost.delete_queue(queue)
    await http.on_disk(request)
    return http.no_content()


@routes.delete("/api/queues/{vhost}/{name}/contents")
async def purge(request: web.Request) -> web.Response:
    vhost = http.login_vhost_of(request)
    queue = find_queue(vhost, request.match_info["name"])
    check_permission(request, vhost, "queue", queue.name, "read")
    queue.purge()
    await http.on_disk(request)
    return http.no_content()


@routes.post("/api/queues/{vhost}/{name}/get")
async def get(request: web.Request) -> web.Response:
    """Take up to count messages from the head of the queue, as basic.get would, then ack, reject or requeue them
    (requeued ones go back to their places, flagged redelivered)."""
    vhost = http.login_vhost_of(request)
    body = await http.json_body(request)
    count = _integer(messages.required(body, "count"))
    requeue, reject = _ack_mode(messages.required(body, "ackmode"))
    encoding = messages.required(body, "encoding")
    if encoding not in ("auto", "base64"):
        raise http.bad_request("Unsupported encoding. Please use auto or base64.")
    truncate = _integer(body["truncate"]) if body.get("truncate") not in (None, "") else None
    name = request.match_info["name"]
    try:
        check_permission(request, vhost, "queue", name, "read")
        queue = vhost.get_queue(name, OPERATOR_OWNER)
    except AMQPError as error:
        raise _get_error(error) from None
    taken, replies = [], []
    while len(taken) != count:
        entry = queue.take()
        if entry is None:
            break
        taken.append(entry)
        message = entry.message
        replies.append({"payload_bytes": len(message.body), "redelivered": entry.redelivered,
                        "exchange": message.exchange, "routing_key": message.routing_key,
                        "message_count": queue.count_ready(),
                        "properties": messages.properties_json(message.properties),
                        **messages.payload_json(message.body, encoding, truncate)})
    _settle(queue, taken, requeue, reject)
    await http.on_disk(request)
    return http.reply(replies)


def _by_name(vhost) -> list:
    """A vhost's queues in RabbitMQ's listing order."""
    return sorted(vhost.queues.values(), key=lambda queue: queue.name)


def _settle(queue, taken: list, requeue: bool, reject: bool) -> None:
    """Messages a get took go back (marked delivered on disk, as a basic.get's), or are done with: acked, or
    rejected and dead-lettered."""
    if not taken:
        return
    if requeue:
        queue.mark_delivered(taken)
    queue.settle(taken, True if requeue else False if reject else None, failed=reject)


def _ack_mode(mode) -> tuple[bool, bool]:
    if mode not in ACK_MODES:
        raise http.bad_request(f"Unsupported ackmode {mode!r}. Please use one of {', '.join(ACK_MODES)}.")
    return ACK_MODES[mode]


def _integer(value) -> int:
    """count and truncate: an integer, or a string of one (RabbitMQ reads both)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise http.ApiError(400, "bad_request", ["not_integer", value])


def _get_error(error: AMQPError) -> http.ApiError:
    """A get's failure as RabbitMQ's API reports the failed basic.get: 404 or 401 with the AMQP reply text."""
    if error.reply_code == NOT_FOUND:
        return http.ApiError(404, "not_found", error.text)
    if error.reply_code == ACCESS_REFUSED:
        return http.ApiError(401, "not_authorised", error.text)
    return http.bad_request(f"{error.reply_code} {error.text}")
