"""Dead-lettering: messages rejected without requeue, expired, or pushed out by a length limit are republished to
the queue's dead-letter exchange with an x-death history, as RabbitMQ 3.x does it."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from broker.model.features.delayed_messages import delay_of
from broker.model.message import Address, Header, Message, carbon_copy_keys
from protocol.codec import LongLong, encode_header_payload, with_body_size

if TYPE_CHECKING:
    from broker.model.message import QueueEntry
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost

REJECTED, EXPIRED, MAXLEN = "rejected", "expired", "maxlen"  # the reasons x-death records
DELIVERY_LIMIT = "delivery_limit"  # returned more often than the queue's delivery limit (RabbitMQ 4)


def record_death(headers: dict, queue: str, reason: str, exchange: str, routing_keys: list[str],
                 original_expiration: str | None, now: datetime.datetime) -> dict:
    """The headers of a dead-lettered message: x-death gains (or counts again) an entry for queue and reason,
    moved to the front; x-first-death-* are set once; CC and BCC go (their keys are in routing-keys)."""
    deaths = [death for death in headers.get("x-death") or [] if isinstance(death, dict)]
    for index, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            death = dict(death, count=LongLong(int(death.get("count", 0)) + 1))
            deaths = [death] + deaths[:index] + deaths[index + 1:]
            break
    else:
        death = {"count": LongLong(1), "reason": reason, "queue": queue, "time": now, "exchange": exchange,
                 "routing-keys": routing_keys}
        if original_expiration is not None:
            death["original-expiration"] = original_expiration
        deaths = [death] + deaths
    result = {key: value for key, value in headers.items() if key not in ("CC", "BCC")}
    result["x-death"] = deaths
    result.setdefault("x-first-death-exchange", exchange)
    result.setdefault("x-first-death-queue", queue)
    result.setdefault("x-first-death-reason", reason)
    return result


def dead_lettered(message: Message, queue: str, reason: str, exchange: str, routing_key: str | None,
                  now: datetime.datetime | None = None) -> tuple[Message, list[str]]:
    """The message as it is published to the dead-letter exchange (with x-death recorded and its expiration
    removed), and the routing keys to publish it with: the queue's dead-letter routing key, else its own keys."""
    properties = message.properties
    headers = properties.headers or {}
    keys = [message.routing_key, *carbon_copy_keys(headers, "CC")]  # the keys it was published with
    now = now or datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    properties.headers = record_death(headers, queue, reason, message.exchange, keys, properties.expiration, now)
    properties.expiration = None
    keys = [routing_key] if routing_key else keys
    header = Header(encode_header_payload(len(message.body), properties))
    return Message(Address(exchange, keys[0]), header, message.body), keys


def _is_cycle(deaths: list[dict], queue: "Queue") -> bool:
    """RabbitMQ's cycle check: walking the history from the newest death, the message reaches a death in this
    queue before any rejection by a client (a client can break a cycle; expiries and length limits cannot)."""
    for death in deaths:
        if death.get("reason") == REJECTED:
            return False
        if death.get("queue") == queue.name:
            return True
    return False


def dead_letter(queue: "Queue", entries: list["QueueEntry"], reason: str) -> None:
    """Republish entries that left queue for reason to its dead-letter exchange (from its arguments or policy), if
    it has one."""
    exchange_name = queue.dead_letter_exchange
    queue.vhost.counters.count_dead_lettered(reason, queue, len(entries))
    if exchange_name is None:
        return
    vhost = queue.vhost
    # (the process that serves the vhost, where its exchanges are, when another one does and this one keeps no copy
    # of them: broker.crossing.copies)
    home = vhost.home if not vhost.copy else None
    if home is None and exchange_name not in vhost.exchanges:
        return  # as in RabbitMQ, a dead-letter exchange that does not exist drops the message
    routing_key = queue.dead_letter_routing_key
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    # what a message becomes, by its original content header (shared by the messages of one publisher that repeat
    # it) and address: its properties decoded and encoded once, not once per message
    made: dict[tuple[int, str, str], tuple[Message, list[str], list]] = {}
    for entry in entries:
        original = entry.message
        known = made.get(shared := (id(original.header), original.exchange, original.routing_key))
        if known is None:
            message, keys = dead_lettered(original, queue.name, reason, exchange_name, routing_key, now)
            known = made[shared] = (message, keys, message.properties.headers["x-death"])
        else:
            first, keys, _ = known
            header = first.header if len(first.body) == len(original.body) else Header(
                with_body_size(first.header.payload, len(original.body)))
            message = Message(first.address, header, original.body)
        if home is not None:
            home.dead_letter(vhost.name, exchange_name, keys, message, reason != REJECTED)
        else:
            republish(vhost, exchange_name, keys, message, known[2] if reason != REJECTED else None)


def republish(vhost: "VirtualHost", exchange_name: str, keys: list[str], message: Message,
              deaths: list | None) -> None:
    """Route a dead-lettered message from its dead-letter exchange (held, if that is a delayed exchange, until it
    is due); with its x-death history (deaths), not to the queues it would go round to without a client's
    rejection on the way."""
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is None:
        return
    if exchange.holds_delayed and (delay := delay_of(message)):
        exchange.delayed.hold(message, keys, delay)  # a delayed dead-letter exchange: routed when due
        return
    targets = vhost.route(exchange, keys, message)
    if deaths is not None:
        targets = [target for target in targets if not _is_cycle(deaths, target)]
    vhost.publish_to(targets, message)

