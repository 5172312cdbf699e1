"""What the queue, exchange and binding views share: the JSON RabbitMQ's API gives for each, RabbitMQ's binding
properties keys, the user acting through the API, and model errors as the API reports them; and what the views of
links (shovels, federation) share: their status entries as the user may see them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import urllib.parse
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NamedTuple

from aiohttp import web

from broker.collector import unwalked
from broker.management import http
from broker.model.turns import in_slices
from broker.management.messages import field_table, json_value
from broker.model.access import ChannelAccess
from broker.model.operations import Actor
from broker.model.patterns import PatternError, compile_pattern
from broker.model.queue import Queue
from broker.model.stream import Stream
from broker.model.vhost import OPERATOR_OWNER
from protocol.constants import ACCESS_REFUSED, NOT_FOUND, REPLY_NAMES
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.exchange import Binding, Exchange
    from broker.model.vhost import VirtualHost

DEFAULT_EXCHANGE_ALIAS = "amq.default"  # the name the API gives the nameless default exchange in paths
QUEUE_MEMORY = 2048  # bytes a queue is taken to cost empty, for the memory estimate
ENTRY_MEMORY = 120  # bytes a queued message is taken to cost besides its body, for the memory estimate
COUNTED_ENTRIES = 10_000  # ready messages in memory a queue's counts walk at most (queue_counts)


# --- vhosts a user may read ---------------------------------------------------------------------------------
def link_entries(request: web.Request, status: Callable[[str | None], list[dict]], one_vhost: bool) -> list[dict]:
    """The status entries of links (status(vhost) of a component: all vhosts' for None), as RabbitMQ's shovel and
    federation plugins list them: the monitoring tag needed; the path's vhost's, which the user may see, or those of
    every vhost the user has permissions in (all for an administrator); each with this node's name."""
    http.require(request, "monitoring")
    if one_vhost:
        found = status(http.login_vhost_of(request).name)
    else:
        seen = {vhost.name for vhost in http.vhosts_for(request, "administrator")}
        found = [entry for entry in status(None) if entry["vhost"] in seen]
    node = http.node_name()
    return [{"node": node, **entry} for entry in found]


def readable_vhosts(request: web.Request) -> list["VirtualHost"]:
    """The vhosts whose queues, exchanges and bindings the user is shown (monitoring does not widen these)."""
    return http.vhosts_for(request, "administrator")


# --- names in paths --------------------------------------------------------------------------------------------
def exchange_name(request: web.Request, key: str = "name") -> str:
    """An exchange named in the path; amq.default is the default exchange."""
    name = request.match_info[key]
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


def find_exchange(vhost: "VirtualHost", name: str) -> "Exchange":
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        raise http.not_found()
    return exchange


def find_queue(vhost: "VirtualHost", name: str) -> Queue:
    queue = vhost.queues.get(name)
    if queue is None:
        raise http.not_found()
    return queue


# --- permissions and errors ------------------------------------------------------------------------------------
def actor_of(request: web.Request, vhost: "VirtualHost") -> Actor:
    """The request's user acting in vhost, as RabbitMQ's API acts on a channel of its own: with the user's AMQP
    permissions, owning no exclusive queue."""
    return Actor(vhost, ChannelAccess(http.node_of(request), request[http.USER].name, vhost.name), OPERATOR_OWNER)


def access_refused() -> http.ApiError:
    return http.ApiError(401, "not_authorised", "Access refused.")


def explanation(error: AMQPError) -> str:
    """An AMQP error's text without its "NAME - " prefix (the model repeats it in some texts, as RabbitMQ's AMQP
    replies do; its API shows none)."""
    prefix, text = f"{REPLY_NAMES[error.reply_code]} - ", error.text
    while text.startswith(prefix):
        text = text[len(prefix):]
    return text


def api_error(error: AMQPError) -> http.ApiError:
    """A model error as RabbitMQ's API reports a failed declare, delete or bind (the error middleware applies it to
    every AMQPError a view lets through): 404 and 401 for a missing or refused resource, 400 with the bare
    explanation for the rest."""
    if error.reply_code == NOT_FOUND:
        return http.ApiError(404, "not_found", explanation(error))
    if error.reply_code == ACCESS_REFUSED:
        return access_refused()
    return http.bad_request(explanation(error))


def channel_error(error: AMQPError) -> http.ApiError:
    """A method that failed on the channel RabbitMQ's API opens for a get or an aliveness test, as it reports one:
    404 or 401 with the AMQP reply text, else 400 with the reply code and text."""
    if error.reply_code == NOT_FOUND:
        return http.ApiError(404, "not_found", error.text)
    if error.reply_code == ACCESS_REFUSED:
        return http.ApiError(401, "not_authorised", error.text)
    return http.bad_request(f"{error.reply_code} {error.text}")


async def on_disk_or_undo(request: web.Request, undo: Callable[[], None] | None) -> None:
    """Wait for a change's records to be on disk; when they could not be written, take the change back (as the AMQP
    methods do) before the 500."""
    try:
        await http.on_disk(request)
    except http.ApiError:
        if undo is not None:
            undo()
        raise


def parse_bool(body: dict, key: str, default: bool = False) -> bool:
    """A boolean field of a request body, as RabbitMQ reads it (true/false or their strings)."""
    value = body.get(key, default)
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise http.ApiError(400, "bad_request", ["not_boolean", value])


def arguments_of(body: dict) -> dict:
    """The arguments table of a request body (RabbitMQ ignores one that is not an object)."""
    arguments = body.get("arguments")
    return field_table(arguments) if isinstance(arguments, dict) else {}


def flag(request: web.Request, name: str) -> bool:
    """A query flag such as if-unused=true."""
    return request.query.get(name) == "true"


# --- exchanges -------------------------------------------------------------------------------------------------
def exchange_json(vhost: "VirtualHost", exchange: "Exchange") -> dict:
    data = {**exchange.definition(), "vhost": vhost.name, "arguments": json_value(exchange.arguments)}
    if exchange.policy is not None:
        data["policy"] = exchange.policy.name
    if exchange.holds_delayed:
        data["messages_delayed"] = len(exchange.delayed)  # as the delayed message plugin reports it
    return data


# --- queues ----------------------------------------------------------------------------------------------------
class QueueCounts(NamedTuple):
    """A queue's messages as RabbitMQ counts them: ready (paged ones included), unacked, persistent, paged."""

    ready: int
    ready_bytes: int
    unacked: int
    unacked_bytes: int
    persistent: int
    persistent_bytes: int
    paged: int
    paged_bytes: int


def queue_counts(queue: Queue) -> QueueCounts:
    """The ready messages' bytes are counted as they come and go (Queue.ready_bytes). Which of those in memory are
    persistent is found by walking them, COUNTED_ENTRIES at most: a queue keeps no more in memory by default, but a
    priority queue keeps all of its own, and a queue takes back every delivery a closing channel had, and a walk of
    4 million held the event loop 0.6 s at each request; beyond that they are estimated from those walked. The
    paged ones have counters."""
    ready = queue.count_ready()
    if queue.queue_type == "stream":  # every message of a stream is on disk, and none is held in memory for it
        # (a stand-in of a stream another worker owns: as its owner last counted it)
        stored = queue.log.total_bytes if isinstance(queue, Stream) else queue.ready_bytes
        return QueueCounts(ready, stored, queue.unacked_count, queue.unacked_bytes, ready, stored, ready, stored)
    paging = queue.paging
    paged = paged_bytes = paged_persistent = paged_persistent_bytes = 0
    if paging is not None:
        paged, paged_bytes = paging.paged, paging.paged_bytes
        if queue.durable:
            paged_persistent, paged_persistent_bytes = (
                (paged, paged_bytes) if queue.quorum else (paging.paged_persistent, paging.paged_persistent_bytes))
    walked = persistent = persistent_bytes = 0
    for entry in islice(queue.entries, COUNTED_ENTRIES):
        walked += 1
        size = len(entry.message.body)
        if queue.durable and (entry.message.persistent or queue.quorum):
            persistent += 1
            persistent_bytes += size
    in_memory = ready - paged
    if walked and walked < in_memory:  # (estimated, as the walked ones)
        persistent, persistent_bytes = (round(figure * in_memory / walked) for figure in (persistent, persistent_bytes))
    return QueueCounts(ready, queue.ready_bytes, queue.unacked_count, queue.unacked_bytes,
                       persistent + paged_persistent, persistent_bytes + paged_persistent_bytes, paged, paged_bytes)


def queue_json(vhost: "VirtualHost", queue: Queue) -> dict:
    """A queue as RabbitMQ's /api/queues lists it (without the rates and Erlang process details)."""
    ready, ready_bytes, unacked_count, unacked_bytes, persistent, persistent_bytes, paged, paged_bytes = (
        queue_counts(queue))
    exclusive_consumer = next((consumer.tag for consumer in queue.consumers if consumer.exclusive), None)
    return {
        "name": queue.name, "vhost": vhost.name, "durable": queue.durable, "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None, "arguments": json_value(queue.arguments),
        "node": http.owner_name(queue.owner), "state": "running",
        "type": queue.queue_type,
        "messages": ready + unacked_count + queue.count_retrying(), "messages_ready": ready,
        "messages_unacknowledged": unacked_count,
        "messages_ram": ready - paged + unacked_count, "messages_ready_ram": ready - paged,
        "messages_unacknowledged_ram": unacked_count, "messages_persistent": persistent, "messages_paged_out": paged,
        "message_bytes": ready_bytes + unacked_bytes, "message_bytes_ready": ready_bytes,
        "message_bytes_unacknowledged": unacked_bytes, "message_bytes_ram": ready_bytes - paged_bytes + unacked_bytes,
        "message_bytes_persistent": persistent_bytes, "message_bytes_paged_out": paged_bytes,
        "consumers": len(queue.consumers), "exclusive_consumer_tag": exclusive_consumer,
        "single_active_consumer_tag": None, "head_message_timestamp": None,
        "memory": (QUEUE_MEMORY + ENTRY_MEMORY * (ready - paged + unacked_count)
                   + ready_bytes - paged_bytes + unacked_bytes),
        "policy": _name_of(queue.policy), "operator_policy": _name_of(queue.operator_policy),
        "effective_policy_definition": queue.effective_policy_definition(),
        **_redelivery_json(queue),
    }


def _redelivery_json(queue: Queue) -> dict:
    """RabbitMQ 4.3's quorum-queue keys for delivery limits and delayed retry (Warren has them on every queue),
    and a quorum queue's replica keys (its one node)."""
    retry = queue.delayed_retry
    data = {"delivery_limit": "unlimited" if queue.delivery_limit is None else queue.delivery_limit,
            "delayed_retry": "disabled" if retry is None else f"{retry.kind} (min: {retry.min_ms}ms, max: "
                                                              f"{retry.max_ms}ms)",
            "messages_delayed": queue.count_retrying()}
    if queue.quorum or queue.queue_type == "stream":
        data.update({"leader": http.node_name(), "members": [http.node_name()], "online": [http.node_name()]})
    if queue.queue_type == "stream":  # the offsets a consumer can read: the oldest retention kept, the newest
        log = queue.log
        data.update({"first_offset": log.first_offset, "committed_offset": log.next_offset - 1,
                     "segments": len(log.segments)})
    return data


def _name_of(policy) -> str | None:
    return policy.name if policy is not None else None


def consumer_json(vhost: "VirtualHost", queue: Queue, consumer) -> dict:
    """A consumer as a queue's consumer_details list it."""
    channel = consumer.channel
    connection = channel.connection
    active = not queue.single_active or consumer is queue.current_active_consumer()
    status = "up" if not queue.single_active else "single_active" if active else "waiting"  # RabbitMQ's values
    return {
        "consumer_tag": consumer.tag, "exclusive": consumer.exclusive, "ack_required": not consumer.no_ack,
        "prefetch_count": consumer.prefetch, "arguments": json_value(consumer.arguments), "active": active,
        "activity_status": status, "queue": {"name": queue.name, "vhost": vhost.name},
        "channel_details": {"name": http.channel_name(channel), "number": channel.number,
                            "connection_name": connection.name, **http.peer(connection),
                            "user": connection.user, "node": http.node_name()},
    }


# --- bindings --------------------------------------------------------------------------------------------------
def properties_key(routing_key: str, arguments: dict) -> str:
    """RabbitMQ's name of a binding among those between the same ends: "~" for an empty key without arguments,
    else the quoted routing key, followed by "~" and a hash of the arguments when there are some."""
    if not routing_key and not arguments:
        return "~"
    key = _quoted(routing_key)
    if not arguments:
        return key
    return f"{key}~{_quoted(_arguments_hash(arguments))}"


def _quoted(text: str) -> str:
    return urllib.parse.quote_plus(text, safe="").replace("~", "%7E")


def _arguments_hash(arguments: dict) -> str:
    """Six characters naming a binding's arguments (RabbitMQ hashes them to 32 bits and base64url-encodes)."""
    canonical = repr(sorted(arguments.items(), key=lambda item: item[0])).encode()
    return base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()[:4]).rstrip(b"=").decode()


