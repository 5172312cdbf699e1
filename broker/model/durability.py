"""What the broker writes to durable storage, and how it rebuilds a virtual host from what was stored."""

from __future__ import annotations

import logging
import reprlib
from typing import TYPE_CHECKING, Callable, Collection

from broker.model.arguments import validate_exchange_arguments, validate_queue_arguments
from broker.model.arguments.exchange import DELAYED_TYPE
from broker.model.exchange import EXCHANGE_TYPES
from broker.model.keys import DELAYED_PREFIX, delayed_key, queue_key
from broker.model.message import Address, Header, Message
from broker.model.policy import PolicyError
from broker.model.upgrade import upgrade
from protocol.errors import AMQPError
from storage.records import HELD_PREFIX

if TYPE_CHECKING:
    from broker.model.exchange import Binding, Exchange
    from broker.model.node import Node
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost
    from storage.recovered_messages import StoredMessage
    from storage.recovery import Recovered

log = logging.getLogger(__name__)


def store_keys(kind: str, vhost_name: str, data: dict) -> set[str]:
    """The store key of the messages of a stored queue or delayed exchange definition (none for other ones)."""
    name = data.get("name")
    if not isinstance(name, str):
        return set()
    if kind == "queue":
        return {queue_key(vhost_name, name)}
    if kind == "exchange" and data.get("type") == DELAYED_TYPE:
        return {delayed_key(vhost_name, name)}
    return set()


def exchange_definition(vhost: "VirtualHost", exchange: "Exchange") -> dict:
    return {"vhost": vhost.name, **exchange.definition()}


def queue_definition(vhost: "VirtualHost", queue: "Queue") -> dict:
    """What the store keeps of a queue: its definition, and the process that owns it where another one does."""
    owned_elsewhere = {"owner": queue.owner} if queue.owner is not None else {}
    return {"vhost": vhost.name, **queue.definition(), **owned_elsewhere}


def binding_is_durable(binding: "Binding") -> bool:
    """RabbitMQ keeps a binding across restarts when both its ends are durable."""
    destination = binding.destination
    durable_destination = destination.durable if binding.destination_is_exchange else destination.recorded
    return binding.source.durable and durable_destination


def binding_definition(vhost: "VirtualHost", binding: "Binding") -> dict:
    return {"vhost": vhost.name, "source": binding.source.name, "destination": binding.destination.name,
            "destination_kind": binding.destination_type,
            "routing_key": binding.routing_key, "arguments": binding.arguments}


def held_vhosts(recovered: "Recovered") -> list[str]:
    """The vhosts whose contents a store holds (queues and their messages, exchanges, bindings, policies): where a
    vhost's data is, for a vhost met without a record of its worker (broker.workers.placement)."""
    held = {data.get("vhost") for stored in (recovered.queues, recovered.exchanges, recovered.bindings,
                                              recovered.policies, recovered.operator_policies)
            for data in stored if isinstance(data, dict)}
    return sorted(name for name in held if isinstance(name, str))


