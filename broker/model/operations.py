"""What a user does in a vhost, whether over AMQP or through the management API: declare and delete exchanges and
queues, bind and unbind, purge, publish and get. Each operation makes every check RabbitMQ's channel makes, in its
order (rabbit_channel's handle_method, which RabbitMQ's API runs too): names that AMQP can carry, permissions,
reserved names, the default exchange, exclusive queues, if-unused and if-empty. The AMQP handlers and the API views
both call these, so that both doors refuse the same things with the same protocol.errors.AMQPError.

basic.publish from a client does not come here: the channel's fast path makes the same checks with the same
helpers (ChannelAccess, internal_exchange_refusal, parse_expiration, user_id_refusal) and the same model calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from broker.model.access import CONFIGURE, EXCHANGE, QUEUE, READ, WRITE, internal_exchange_refusal, user_id_refusal
from broker.model.exchange import EXCHANGE_TYPES
from broker.model.features.delayed_messages import delay_of
from broker.model.features.expiry import parse_expiration
from broker.model.vhost import generated_name
from protocol import errors

if TYPE_CHECKING:
    from broker.model.access import ChannelAccess
    from broker.model.counters import NodeCounters
    from broker.model.exchange import Exchange
    from broker.model.interfaces import QueueOwner
    from broker.model.message import Message
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost

MAX_SHORTSTR = 255  # bytes of UTF-8 in an AMQP short string: names, routing keys, short-string properties


class Actor(NamedTuple):
    """Who performs an operation, and where."""

    vhost: "VirtualHost"  # where it acts
    access: "ChannelAccess"  # its user's permissions there
    owner: "QueueOwner"  # the connection whose exclusive queues it may use (the API's, OPERATOR_OWNER, has none)


def shortstr_problem(what: str, value: str) -> str | None:
    """Why an AMQP short string cannot carry value (RabbitMQ's API's text for a queue name), or None."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return f"{what} should be valid UTF-8"
    return f"{what} should be less than {MAX_SHORTSTR} bytes, actually was {size}" if size > MAX_SHORTSTR else None


def check_shortstr(what: str, value: str) -> None:
    if problem := shortstr_problem(what, value):
        raise errors.precondition_failed(problem)


# --- exchanges -------------------------------------------------------------------------------------------------
def declare_exchange(actor: Actor, name: str, kind: str, passive: bool, durable: bool, auto_delete: bool,
                     internal: bool, arguments: dict) -> tuple["Exchange", bool]:
    """exchange.declare: the exchange, and whether this call made it."""
    check_shortstr("exchange", name)
    vhost, access = actor.vhost, actor.access
    existed = name in vhost.exchanges
    # RabbitMQ checks the type and refuses the default exchange before permissions; a passive declare needs none
    if not passive and name and kind in EXCHANGE_TYPES:
        access.check(CONFIGURE, EXCHANGE, name)
        if not existed and not name.startswith("amq."):  # a reserved name is refused before the AE
            _check_alternate_exchange(access, name, arguments)
    exchange = vhost.declare_exchange(name, kind, passive, durable, auto_delete, internal, arguments)
    return exchange, not existed


def _check_alternate_exchange(access: "ChannelAccess", name: str, arguments: dict) -> None:
    """A new exchange with an alternate exchange: its messages may end up there, so RabbitMQ wants read on it and
    write on the alternate."""
    alternate = arguments.get("alternate-exchange")
    if isinstance(alternate, str):  # another type is refused by the argument checks
        access.check(READ, EXCHANGE, name)
        access.check(WRITE, EXCHANGE, alternate)


def delete_exchange(actor: Actor, name: str, if_unused: bool) -> None:
    exchange = exchange_to_delete(actor, name, if_unused)
    if exchange is not None:
        actor.vhost.delete_exchange(name, if_unused=False)


def exchange_to_delete(actor: Actor, name: str, if_unused: bool) -> "Exchange | None":
    """The exchange exchange.delete names, once its checks pass; None where there is none."""
    if name and not name.startswith("amq."):  # those are refused first, whatever the rights
        actor.access.check(CONFIGURE, EXCHANGE, name)
    return actor.vhost.exchange_to_delete(name, if_unused)