def binding_json(vhost: "VirtualHost", source: str, destination: str, destination_type: str, routing_key: str,
                 arguments: dict) -> dict:
    return {"source": source, "vhost": vhost.name, "destination": destination,
            "destination_type": destination_type, "routing_key": routing_key, "arguments": json_value(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def explicit_binding_json(vhost: "VirtualHost", binding: "Binding") -> dict:
    return binding_json(vhost, binding.source.name, binding.destination.name, binding.destination_type,
                        binding.routing_key, binding.arguments)


def default_binding_json(vhost: "VirtualHost", queue_name: str) -> dict:
    """The implicit binding of every queue to the default exchange, by its own name."""
    return binding_json(vhost, "", queue_name, "queue", queue_name, {})


def sorted_bindings(bindings: Iterable[dict]) -> list[dict]:
    """In RabbitMQ's order: vhost, source, destination, routing key."""
    return sorted(bindings, key=lambda binding: (binding["vhost"], binding["source"], binding["destination"],
                                                 binding["routing_key"], binding["properties_key"]))


def vhost_bindings(vhost: "VirtualHost") -> list[dict]:
    """Every binding of a vhost, the default exchange's implicit ones included."""
    bindings = [default_binding_json(vhost, name) for name in vhost.queues]
    for exchange in vhost.exchanges.values():
        bindings.extend(explicit_binding_json(vhost, binding) for binding in exchange.live_bindings())
    return bindings


# --- pagination ------------------------------------------------------------------------------------------------
DEFAULT_PAGE_SIZE = 100  # RabbitMQ's page size when a page is asked for without one
MAX_PAGE_SIZE = 500  # the largest page RabbitMQ serves


async def listing(request: web.Request, items: list[dict], pageable: bool = True) -> web.Response:
    """A list reply, with only the fields the columns query parameter names (dotted for nested ones) when it is
    given. With a page parameter, a pageable listing is RabbitMQ's page of it instead: the items whose name
    contains the name parameter (or matches it as a regex with use_regex=true), both case-insensitively, page_size
    at a time."""
    if "columns" in request.query:
        await in_slices(_cut(items, request.query["columns"].split(",")))  # (100,000 took 0.07 s at once)
    if not pageable or "page" not in request.query:
        return http.reply_in_slices(request, items)
    page, page_size = _pagination(request.query)
    chosen = await _chosen(request, items, _name_field)
    return _page(chosen, page, page_size, len(items), list)


def _cut(items: list[dict], columns: list[str]) -> Iterator[None]:
    """Each item cut to its columns, in place (the whole ones let go as it goes), a step each."""
    for index, item in enumerate(items):
        items[index] = columns_of(item, columns)
        yield None


def _name_field(item: dict) -> str:
    return item.get("name", "")


def _no_name(item: object) -> str:
    return ""


async def named_listing(request: web.Request, items: list, name_of: Callable[[Any], str],
                        make: Callable[[Any], dict]) -> web.Response:
    """listing() of the objects items holds (in listing order; name_of gives the name a filter reads), each one's
    JSON made by make() only where needed: a page makes its own items alone, once the names are filtered, and a
    whole listing makes them as it is written, a slice a loop turn (100,000 queues took it 3 s in one piece): items
    is the caller's no more."""
    columns = request.query["columns"].split(",") if "columns" in request.query else None

    def shown(item: Any) -> dict:
        entry = make(item)
        return entry if columns is None else columns_of(entry, columns)

    if "page" not in request.query:
        return http.reply_in_slices(request, items, shown)
    page, page_size = _pagination(request.query)
    if columns is not None and "name" not in columns:  # (listing() filters the items cut to their columns)
        name_of = _no_name
    chosen = await _chosen(request, items, name_of)
    return _page(chosen, page, page_size, len(items), lambda page_items: list(map(shown, page_items)))


async def _chosen(request: web.Request, items: list, name_of: Callable[[Any], str]) -> list:
    """The items whose name the name parameter matches, all of them without one. The filter runs on a thread,
    which lets the event loop have the interpreter back every few milliseconds: RE2 takes up to a millisecond a
    name for the worst patterns (a plain filter of 100,000 names takes about 6 ms)."""
    if not request.query.get("name"):
        return items
    matches = _name_filter(request.query)
    return await asyncio.to_thread(lambda: unwalked([item for item in items if matches(name_of(item))]))


def _page(chosen: list, page: int, page_size: int, total: int, made: Callable[[list], list[dict]]) -> web.Response:
    """RabbitMQ's page of the chosen items (made: the items of the page from its part of chosen)."""
    start = (page - 1) * page_size
    if start > len(chosen):
        raise http.ApiError(400, "page_out_of_range",
                            f"Page out of range, page: {page} page size: {page_size}, len: {len(chosen)}")
    shown = made(chosen[start:start + page_size])
    return http.reply({"filtered_count": len(chosen), "item_count": len(shown), "items": shown, "page": page,
                       "page_count": -(-len(chosen) // page_size), "page_size": page_size, "total_count": total})


def columns_of(item: dict, columns: list[str]) -> dict:
    """The fields of item that columns name ("a.b" for field b of a), those it has."""
    kept: dict = {}
    for column in columns:
        source, target = item, kept
        *parents, last = column.split(".")
        for parent in parents:
            source = source.get(parent)
            if not isinstance(source, dict):
                break
            target = target.setdefault(parent, {})
        else:
            if last in source:
                target[last] = source[last]
    return kept


def _pagination(query) -> tuple[int, int]:
    try:
        page = int(query["page"])
        page_size = int(query["page_size"]) if "page_size" in query else None
    except ValueError:
        raise http.bad_request("Pagination parameters are invalid") from None
    if page < 1 or (page_size is not None and not 0 < page_size <= MAX_PAGE_SIZE):
        shown_size = "undefined" if page_size is None else page_size
        raise http.ApiError(400, "invalid_pagination_parameters",
                            f"Invalid pagination parameters: page number {page}, page size {shown_size}")
    return page, page_size or DEFAULT_PAGE_SIZE


def _name_filter(query):
    """What the name parameter (given) keeps of a listing."""
    wanted = query["name"]
    if query.get("use_regex") == "true":
        try:
            pattern = compile_pattern(wanted, ignore_case=True)
        except re.error:
            raise http.bad_request("Pagination parameters are invalid") from None
        except PatternError as error:
            raise http.bad_request(f"Pagination parameters are invalid: {error}") from None
        return lambda name: pattern.search(name) is not None
    wanted = wanted.lower()
    return lambda name: wanted in name.lower()
