"""Copies of a vhost's definitions on the other processes of a node that spreads vhosts ([server] spread_vhosts), so
that each serves the vhost's clients itself: its exchanges, bindings, policies, and a stand-in of every queue
another process owns (broker.model.remote).

The vhost's home (the process that leads it) orders every change: it makes it with the model's code, for its own
clients and for those of the other processes, which ask it (broker.crossing.forwarded), and sends it to every copy
as one ``define`` operation; a method's reply waits for every copy's ack of it, so that a publish right after a
bind-ok routes by the binding wherever it is published. When the home links to a process (at start, and after
either restarts), it first sends the whole vhost (``definitions``), which the copy takes in place of what it had;
until then the copy serves no client of the vhost.

A copy writes none of these definitions to its store: its home's store holds them, and sends them again after a
restart. What a copy owns (its queues, with their messages) it stores as ever.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from protocol.constants import RESOURCE_LOCKED
from broker.model.durability import binding_from, exchange_definition, exchange_from
from broker.model.exchange import canonical_arguments
from broker.model.remote import RemoteQueue
from broker.model.vhost import OwnerElsewhere, connection_token

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from broker.crossing.home import Crossing
    from broker.model.exchange import Binding
    from broker.model.interfaces import QueueOwner
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost


def exclusive_of(owner: "QueueOwner | None", group: int) -> list | None:
    """[process, token] of the connection a queue is exclusive to (group: this process), or None."""
    if owner is None:
        return None
    if isinstance(owner, OwnerElsewhere):
        return list(owner.key)
    return [group, connection_token(owner)]


# --- what the home sends ----------------------------------------------------------------------------------------
def definition_of(vhost: "VirtualHost", kind: str, subject: Any, group: int) -> dict:
    """One definition as a copy takes it (group: the home's process, which owns the queues it holds itself)."""
    if kind == "exchange":
        return exchange_definition(vhost, subject)
    if kind == "queue":
        queue: Queue = subject
        return {**queue.definition(), "owner": queue.owner if queue.owner is not None else group,
                "exclusive": exclusive_of(queue.exclusive_owner, group)}
    if kind == "binding":
        binding: Binding = subject
        return {"source": binding.source.name, "destination": binding.destination.name,
                "destination_kind": binding.destination_type, "routing_key": binding.routing_key,
                "arguments": binding.arguments}
    return subject.export()  # (a policy or an operator policy)


def whole(vhost: "VirtualHost", group: int) -> dict:
    """The ``definitions`` operation: everything a copy of the vhost holds, in the order it is applied."""
    exchanges = [exchange for exchange in vhost.exchanges.values() if exchange is not vhost.default_exchange]
    return {"op": "definitions", "vhost": vhost.name,
            "policies": [policy.export() for policy in vhost.policies.values()],
            "operator_policies": [policy.export() for policy in vhost.operator_policies.values()],
            "exchanges": [definition_of(vhost, "exchange", exchange, group) for exchange in exchanges],
            "queues": [definition_of(vhost, "queue", queue, group) for queue in vhost.queues.values()],
            "bindings": [definition_of(vhost, "binding", binding, group)
                         for exchange in exchanges for binding in exchange.live_bindings()]}


# --- what a copy does with it ------------------------------------------------------------------------------------
def apply(vhost: "VirtualHost", crossing: "Crossing", group: int, kind: str, present: bool,
          data: dict) -> "Queue | None":
    """Apply one definition the home sent (group: this process); a queue this process owns is returned. A policy
    is kept, and applied to the queues and exchanges by broker.model.turns.reapply_policies."""
    if kind == "exchange":
        existing = vhost.exchanges.get(data["name"])
        if present and existing is None:
            exchange_from(vhost, data)
            vhost.keep_delayed(vhost.exchanges[data["name"]])  # (its waiting messages are this process's to keep)
        elif not present and existing is not None and existing is not vhost.default_exchange:
            vhost.remove_exchange(existing)
    elif kind == "queue":
        return _apply_queue(vhost, crossing, group, present, data)
    elif kind == "binding":
        binding = _binding(vhost, data)
        if present and binding is None and _ends_here(vhost, data):
            binding_from(vhost, data)
        elif not present and binding is not None:
            vhost.remove_binding(binding)
    elif kind in ("policy", "operator_policy"):
        operator = kind == "operator_policy"
        if present:
            vhost.restore_policy(data, operator)
        else:
            vhost.policy_table(operator).pop(data["name"], None)
        vhost.policies_version += 1
    else:
        raise ValueError(f"unknown kind of definition {kind!r}")
    return None


def replace(vhost: "VirtualHost", crossing: "Crossing", group: int, definitions: dict) -> list["Queue"]:
    """Take the home's whole definitions in place of the copy's (what is not in them goes, but queues this process
    owns: broker.crossing.owner's watch decides on those); the queues this process owns that they name are
    returned."""
    for operator, key in ((False, "policies"), (True, "operator_policies")):
        vhost.policy_table(operator).clear()
        for data in definitions[key]:
            vhost.restore_policy(data, operator)
    exchanges = {data["name"]: data for data in definitions["exchanges"]}
    for name, exchange in list(vhost.exchanges.items()):
        wanted = exchanges.get(name)
        if exchange is not vhost.default_exchange and (
                wanted is None or exchange_definition(vhost, exchange) != wanted):
            vhost.remove_exchange(exchange)
    for data in exchanges.values():
        apply(vhost, crossing, group, "exchange", True, data)
    queues = {data["name"]: data for data in definitions["queues"]}
    for name, queue in list(vhost.queues.items()):
        wanted = queues.get(name)
        if isinstance(queue, RemoteQueue) and (wanted is None or wanted["owner"] != queue.owner):
            crossing.queue_gone(queue)
    owned = [queue for data in queues.values()
             if (queue := _apply_queue(vhost, crossing, group, True, data)) is not None]
    wanted_bindings = {_identity(data) for data in definitions["bindings"]}
    for exchange in list(vhost.exchanges.values()):
        for binding in list(exchange.bindings.values()):
            if (binding.source.name, binding.destination_type, binding.destination.name, binding.routing_key,
                    binding.arguments_key) not in wanted_bindings:
                vhost.remove_binding(binding)
    for data in definitions["bindings"]:
        if _binding(vhost, data) is None and _ends_here(vhost, data):
            binding_from(vhost, data)
    vhost.policies_version += 1
    return owned


def register_again(vhost: "VirtualHost", crossing: "Crossing", named: list["Queue"]) -> None:
    """The queues this process owns that its home's definitions do not name (the home started again, and its
    transient stand-ins went with it: exclusive and server-named queues of live clients here) are registered there
    again; one the home refuses (another took its name meanwhile) is deleted here."""
    kept = set(named)
    for queue in [queue for queue in vhost.queues.values() if queue.owner is None and queue not in kept]:
        holder = queue.exclusive_owner
        operation = {"what": "register", "queue": queue.name, "durable": queue.durable,
                     "auto_delete": queue.auto_delete, "arguments": queue.arguments, "exclusive": holder is not None,
                     "user": "", "connection": connection_token(holder) if holder is not None else ""}
        crossing.run_at_home(vhost, operation, lambda answer, queue=queue: _registered(queue, answer))


def _registered(queue: "Queue", answer: dict) -> None:
    error = answer.get("error")
    if error is not None and error[0] == RESOURCE_LOCKED and not queue.deleted:  # (not while the home is away)
        log.warning("deleting queue %.200r of vhost %.200r: the worker that leads the vhost refused it (%s)",
                    queue.name, queue.vhost.name, answer["error"][1])
        queue.vhost.delete_queue(queue)


def _apply_queue(vhost: "VirtualHost", crossing: "Crossing", group: int, present: bool,
                 data: dict) -> "Queue | None":
    name, owner = data["name"], data["owner"]
    existing = vhost.queues.get(name)
    if not present:
        if isinstance(existing, RemoteQueue):
            crossing.queue_gone(existing)
        return None
    if owner == group:
        return existing if existing is not None and not isinstance(existing, RemoteQueue) else None
    if existing is None:
        stand_in = RemoteQueue(vhost, name, bool(data["durable"]), bool(data["auto_delete"]), dict(data["arguments"]),
                               int(owner), crossing)
        exclusive = data.get("exclusive")
        holder = vhost.owner_elsewhere(int(exclusive[0]), str(exclusive[1])) if exclusive else None
        vhost.add_stand_in(stand_in, False, holder)
    return None


def _identity(data: dict) -> tuple:
    return (data["source"], data["destination_kind"], data["destination"], data["routing_key"],
            canonical_arguments(data["arguments"]))


def _ends_here(vhost: "VirtualHost", data: dict) -> bool:
    """Whether the copy has both ends of a binding (not a queue of its own it deleted meanwhile, of which it told
    the home, which drops the binding with it)."""
    return None not in _ends(vhost, data)


def _binding(vhost: "VirtualHost", data: dict) -> "Binding | None":
    """The binding a definition names, if the copy has it."""
    source, destination = _ends(vhost, data)
    if source is None or destination is None:
        return None
    return source.find_binding(destination, data["routing_key"], data["arguments"])


def _ends(vhost: "VirtualHost", data: dict) -> tuple:
    """The source and destination a binding's definition names, each None where the copy has none of that name."""
    table: dict = vhost.exchanges if data["destination_kind"] == "exchange" else vhost.queues
    return vhost.exchanges.get(data["source"]), table.get(data["destination"])