# --- queues ----------------------------------------------------------------------------------------------------
def declare_queue(actor: Actor, name: str, passive: bool, durable: bool, exclusive: bool, auto_delete: bool,
                  arguments: dict) -> tuple["Queue", bool]:
    """queue.declare (an empty name, not passive: a server-named queue): the queue, and whether this call made
    it."""
    check_shortstr("queue", name)
    vhost = actor.vhost
    server_named = not passive and not name
    # RabbitMQ checks a server-named queue's permissions on the name it is about to get, before it exists
    if server_named:
        name = generated_name("amq.gen-")
    existed = name in vhost.queues
    if not passive and (server_named or not name.startswith("amq.")):  # a reserved name is refused first
        _check_queue_declare(actor.access, name, existed, arguments)
    queue = vhost.declare_queue(name, actor.owner, passive, durable, exclusive, auto_delete, arguments, server_named)
    return queue, not existed


def _check_queue_declare(access: "ChannelAccess", name: str, existed: bool, arguments: dict) -> None:
    """Declaring a queue needs configure on it; a new one with a dead-letter exchange also needs read on the queue
    and write on that exchange (the DLX guide)."""
    access.check(CONFIGURE, QUEUE, name)
    dead_letter_exchange = arguments.get("x-dead-letter-exchange")
    if not existed and isinstance(dead_letter_exchange, str):  # another type is refused by the argument checks
        access.check(READ, QUEUE, name)
        access.check(WRITE, EXCHANGE, dead_letter_exchange)


def delete_queue(actor: Actor, name: str, if_unused: bool, if_empty: bool) -> int:
    """queue.delete: the ready messages dropped (0 when there was no such queue)."""
    queue = queue_to_delete(actor, name, if_unused, if_empty)
    return 0 if queue is None else actor.vhost.delete_queue(queue)


def queue_to_delete(actor: Actor, name: str, if_unused: bool, if_empty: bool) -> "Queue | None":
    """The queue queue.delete names, once its checks pass; None where there is none."""
    vhost = actor.vhost
    actor.access.check(CONFIGURE, QUEUE, name)
    queue = vhost.queues.get(name)
    if queue is None:
        return None
    vhost.check_exclusive_access(queue, actor.owner)
    if if_unused and queue.has_consumers():
        raise errors.precondition_failed(f"queue '{queue.name}' in vhost '{vhost.name}' in use")
    if if_empty and queue.has_ready():
        raise errors.precondition_failed(f"queue '{queue.name}' in vhost '{vhost.name}' not empty")
    return queue


def readable_queue(actor: Actor, name: str) -> "Queue":
    """The queue a purge, get or consume names, which needs read on it (checked before the queue is looked up)."""
    actor.access.check(READ, QUEUE, name)
    return actor.vhost.get_queue(name, actor.owner)


def purge(actor: Actor, name: str) -> int:
    """queue.purge: the messages dropped."""
    return readable_queue(actor, name).purge()


# --- bindings --------------------------------------------------------------------------------------------------
def _check_binding(access: "ChannelAccess", source: str, kind: str, destination: str) -> None:
    """(Un)binding needs write on the destination and read on the source exchange, checked before either is
    looked up, as in RabbitMQ, which refuses the default exchange between the two checks (and then, the source
    found, the binding key under the user's topic permission there: ChannelAccess.check_topic)."""
    access.check(WRITE, kind, destination)
    if not source or not destination:
        raise errors.access_refused("operation not permitted on the default exchange")
    access.check(READ, EXCHANGE, source)