def restore(node: "Node", recovered: "Recovered", led: Collection[str] | None = None) -> None:
    """Rebuild the policies, durable exchanges, queues, bindings and queued messages of every vhost of node (its
    vhosts, users and permissions are restored first, by the node). A definition that cannot be used (a missing
    key, a wrong type, an unknown exchange type, arguments or a policy that no longer validate, a binding whose
    ends are gone, a vhost that is gone) is logged as an error and skipped: start-up never fails on one, and the
    rest is restored. ``led``: the vhosts this node leads when it is one of several worker processes (the others
    are copies, whose restored contents are said only if the store held any). A data dir of an earlier version has
    its store keys rewritten first (broker.model.upgrade)."""
    upgrade(node, recovered)
    skipped: set[str] = set()  # store keys of queues and delayed exchanges left out: their messages are kept
    for vhost in node.vhosts.values():
        _restore_vhost(vhost, recovered, skipped, led is None or vhost.name in led)
    for kind, stored in (("policy", recovered.policies), ("operator policy", recovered.operator_policies),
                         ("parameter", recovered.parameters),
                         ("exchange", recovered.exchanges), ("queue", recovered.queues),
                         ("binding", recovered.bindings)):
        for data in stored:
            if isinstance(data, dict) and data.get("vhost") not in node.vhosts:
                log.error("skipping stored %s %s: its vhost is gone", kind, reprlib.repr(data))
                skipped |= store_keys(kind, str(data.get("vhost")), data)
    known = {queue.store_key for vhost in node.vhosts.values() for queue in vhost.queues.values()} | skipped
    known.update(exchange.delayed.store_key for vhost in node.vhosts.values() for exchange in vhost.exchanges.values()
                 if exchange.holds_delayed)
    known.update(name for kind, name in recovered.set_aside_definitions if kind == "queue")
    set_aside_exchanges = {name for kind, name in recovered.set_aside_definitions if kind == "exchange"}
    orphans = [key for key in recovered.messages if key not in known and not _set_aside(key, set_aside_exchanges)
               and not key.startswith(HELD_PREFIX)]  # (a transaction's share: broker.model.transactions)
    if orphans and recovered.report.get("definitions_damaged"):
        # a damaged definitions log may have lost the definitions of these queues: their messages stay on disk
        log.error("keeping the stored messages of %d queues whose definitions are missing (the definitions log "
                  "was damaged): %s", len(orphans), reprlib.repr(orphans))
    elif node.store is not None:
        for key in orphans:
            node.store.delete_queue(key)  # messages of a queue deleted before its removal records were written
    node.retained.restore(recovered.retained, set(node.vhosts))
    node.next_msg_id = max(recovered.next_msg_id, 1)  # 0 marks a message that is not stored


def _set_aside(store_key: str, set_aside_exchanges: set[str]) -> bool:
    """Whether store_key may hold the waiting messages of a delayed exchange whose definition was set aside: one
    named by its key (DELAYED_PREFIX before it makes store_key), or by its bare name in earlier data dirs (their
    keys were vhost|name: any vhost's is kept)."""
    if not store_key.startswith(DELAYED_PREFIX):
        return False
    key = store_key[len(DELAYED_PREFIX):]
    return any(key == name or key.endswith("|" + name) for name in set_aside_exchanges)


def _restore_vhost(vhost: "VirtualHost", recovered: "Recovered", skipped: set[str], led: bool) -> None:
    exchanges = queues = bindings = policies = 0
    for operator, stored in ((False, recovered.policies), (True, recovered.operator_policies)):
        kind = "operator policy" if operator else "policy"
        for data in stored:
            if _ours(kind, data, vhost) and _restored(kind, data, lambda: vhost.restore_policy(data, operator)):
                policies += 1
    for data in recovered.parameters:  # (kept as stored: their components read them once the broker serves)
        if _ours("parameter", data, vhost):
            vhost.parameters[(str(data.get("component")), str(data.get("name")))] = data.get("value")
    for data in recovered.exchanges:
        if not _ours("exchange", data, vhost):
            continue
        if _restored("exchange", data, lambda: exchange_from(vhost, data)):
            exchanges += 1
        else:
            skipped |= store_keys("exchange", vhost.name, data)
    for data in recovered.queues:
        if not _ours("queue", data, vhost):
            continue
        if _restored("queue", data, lambda: _restore_queue(vhost, data)):
            queues += 1
        else:
            skipped |= store_keys("queue", vhost.name, data)
    for data in recovered.bindings:
        if _ours("binding", data, vhost) and _restored("binding", data, lambda: binding_from(vhost, data)):
            bindings += 1
    restored = 0
    as_message = StoredToMessage()
    for queue in vhost.queues.values():
        stored = recovered.messages.pop(queue.store_key, None)
        if stored:
            queue.restore(stored, as_message)
            restored += len(stored)
    for exchange in vhost.exchanges.values():
        if exchange.holds_delayed:
            stored = recovered.messages.get(exchange.delayed.store_key, ())
            exchange.delayed.restore(stored)
            restored += len(stored)
    if led or policies or exchanges or queues or bindings or restored:
        log.info("vhost %.200r: %d policies, %d exchanges, %d queues, %d bindings, %d messages restored", vhost.name,
                 policies, exchanges, queues, bindings, restored)