def bind(actor: Actor, source_name: str, kind: str, destination_name: str, routing_key: str,
         arguments: dict) -> tuple["Exchange", "Exchange | Queue", bool]:
    """queue.bind (kind QUEUE) or exchange.bind: the two ends, and whether this call made the binding. As
    RabbitMQ, the source is looked up first, and another connection's exclusive queue refused once both are
    found."""
    check_shortstr("routing_key", routing_key)
    vhost = actor.vhost
    _check_binding(actor.access, source_name, kind, destination_name)
    source = vhost.get_exchange(source_name)
    actor.access.check_topic(READ, source, routing_key)
    destination = vhost.get_queue(destination_name) if kind == QUEUE else vhost.get_exchange(destination_name)
    if kind == QUEUE:
        vhost.check_exclusive_access(destination, actor.owner)
    existed = source.find_binding(destination, routing_key, arguments) is not None
    vhost.bind(source, destination, routing_key, arguments)
    return source, destination, not existed


def unbind(actor: Actor, source_name: str, kind: str, destination_name: str, routing_key: str,
           arguments: dict) -> None:
    """queue.unbind or exchange.unbind; a missing binding or end is no error."""
    vhost = actor.vhost
    _check_binding(actor.access, source_name, kind, destination_name)
    source = vhost.exchanges.get(source_name)
    if source is not None:
        actor.access.check_topic(READ, source, routing_key)
    destination = vhost.queues.get(destination_name) if kind == QUEUE else vhost.exchanges.get(destination_name)
    vhost.unbind(source, destination, routing_key, arguments, actor.owner)


# --- messages --------------------------------------------------------------------------------------------------
class Published(NamedTuple):
    """What became of a publish."""

    routed: bool  # a queue (or the delayed exchange) took it
    refused: bool  # a queue turned it away (reject-publish): on a channel in confirm mode, a basic.nack
    # the processes that own queues it went to (broker.model.remote), whose acks say they took it, and the frame to
    # each before the one it went in
    crossed: dict[int, int] | None = None


def publish(actor: Actor, exchange_name: str, routing_keys: list[str], message: "Message",
            mandatory: bool = False, confirm: bool = False) -> Published:
    """basic.publish of a message made by the broker (the API's, a federation link's): checked as the channel
    checks a client's, then routed by routing_keys (its own and its CC and BCC headers'). Counted in the node's
    counters as a channel counts a publish, on a channel in confirm mode with confirm, mandatory with mandatory
    (RabbitMQ's API publish is both; its aliveness test neither)."""
    check_shortstr("exchange", exchange_name)
    check_shortstr("routing_key", message.routing_key)
    vhost, access = actor.vhost, actor.access
    access.check(WRITE, EXCHANGE, exchange_name)
    exchange = vhost.get_exchange(exchange_name)
    if exchange.internal:
        raise internal_exchange_refusal(exchange_name, vhost.name)
    access.check_published_keys(exchange, routing_keys)
    properties = message.properties
    if properties.expiration is not None:
        parse_expiration(properties.expiration)
    user_id = properties.user_id
    if user_id is not None and user_id != access.user and not access.may_impersonate():
        raise user_id_refusal(user_id, access.user)
    if exchange.holds_delayed and (delay := delay_of(message)):
        # held until its delay is over; RabbitMQ's delayed-message plugin routes it to no queue at the publish, so
        # the API answers routed: false, as RabbitMQ's does
        exchange.delayed.hold(message, routing_keys, delay)
        _count_publish(vhost.counters, confirm, True, False, mandatory)
        return Published(False, False)
    queues = vhost.route(exchange, routing_keys, message)
    refused = bool(queues) and vhost.publish_to(queues, message)[1]
    _count_publish(vhost.counters, confirm, bool(queues), refused, mandatory)
    crossed: dict[int, int] = {}
    if vhost.remote_queues:
        vhost.note_owners(crossed, queues)
    return Published(bool(queues), refused, crossed or None)


def _count_publish(counters: "NodeCounters", confirm: bool, routed: bool, refused: bool, mandatory: bool) -> None:
    """What a channel counts of a publish (broker.session.channel): received, routed or unroutable (returned when
    mandatory, else dropped), and in confirm mode the confirm, unless a queue refused it (a nack)."""
    counters.received += 1
    if routed:
        counters.routed += 1
    elif mandatory:
        counters.unroutable_returned += 1
    else:
        counters.unroutable_dropped += 1
    if confirm:
        counters.received_confirm += 1
        if not refused:
            counters.confirmed += 1