class StoredToMessage:
    """Makes broker messages of stored ones, the messages with the same address or content header sharing one
    object (a queue keeps this as long as it has recovered messages to page in)."""

    def __init__(self) -> None:
        self.addresses: dict[tuple[str, str], Address] = {}
        self.headers: dict[bytes, Header] = {}

    def __call__(self, item: "StoredMessage") -> Message:
        address, header = self.shared(item.exchange, item.routing_key, item.header_payload)
        return Message(address, header, item.body, item.msg_id)

    def shared(self, exchange: str, routing_key: str, header_payload: bytes) -> tuple[Address, Header]:
        """The address and header objects for these values."""
        address = self.addresses.get((exchange, routing_key))
        if address is None:
            address = self.addresses[exchange, routing_key] = Address(exchange, routing_key)
        header = self.headers.get(header_payload)
        if header is None:
            header = self.headers[header_payload] = Header(header_payload)
        return address, header


def _ours(kind: str, data, vhost: "VirtualHost") -> bool:
    """Whether a stored definition belongs to vhost (one that is not even a table is logged and skipped)."""
    if not isinstance(data, dict):
        log.error("skipping stored %s %s: not a table", kind, reprlib.repr(data))
        return False
    return data.get("vhost") == vhost.name


class UnownedQueue(Exception):
    """A stored queue lives in the store of a worker this node does not run: starting would hide its messages."""


def _restored(kind: str, data: dict, restore_one: Callable[[], None]) -> bool:
    """Run restore_one; on any failure, log one line naming the definition and say it was skipped (but for a queue
    owned by a worker this node does not run: UnownedQueue)."""
    try:
        restore_one()
    except UnownedQueue:
        raise
    except Exception as error:
        described = reprlib.repr(data)
        if isinstance(error, AMQPError):
            reason = error.reply_text
        elif isinstance(error, PolicyError):
            reason = error.problem
        else:
            reason = f"{type(error).__name__}: {error}"
        log.error("skipping stored %s %s: %s", kind, described, reason)
        return False
    return True


def _field(data: dict, key: str, kind: type):
    value = data[key]
    if not isinstance(value, kind):
        raise TypeError(f"'{key}' is {type(value).__name__}, not {kind.__name__}")
    return value


def exchange_from(vhost: "VirtualHost", data: dict) -> None:
    """Add the exchange a stored (or copied: broker.crossing.copies) definition describes, unless it is there;
    ValueError, TypeError or KeyError for one that cannot be used."""
    name = _field(data, "name", str)
    if name in vhost.exchanges:
        return
    kind = _field(data, "type", str)
    if kind not in EXCHANGE_TYPES:
        raise ValueError(f"unknown exchange type '{kind}'")
    arguments = _field(data, "arguments", dict)
    validate_exchange_arguments(name, vhost.name, kind, arguments)
    vhost.restore_exchange(name, kind, _field(data, "auto_delete", bool), _field(data, "internal", bool), arguments,
                           data.get("durable") is not False)


def _restore_queue(vhost: "VirtualHost", data: dict) -> None:
    name = _field(data, "name", str)
    if name in vhost.queues:
        raise ValueError("a queue of that name was already restored")
    arguments = _field(data, "arguments", dict)
    validate_queue_arguments(name, vhost.name, arguments)
    owner = data.get("owner")
    if owner is not None and type(owner) is not int:
        raise ValueError("its owner must be a worker's number")
    vhost.restore_queue(name, _field(data, "auto_delete", bool), arguments, owner)


def binding_from(vhost: "VirtualHost", data: dict) -> None:
    """Add the binding a stored (or copied) definition describes (a binding that is there stays as it is)."""
    source = vhost.exchanges.get(_field(data, "source", str))
    destination_kind = _field(data, "destination_kind", str)
    if destination_kind not in ("exchange", "queue"):
        raise ValueError(f"unknown destination kind '{destination_kind}'")
    table = vhost.exchanges if destination_kind == "exchange" else vhost.queues
    destination = table.get(_field(data, "destination", str))
    if source is None or destination is None:
        raise ValueError("its source or destination is gone")
    vhost.bind(source, destination, _field(data, "routing_key", str), _field(data, "arguments", dict), record=False)
