"""A virtual host: its exchanges, queues and bindings, and routing a message to queues."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Final, Iterable, Iterator, cast

from broker.model import durability
from broker.model.arguments.exchange import DELAYED_TYPE
from broker.model.arguments import (
    QUEUE_TYPE_MODULES, check_exchange_equivalent, check_queue_equivalent, check_queue_type_properties, queue_type_of,
    validate_exchange_arguments, validate_queue_arguments,
)
from broker.model.counters import NodeCounters
from broker.model.exchange import EXCHANGE_TYPES, Binding, DelayedExchange, DirectExchange, Exchange
from broker.model.features.delayed_messages import DelayedMessages
from broker.model.features.length_limit import APPENDED, ENQUEUED, ENQUEUED_OVER_FLOW_LIMIT, REFUSED
from broker.model.join import Join
from broker.model.keys import binding_key, delayed_key, exchange_key, parameter_key, policy_key
from broker.model.policy import Policy, PolicyChoices, PolicySnapshot, choose_both, make_policy
from broker.model.queue import PIECE, SLICE_SECONDS, Queue
from broker.model.remote import Counted, RemoteQueue, leader_locator
from broker.model.stream import Stream
from broker.model.turns import TURN_SECONDS, next_turn
from broker.model.routing.headers import validate_x_match
from protocol import errors
from storage.records import held_key

if TYPE_CHECKING:
    from broker.model.features.paging import Paging
    from broker.model.interfaces import (
        Publisher, QueueCrossing, QueueOwner, ReplyReceiver, TopologyWatcher, VhostHome,
    )
    from broker.model.message import Message
    from broker.model.node import Node
    from broker.model.transactions import Share

log = logging.getLogger(__name__)

PREDECLARED_EXCHANGES = {
    "amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
    "amq.headers": "headers", "amq.match": "headers",
}
# Bindings a queue's or exchange's deletion removes with it at once; more go first, a slice a loop turn (unbind_all:
# 100,000 topic bindings of one queue took 0.24 s in one piece)
BINDINGS_AT_ONCE: Final = 1024


def generated_name(prefix: str) -> str:
    """RabbitMQ-style server-generated names: amq.gen-<22 url-safe base64 chars>."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


def _binding_key(vhost_name: str, binding: Binding) -> str:
    """The name a binding of the vhost has in the definitions log."""
    return binding_key(vhost_name, binding.source.name, binding.destination_type, binding.destination.name,
                       binding.routing_key, binding.arguments_key)


class OperatorOwner:
    """The QueueOwner of declares and gets an operator makes (the management API, a definitions import): it owns
    no exclusive queue, so another connection's exclusive queue is locked to it as to any other connection."""

    def __init__(self):
        self.exclusive_queues: set[Queue] = set()  # stays empty


OPERATOR_OWNER = OperatorOwner()


class OwnerElsewhere:
    """The connection of another process of the node that a queue is exclusive to, as this process sees it
    (broker.crossing.copies): one object per connection and vhost, so that the identity checks of exclusive access
    hold for the changes that connection has this process make for it, and refuse everyone else's. The vhost
    forgets it with the last queue exclusive to it."""

    def __init__(self, group: int, token: str):
        self.key = (group, token)  # its process, and its connection there (a name unique to it: connection_token)
        self.exclusive_queues: set[Queue] = set()


def connection_token(connection: Any) -> str:
    """A name of a connection unique in its process (its object's id, which a later one may reuse, with the
    millisecond it was accepted)."""
    return f"{id(connection)}.{connection.connected_at}"


class DefaultExchange(DirectExchange):
    """The nameless exchange: every queue is bound to it by its own name, implicitly."""

    def __init__(self, vhost: "VirtualHost"):
        super().__init__("", durable=True)
        self.vhost = vhost

    def route(self, routing_key, message):
        queue = self.vhost.queues.get(routing_key)
        return (queue,) if queue is not None else ()


class _MessageIds:
    """The message-id counter of a vhost made without a node."""

    def __init__(self):
        self.next_msg_id = 1
        self.crossing = None  # (no other process to own its queues)
        self.serves = lambda name: True  # (it serves its vhost's clients: Node.serves)


class Dispatcher:
    """Queues that have deliveries to make, served together once per event-loop turn, until TURN_SECONDS are spent
    (each a round of at most DISPATCH_BATCH deliveries): those left go first in the next turn (1,000 queues of a
    vhost, each with a consumer and messages ready, could make 512,000 deliveries in one turn)."""

    def __init__(self):
        self.pending: dict[Queue, None] = {}  # insertion-ordered set of queues to dispatch
        self.scheduled = False  # a run is already queued on the loop

    def mark(self, queue: Queue) -> None:
        self.pending[queue] = None
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.run)

    def run(self) -> None:
        self.scheduled = False
        pending, self.pending = self.pending, {}
        ends = time.perf_counter() + TURN_SECONDS if len(pending) > 1 else 0.0  # (one has the turn to itself)
        served = 0
        for queue in pending:
            if not queue.deleted:
                queue.dispatch()
            served += 1
            if ends and served < len(pending) and time.perf_counter() >= ends:
                self._carry_over(list(pending)[served:])
                return

    def _carry_over(self, queues: list[Queue]) -> None:
        """Queues the run had no time left for go first in the next one (before those marked during this one)."""
        left = dict.fromkeys(queues)
        left.update(self.pending)
        self.pending = left
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.run)


class VirtualHost:
    def __init__(self, name: str = "/", store=None, node: "Node | None" = None, paging: "Paging | None" = None):
        self.name = name
        self.store = store  # durable storage (storage.MessageStore) or None for a broker kept in memory
        self.paging = paging  # where deep queues page their ready messages (features.paging); None: never
        # The node that numbers persistent messages (ids increase across every vhost of one store); a vhost made
        # on its own numbers its own.
        self.node = node if node is not None else _MessageIds()
        self.counters = node.counters if node is not None else NodeCounters()  # the node's (see model.counters)
        self.description = ""  # free text shown by the management API
        self.tags: list[str] = []  # operator-defined labels, as RabbitMQ's vhost tags
        self.default_queue_type: str | None = None  # as given when the vhost was created (shown, exported)
        self.dispatcher = Dispatcher()
        self.reply_channels: dict[str, ReplyReceiver] = {}  # direct reply-to token -> the channel consuming replies
        # Durable changes (definition records, purges) appended to the store so far: a method that raises it has
        # its reply wait for the disk.
        self.durable_changes = 0
        self.policies: dict[str, Policy] = {}  # name -> policy
        self.operator_policies: dict[str, Policy] = {}  # name -> operator policy (caps what policies set)
        # (component, name) -> a runtime parameter's value, as given (a shovel's definition: broker.model.node)
        self.parameters: dict[tuple[str, str], Any] = {}
        self.policies_version = 0  # counts policy changes: choices made before the latest one are not applied
        self.watcher: TopologyWatcher | None = None  # told of changes federation acts on (the node sets it)
        # how queues owned by other processes of the node are reached (broker.crossing); None: every queue is here
        self.crossing: QueueCrossing | None = self.node.crossing
        self.remote_queues = 0  # its queues owned by other processes (broker.model.remote)
        # owners of those told of a change by the method at hand -> the frame before the first it was sent
        self.changed_owners: dict[int, int] = {}
        self.counted_there: Counted | None = None  # the count an owner answers the method at hand with
        # The process that serves the vhost when another one does, for which this one owns some of its queues: it
        # routes what they dead-letter, and counts what its clients do (None: this process serves it)
        self.home: VhostHome | None = None
        # A copy of a vhost whose definitions its home orders, kept here to serve clients of its own (a node that
        # spreads vhosts: broker.crossing.copies): it writes none of them to the store but its own queues'
        self.copy = False
        self.copy_ready = False  # the copy had its home's whole definitions since the link to it was made
        self.placing_for: int | None = None  # the process whose client declares the queue at hand, when another's
        # the connections of other processes that queues here are exclusive to, by (process, token)
        self.owners_elsewhere: dict[tuple[int, str], OwnerElsewhere] = {}
        self.queues: dict[str, Queue] = {}
        # queues and exchanges losing their many bindings (unbind_all) -> what to call when few enough are left
        self.unbinding: dict[Queue | Exchange, list[Callable[[], None]]] = {}
        # deleted queues whose many bindings are still leaving the exchanges' indexes (_leaving): route passes over
        # deleted queues while there are any
        self.unindexing = 0
        # store key -> a deleted queue of _leaving whose records of its end (its durable bindings', then its own)
        # the store is yet to be given
        self.unrecorded: dict[str, Queue] = {}
        self.queues_storing_all = 0  # queues that store transient messages too (quorum queues)
        self.default_exchange = DefaultExchange(self)
        self.exchanges: dict[str, Exchange] = {"": self.default_exchange}
        for name, kind in PREDECLARED_EXCHANGES.items():
            self._add_exchange(EXCHANGE_TYPES[kind](name, durable=True))

    def definition(self) -> dict:
        """The vhost as RabbitMQ's definitions export shows it."""
        metadata = {"description": self.description, "tags": list(self.tags)}
        if self.default_queue_type:
            metadata["default_queue_type"] = self.default_queue_type
        return {"name": self.name, "description": self.description, "tags": list(self.tags),
                "default_queue_type": self.default_queue_type, "metadata": metadata}

    def delete_everything(self) -> Iterator[None]:
        """The vhost is being deleted: its queues go (with their messages and consumers), then its exchanges and
        policies (its runtime parameters went before, through their components: Node.delete_vhost), yielding after
        each (a caller lets the loop turn there: 100,000 queues held it 0.16 s in one piece), and after each of the
        many bindings of one (BINDINGS_AT_ONCE) before it goes; what a client of the vhost made meanwhile (one still
        closing) goes too."""
        while self.queues:
            queues = list(self.queues.values())
            while queues:  # (each let go once deleted: 100,000 freed at the end took 20 to 40 ms)
                queue = queues.pop()
                yield from self._unbinding(queue)
                self.delete_queue(queue)
                yield None
        while len(self.exchanges) > 1:
            exchanges = [exchange for exchange in self.exchanges.values() if exchange is not self.default_exchange]
            while exchanges:
                exchange = exchanges.pop()
                yield from self._unbinding(exchange)
                if not exchange.deleted:  # (an auto-delete one goes with its last binding)
                    self._remove_exchange(exchange)
                yield None
        for operator in (False, True):
            for name in list(self.policy_table(operator)):
                self._drop_policy(name, operator)
        self.record_ends()  # (a vhost of the same name may come next)

    # --- policies -------------------------------------------------------------------------------------------
    def policies_for(self, kind: str, name: str) -> tuple[Policy | None, Policy | None]:
        """The policy and operator policy that apply to the queue or exchange kind ("queues"/"exchanges")."""
        return choose_both(self.policies.values(), self.operator_policies.values(), kind, name)

    def set_policy(self, name: str, pattern, definition, priority=0, apply_to="all",
                   operator: bool = False, reapply: bool = True) -> Policy:
        """Add or replace a policy and apply it at once (or leave that to the caller: reapply=False); raises
        policy.PolicyError (a ValueError) with RabbitMQ's reason for bad input."""
        policy = make_policy(self.name, name, pattern, definition, priority, apply_to, operator)
        self.policy_table(operator)[name] = policy
        self.policies_version += 1
        self._record_policy(name, operator, policy.export())
        self._copied("operator_policy" if operator else "policy", policy, True)
        log.info("%s %.200r set in vhost %.200r: pattern %.200r, apply-to %s, priority %s, definition %.500s",
                 "operator policy" if operator else "policy", name, self.name, policy.pattern, policy.apply_to,
                 policy.priority, json.dumps(policy.definition))
        if reapply:
            self.reapply_policies()
        return policy

    def clear_policy(self, name: str, operator: bool = False, reapply: bool = True) -> None:
        if name not in self.policy_table(operator):
            raise errors.not_found(f"no {'operator policy' if operator else 'policy'} '{name}' in vhost "
                                   f"'{self.name}'")
        self._drop_policy(name, operator)
        log.info("%s %.200r cleared in vhost %.200r", "operator policy" if operator else "policy", name, self.name)
        if reapply:
            self.reapply_policies()

    def restore_policy(self, data: dict, operator: bool) -> None:
        """A stored policy (RabbitMQ's export shape), before the queues and exchanges it may apply to."""
        policy = make_policy(self.name, data["name"], data["pattern"], data["definition"], data["priority"],
                             data["apply-to"], operator)
        self.policy_table(operator)[policy.name] = policy

    def reapply_policies(self) -> None:
        """Every queue and exchange takes the policies that now apply to it, if they changed."""
        for _ in self.applying_policy_choices(self.policy_snapshot().choose()):
            pass

    def policy_snapshot(self) -> PolicySnapshot:
        """The queues, exchanges and policies as they are now, to choose policies for away from the event loop:
        with a costly pattern, matching every name of a big vhost takes seconds."""
        exchanges = [exchange for exchange in self.exchanges.values() if exchange is not self.default_exchange]
        return PolicySnapshot(self.policies_version, list(self.queues.values()), exchanges,
                              list(self.policies.values()), list(self.operator_policies.values()))

    def applying_policy_choices(self, choices: PolicyChoices) -> Iterator[None]:
        """Apply what a snapshot chose, yielding after each queue and exchange (a caller may let the loop turn
        there); unless policies changed since, then or between two yields (the later change's choices will come),
        and not to a queue or exchange gone meanwhile."""
        for queue, chosen in choices.queues:
            if choices.version != self.policies_version:
                return
            live = self.queues.get(queue.name)
            if live is not None and live is queue and chosen != (live.policy, live.operator_policy):
                live.apply_policies(*chosen)
                self.changed("queues", live.name)
            yield None
        for exchange, chosen in choices.exchanges:
            if choices.version != self.policies_version:
                return
            live_exchange = self.exchanges.get(exchange.name)
            if live_exchange is not None and live_exchange is exchange and chosen != (
                    live_exchange.policy, live_exchange.operator_policy):
                live_exchange.apply_policies(*chosen)
                self.changed("exchanges", live_exchange.name)
            yield None

    def policy_table(self, operator: bool) -> dict[str, Policy]:
        """The vhost's operator policies, or its policies, by name."""
        return self.operator_policies if operator else self.policies

    def _drop_policy(self, name: str, operator: bool) -> None:
        policy = self.policy_table(operator).pop(name)
        self._record_policy(name, operator, None)
        self._copied("operator_policy" if operator else "policy", policy, False)

    def _record_policy(self, name: str, operator: bool, data: dict | None) -> None:
        if self.store is not None:
            self._record("operator_policy" if operator else "policy", policy_key(self.name, name), data)

    # --- runtime parameters ----------------------------------------------------------------------------------
    def store_parameter(self, component: str, name: str, value: Any) -> None:
        """Keep a runtime parameter's value (checked by its component: broker.model.node), durably; None clears
        it."""
        if value is None:
            self.parameters.pop((component, name), None)
        else:
            self.parameters[(component, name)] = value
        if self.store is not None:
            data = None if value is None else {"vhost": self.name, "component": component, "name": name,
                                               "value": value}
            self._record("parameter", parameter_key(self.name, component, name), data)

    # --- lookups with RabbitMQ's errors --------------------------------------------------------------------
    def get_exchange(self, name: str) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise errors.not_found(f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    def get_queue(self, name: str, connection: "QueueOwner | None" = None) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise errors.not_found(f"no queue '{name}' in vhost '{self.name}'")
        if isinstance(queue, RemoteQueue):
            queue.check_reachable()
        if connection is not None:
            self.check_exclusive_access(queue, connection)
        return queue

    def check_exclusive_access(self, queue: Queue, connection: "QueueOwner") -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not connection:
            raise self.locked(queue.name)

    def locked(self, name: str) -> errors.AMQPError:
        """RabbitMQ's 405 for a queue another connection holds exclusively."""
        return errors.resource_locked(
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. It could be originally "
            "declared on another connection or the exclusive property value does not match that of the original "
            "declaration.")

    # --- exchanges ------------------------------------------------------------------------------------------
    def declare_exchange(self, name: str, kind: str, passive: bool, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict) -> Exchange:
        if name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        if passive:
            return self.get_exchange(name)
        if name.startswith("amq.") and name not in self.exchanges:
            raise errors.access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        existing = self.exchanges.get(name)
        if kind not in EXCHANGE_TYPES:
            # RabbitMQ 4.x closes the channel with 406 for an unknown type (3.x closed the connection with 503);
            # today's clients expect the 4.x behaviour.
            raise errors.precondition_failed(f"unknown exchange type '{kind}'")
        if existing is not None:
            check_exchange_equivalent(
                name, self.name,
                existing.definition(),
                {"type": kind, "durable": durable, "auto_delete": auto_delete, "internal": internal,
                 "arguments": arguments})
            return existing
        validate_exchange_arguments(name, self.name, kind, arguments)
        exchange = self._add_exchange(EXCHANGE_TYPES[kind](name, durable, auto_delete, internal, arguments))
        if durable and self.store is not None:
            self._record("exchange", exchange_key(self.name, name),
                         durability.exchange_definition(self, exchange))
        return exchange

    def restore_exchange(self, name: str, kind: str, auto_delete: bool, internal: bool, arguments: dict,
                         durable: bool = True) -> None:
        """A stored exchange (or a copied one, which may be transient)."""
        self._add_exchange(EXCHANGE_TYPES[kind](name, durable, auto_delete, internal, arguments))

    def _add_exchange(self, exchange: Exchange) -> Exchange:
        if isinstance(exchange, DelayedExchange):
            exchange.delayed = DelayedMessages(self, exchange, delayed_key(self.name, exchange.name))
        exchange.apply_policies(*self.policies_for("exchanges", exchange.name))
        self.exchanges[exchange.name] = exchange
        self.changed("exchanges", exchange.name)
        self._copied("exchange", exchange, True)
        return exchange

    def restore_queue(self, name: str, auto_delete: bool, arguments: dict, owner: int | None = None) -> None:
        """A durable queue read back from the store (owner: the process that owns it, when another does)."""
        if owner is not None:
            crossing = self.crossing
            if crossing is None or not crossing.runs(owner):
                raise durability.UnownedQueue(
                    f"queue '{name}' in vhost '{self.name}' lives in the store of worker {owner}, which this node does "
                    f"not run: start it with at least {owner + 1} workers")
            self._add_queue(RemoteQueue(self, name, True, auto_delete, arguments, owner, crossing))
        elif queue_type_of(arguments) == "stream":
            self._add_queue(Stream(self, name, True, None, auto_delete, arguments, fresh=False))
        else:
            self._add_queue(Queue(self, name, True, None, auto_delete, arguments))

    def _add_queue(self, queue: Queue) -> None:
        self.queues[queue.name] = queue
        if isinstance(queue, RemoteQueue):
            self.remote_queues += 1
        if queue.stores_all:
            self.queues_storing_all += 1
        self.changed("queues", queue.name)
        self._copied("queue", queue, True)

    def owner_elsewhere(self, group: int, token: str) -> OwnerElsewhere:
        """The connection of another process by its token there (OwnerElsewhere), made if new."""
        found = self.owners_elsewhere.get((group, token))
        if found is None:
            found = self.owners_elsewhere[(group, token)] = OwnerElsewhere(group, token)
        return found

    def add_stand_in(self, queue: RemoteQueue, record: bool, holder: "OwnerElsewhere | None" = None) -> None:
        """A queue another process owns, as a copy of the vhost (record False: its home keeps it) or its home (a
        queue a copy's client declared there) learns of it (broker.crossing), with the policies that apply to it;
        holder: the connection it is exclusive to (an exclusive queue goes with it, unrecorded)."""
        if holder is not None:
            queue.exclusive_owner = holder
            holder.exclusive_queues.add(queue)
        queue.recorded = queue.recorded and record and holder is None
        self._add_queue(queue)
        if queue.recorded:
            self._record("queue", queue.store_key, durability.queue_definition(self, queue))
        queue.apply_policies(*self.policies_for("queues", queue.name))

    def keep_delayed(self, exchange: Exchange) -> None:
        """A copy's durable delayed exchange, whose waiting messages are in this process's store, is kept there too,
        so that a restart finds them an exchange (its home's definitions come after it)."""
        if exchange.durable and exchange.holds_delayed and self.store is not None:
            self._record("exchange", exchange_key(self.name, exchange.name),
                         durability.exchange_definition(self, exchange))

    def serving(self) -> bool:
        """Whether this process routes for the vhost now: it leads it, or keeps a copy of it with its home's
        definitions (one restarted has only what it owns until they come)."""
        return self.copy_ready or self.node.serves(self.name)

    def remove_exchange(self, exchange: Exchange) -> None:
        """An exchange gone at the home of a copy of the vhost: here too, with its bindings."""
        self._remove_exchange(exchange)

    def remove_binding(self, binding: Binding) -> None:
        """A binding gone at the home of a copy of the vhost: here too (its source goes by a change of its own)."""
        self._drop_binding(binding, auto_delete_source=False)

    def delete_exchange(self, name: str, if_unused: bool) -> None:
        exchange = self.exchange_to_delete(name, if_unused)
        if exchange is not None:
            self._remove_exchange(exchange)

    def exchange_to_delete(self, name: str, if_unused: bool) -> Exchange | None:
        """The exchange exchange.delete names, its checks passed; None where there is none."""
        if name == "" or name.startswith("amq."):
            raise errors.access_refused("operation not permitted on the default exchange" if name == ""
                                        else f"deletion of system exchange '{name}' in vhost '{self.name}' "
                                             "not allowed")
        exchange = self.exchanges.get(name)
        if exchange is not None and if_unused and any(exchange.live_bindings()):
            raise errors.precondition_failed(f"exchange '{name}' in vhost '{self.name}' in use")
        return exchange

    def _remove_exchange(self, exchange: Exchange) -> None:
        exchange.deleted = True
        del self.exchanges[exchange.name]
        self._copied("exchange", exchange, False)
        if exchange.durable and self.store is not None:
            self._record("exchange", exchange_key(self.name, exchange.name), None)
        if isinstance(exchange, DelayedExchange) and exchange.delayed is not None:
            exchange.delayed.drop()
            if exchange.durable and self.store is not None:
                self.store.delete_queue(exchange.delayed.store_key)  # its stored waiting messages
        for binding in exchange.bindings.values():  # they go with it, its index dropped whole, not one at a time
            self._unlink(binding)
        exchange.bindings.clear()
        for binding in list(exchange.inbound):
            self._drop_binding(binding)
        self.changed("exchanges", exchange.name)

    # --- queues ---------------------------------------------------------------------------------------------
    def declare_queue(self, name: str, connection: "QueueOwner", passive: bool, durable: bool, exclusive: bool,
                      auto_delete: bool, arguments: dict, server_named: bool = False, placed: bool = False) -> Queue:
        """Declare a queue; server_named: name was generated by the caller (from generated_name), so its amq.
        prefix is not refused. An empty name gets a generated one. placed: the process that serves the vhost placed
        it here (broker.crossing), whatever its leader locator says."""
        if passive:
            queue = self.get_queue(name, connection)
            queue.touch()  # a redeclare renews an x-expires lease, a passive one too
            return queue
        if not name or server_named:
            queue_type = queue_type_of(arguments)
            if queue_type != "classic":
                raise errors.precondition_failed(
                    f"Cannot declare a server-named queue for type {QUEUE_TYPE_MODULES[queue_type]}")
            name = name or generated_name("amq.gen-")
        elif name.startswith("amq.") and not server_named:
            raise errors.access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self.queues.get(name)
        if existing is not None:
            if isinstance(existing, RemoteQueue):
                existing.check_reachable()
            existing.touch()
            self.check_exclusive_access(existing, connection)
            check_queue_equivalent(
                name, self.name,
                {**existing.definition(), "exclusive": existing.exclusive_owner is not None},
                {"durable": durable, "exclusive": exclusive, "auto_delete": auto_delete, "arguments": arguments})
            self.counters.queues_declared += 1
            return existing
        validate_queue_arguments(name, self.name, arguments)
        check_queue_type_properties(name, self.name, arguments, durable, exclusive, auto_delete)
        queue = self._new_queue(name, connection, durable, exclusive, auto_delete, arguments, server_named or placed)
        self._add_queue(queue)
        if not placed:  # (counted where the vhost is served)
            self.counters.queues_declared += 1
            self.counters.queues_created += 1
        if queue.recorded:
            self._record("queue", queue.store_key, durability.queue_definition(self, queue))
        if exclusive:
            connection.exclusive_queues.add(queue)
        return queue

    def _new_queue(self, name: str, connection: "QueueOwner", durable: bool, exclusive: bool, auto_delete: bool,
                   arguments: dict, stays: bool) -> Queue:
        """A queue made here, or the stand-in of one its leader locator places in another process (told to make
        it; the declare-ok waits for its answer). Exclusive and server-named queues stay with their connection;
        stays: it is to be made here."""
        crossing = self.crossing
        queue_type = queue_type_of(arguments)
        if crossing is not None and not exclusive and not stays and queue_type != "stream":
            owner = crossing.place(self, leader_locator(self, name, arguments))
            if owner is not None:
                queue = RemoteQueue(self, name, durable, auto_delete, arguments, owner, crossing)
                crossing.declare(queue)
                self.note_owner(self.changed_owners, owner)  # (the declare-ok waits for its ack)
                return queue
        kind = Stream if queue_type == "stream" else Queue
        return kind(self, name, durable, connection if exclusive else None, auto_delete, arguments)

    def delete_queue(self, queue: Queue) -> int:
        """Remove a queue with its bindings; its consumers are cancelled. Returns the ready messages dropped. A queue
        of many bindings (one that goes by itself: a client's deletion removes them first, unbind_all) goes at once,
        its name free for a new one, and its bindings leave the exchanges' indexes after it, a slice a loop turn
        (_leaving; 100,000 topic bindings took 0.24 s in one piece)."""
        if queue.deleted:
            return 0
        queue.deleted = True
        home = self.home
        if home is None:
            self.counters.queue_deleted(queue)
        else:  # (counted where the vhost is served)
            home.queue_deleted(queue)
        queue.stop_timers()
        self.queues.pop(queue.name, None)
        if queue.stores_all:
            self.queues_storing_all -= 1
        if isinstance(queue, RemoteQueue):
            self.remote_queues -= 1
        count = queue.drop_all()
        for consumer in list(queue.consumers):
            consumer.channel.consumer_cancelled_by_server(consumer)
        queue.consumers.clear()
        queue.release_publishers()
        leaving = self.has_many_bindings(queue)
        if not leaving:
            for binding in list(queue.bindings):
                self._drop_binding(binding)
        holder = queue.exclusive_owner
        if holder is not None:
            holder.exclusive_queues.discard(queue)
            if isinstance(holder, OwnerElsewhere) and not holder.exclusive_queues:
                self.owners_elsewhere.pop(holder.key, None)
        if queue.recorded:
            if leaving:
                self.store.drop_messages(queue.store_key)  # (its definition goes after its bindings': _leaving)
                self.unrecorded[queue.store_key] = queue
            else:
                self.store.delete_queue(queue.store_key)
            self.durable_changes += 1
        if leaving:
            self.unindexing += 1
            steps = self._leaving(queue)
            next_turn(lambda: self._in_slices(steps))
        self.changed("queues", queue.name)
        self._copied("queue", queue, False)
        return count

    # --- bindings -------------------------------------------------------------------------------------------
    def bind(self, source: Exchange, destination, routing_key: str, arguments: dict, record: bool = True) -> None:
        if source is self.default_exchange or destination is self.default_exchange:
            raise errors.access_refused("operation not permitted on the default exchange")
        if source.routing_kind == "headers":
            problem = validate_x_match(arguments)
            if problem:
                raise errors.precondition_failed(problem)
        binding = Binding(source, destination, routing_key, arguments)
        if source.add_binding(binding):
            (destination.bindings if isinstance(destination, Queue) else destination.inbound).add(binding)
            self.changed("exchanges", source.name)
            self._copied("binding", binding, True)
            if record and self.store is not None and durability.binding_is_durable(binding):
                self._record("binding", _binding_key(self.name, binding),
                             durability.binding_definition(self, binding))

    def unbind(self, source: Exchange | None, destination, routing_key: str, arguments: dict,
               connection: "QueueOwner | None" = None) -> None:
        """Remove a binding; like RabbitMQ, a missing binding, source or destination is not an error (not even on
        another connection's exclusive queue: access is checked once the binding is found)."""
        if source is self.default_exchange or destination is self.default_exchange:
            raise errors.access_refused("operation not permitted on the default exchange")
        if source is None or destination is None:
            return
        binding = source.find_binding(destination, routing_key, arguments)
        if binding is not None and isinstance(destination, Queue) and destination.deleted:  # (an undo's: it leaves)
            self._leave(binding)
        elif binding is not None:
            if connection is not None and isinstance(destination, Queue):
                self.check_exclusive_access(destination, connection)
            self._drop_binding(binding)

    def _drop_binding(self, binding: Binding, auto_delete_source: bool = True, told: bool = False) -> None:
        """told: a deleted queue's binding (_leaving), which the copies dropped with the queue and the store has
        been given as need be: it leaves its source alone."""
        source = binding.source
        source.remove_binding(binding)
        if not told:
            self._unlink(binding)
        self.changed("exchanges", source.name)
        # (a copy's auto-delete exchange goes when its home says: broker.crossing.copies)
        if auto_delete_source and source.auto_delete and not source.bindings and not source.deleted and not self.copy:
            self._remove_exchange(source)

    def _unlink(self, binding: Binding) -> None:
        """A binding leaves its destination and, if durable, the store (its source's index is the caller's)."""
        self._record_unbound(binding)
        self._copied("binding", binding, False)
        destination = binding.destination
        (destination.bindings if isinstance(destination, Queue) else destination.inbound).discard(binding)

    def _record_unbound(self, binding: Binding) -> None:
        """A durable binding's record of its removal."""
        if self.store is not None and durability.binding_is_durable(binding):
            self._record("binding", _binding_key(self.name, binding), None)

    def has_many_bindings(self, subject: Queue | Exchange) -> bool:
        """Whether a queue's or exchange's deletion removes its bindings first, a slice a loop turn (unbind_all)."""
        bound = len(subject.bindings) if isinstance(subject, Queue) else len(subject.bindings) + len(subject.inbound)
        return bound > BINDINGS_AT_ONCE

    def delete(self, subject: Queue | Exchange) -> None:
        """A queue or exchange deleted with its bindings, unless another client deleted it already (the records of
        its end then written now, for the caller's reply to wait for: _recorded_gone)."""
        if subject.deleted:
            if isinstance(subject, Queue) and self.unrecorded.get(subject.store_key) is subject:
                self._recorded_gone(subject)
            return
        if isinstance(subject, Queue):
            self.delete_queue(subject)
        else:
            self._remove_exchange(subject)

    def bindings_of(self, subject: Queue | Exchange) -> list[Binding]:
        """The bindings a queue's or exchange's deletion removes with it."""
        if isinstance(subject, Queue):
            return list(subject.bindings)
        return [*subject.bindings.values(), *subject.inbound]

    def _unbinding(self, subject: Queue | Exchange) -> Iterator[None]:
        """A queue's or exchange's bindings (those made meanwhile too) removed one at a time, yielding after each,
        until at most BINDINGS_AT_ONCE are left for its deletion to remove with it, or it went."""
        while self.has_many_bindings(subject) and not subject.deleted:
            bindings = self.bindings_of(subject)
            while bindings:  # (each freed as it goes: 100,000 freed at the end took 24 ms)
                self._unbind_one(subject, bindings.pop())
                yield None

    def _leaving(self, queue: Queue) -> Iterator[None]:
        """A deleted queue's bindings (delete_queue) leave the exchanges' indexes one at a time (_leave), yielding
        after each, those gone meanwhile (with their exchange, say) passed over; then its own record goes, unless
        the store was given all of them already (_recorded_gone). A durable binding's record goes as it leaves, so
        that a restart on the way finds the queue (its messages gone) with those that are left, as if it had not
        been deleted yet (no client was told it was). A step that fails leaves route passing over deleted queues
        for good rather than reaching this one."""
        bindings = queue.bindings
        while bindings:  # (each freed as it goes: 100,000 freed at the end took 24 ms)
            binding = bindings.pop()
            try:
                if binding.source.bindings.get(binding.key) is binding:
                    self._leave(binding)
            except BaseException:  # (kept for what writes the records at once: _recorded_gone)
                bindings.add(binding)
                raise
            yield None
        if self.unrecorded.get(queue.store_key) is queue:
            del self.unrecorded[queue.store_key]
            self._record("queue", queue.store_key, None)
        self.unindexing -= 1

    def _leave(self, binding: Binding, auto_delete_source: bool = True) -> None:
        """A deleted queue's binding still in its source's index leaves it, its record going too where the store
        is yet to be given it (_recorded_gone): the copies of the vhost dropped it with the queue, and a queue of
        the same name may have a binding of the same names, whose record and copies it must not touch."""
        queue = cast(Queue, binding.destination)
        if self.unrecorded.get(queue.store_key) is queue:
            self._record_unbound(binding)
        self._drop_binding(binding, auto_delete_source, told=True)

    def record_ends(self) -> None:
        """What the store is yet to be told of the end of deleted queues whose bindings are still leaving, given to
        it now (_recorded_gone: the vhost goes, or the node stops)."""
        while self.unrecorded:
            self._recorded_gone(next(iter(self.unrecorded.values())))

    def _recorded_gone(self, queue: Queue) -> None:
        """The store given at once what it is yet to be told of a deleted queue's end (_leaving): the records of
        its durable bindings still in an index, then its own. A queue of its name is being recorded (its records
        share the keys), a client's delete names it, or its vhost goes; its bindings still leave the indexes a
        slice a loop turn."""
        del self.unrecorded[queue.store_key]
        for binding in queue.bindings:
            if binding.source.bindings.get(binding.key) is binding:
                self._record_unbound(binding)
        self._record("queue", queue.store_key, None)

    def _unbind_one(self, subject: Queue | Exchange, binding: Binding) -> None:
        """One of subject's bindings removed as an unbind removes it (but an auto-delete subject stays: its deletion
        comes), unless it went meanwhile; one of a deleted queue as it leaves (_leave)."""
        source = binding.source
        if source.bindings.get(binding.key) is not binding:
            return
        if binding.destination.deleted:
            self._leave(binding, auto_delete_source=source is not subject)
        else:
            self._drop_binding(binding, auto_delete_source=source is not subject)

    def unbind_all(self, subject: Queue | Exchange, then: Callable[[], None]) -> None:
        """Remove a queue's or exchange's bindings (those made meanwhile too), each as an unbind does, a slice a loop
        turn from the next one, the subject otherwise as it was; then() in the turn where at most BINDINGS_AT_ONCE
        are left (at once where there are no more to begin with), for its deletion to remove them with it. A second
        call for the same subject meanwhile waits for the first one's slices (a client's frames each starting its
        own would each take a slice of every loop turn)."""
        if subject.deleted or not self.has_many_bindings(subject):
            then()
            return
        waiting = self.unbinding.get(subject)
        if waiting is not None:
            waiting.append(then)
            return
        self.unbinding[subject] = [then]
        steps = self._unbinding(subject)
        next_turn(lambda: self._in_slices(steps, lambda: self._unbound(subject)))

    def _in_slices(self, steps: Iterator[None], then: Callable[[], None] | None = None) -> None:
        """A slice of work on bindings (unbind_all's, _leaving's): SLICE_SECONDS of its steps, the clock looked at
        every PIECE, the next slice in a coming loop turn; then() after the last step, or one that failed (the
        deletions waiting for unbind_all take what bindings are left with them)."""
        ends = time.perf_counter() + SLICE_SECONDS
        try:
            for taken, _ in enumerate(steps, 1):
                if taken % PIECE == 0 and time.perf_counter() >= ends:
                    next_turn(lambda: self._in_slices(steps, then))
                    return
        except BaseException:
            if then is not None:
                then()
            raise
        if then is not None:
            then()

    def _unbound(self, subject: Queue | Exchange) -> None:
        """Each caller of unbind_all for subject called back, one that fails logged (the others' still come)."""
        for then in self.unbinding.pop(subject, []):
            try:
                then()
            except Exception:
                log.exception("a deletion after its bindings went failed in vhost %.200r", self.name)

    def changed(self, kind: str, name: str) -> None:
        """Tell the watcher that a queue or exchange may have changed (see TopologyWatcher)."""
        if self.watcher is not None:
            self.watcher.topology_changed(self, kind, name)

    def when_durable(self, callback: "Callable[[bool], None]", owners: "dict[int, int] | None" = None) -> None:
        """callback(ok) once what was written so far is on disk (the store's when_durable) and the owners named
        (processes that own queues of the vhost: broker.crossing) acked what they were sent so far; ok False if any
        part failed."""
        if not owners:
            self.store.when_durable(callback)
            return
        join = Join(callback)
        self.store.when_durable(join.part())
        self.when_acked(owners, join.part())
        join.seal()

    def when_acked(self, owners: dict[int, int], callback: "Callable[[bool], None]") -> None:
        """callback(ok) once these owners of queues of the vhost acked what they were sent so far, and took what
        they were sent after the frame each names."""
        crossing = self.crossing
        assert crossing is not None, "owners are processes its crossing reaches"
        crossing.when_acked(owners, callback)

    def note_owners(self, owners: dict[int, int], queues: list[Queue]) -> bool:
        """Note in owners (see note_owner) the processes that own some of queues, just sent a message; whether
        any does."""
        crossed = False
        for queue in queues:
            if queue.owner is not None:
                self.note_owner(owners, queue.owner)
                crossed = True
        return crossed

    def note_owner(self, owners: dict[int, int], owner: int) -> None:
        """owner was just sent something a caller waits for: owners says from which frame on, the first time."""
        if owner not in owners:
            crossing = self.crossing
            assert crossing is not None, "owners are processes its crossing reaches"
            owners[owner] = crossing.frame(owner) - 1

    def take_changed_owners(self) -> "dict[int, int] | None":
        """The owners of queues of the vhost a method changed (its reply waits for them), forgotten here."""
        owners = self.changed_owners
        if not owners:
            return None
        self.changed_owners = {}
        return owners

    def _record(self, kind: str, name: str, data: dict | None) -> None:
        """A durable definition changed (data None: it is gone). A copy's are its home's to keep, but for the
        queues it owns and its delayed exchanges (keep_delayed; an exchange's removal is written whatever it was)."""
        if data is not None and kind == "queue" and name in self.unrecorded:
            self._recorded_gone(self.unrecorded[name])  # (the same keys: the records of its end go first)
        delayed = kind == "exchange" and (data is None or data["type"] == DELAYED_TYPE)
        if self.copy and kind != "queue" and not delayed:
            return
        self.store.append_definition(kind, name, data)
        self.durable_changes += 1

    def _copied(self, kind: str, subject: Any, present: bool) -> None:
        """A definition was made (present) or is gone: the copies of the vhost are told (broker.crossing)."""
        crossing = self.crossing
        if crossing is not None:
            crossing.defined(self, kind, subject, present)

    def publish_to(self, queues: list[Queue], message: "Message", publisher: "Publisher | None" = None,
                   held: "Share | None" = None) -> tuple[bool, bool]:
        """Hand a routed message to its queues: (went to disk, refused by a length limit). A persistent message
        is written before any queue delivers it, so that a delivery's record never precedes the message's own in
        the log; queues that turn it away then let their copy go. A transient message is written too when it goes
        to a quorum queue, for those queues only. A message of a transaction across processes is held instead,
        until the transaction is decided (held: this process's share of it, broker.model.transactions)."""
        if held is not None:
            return held.take(self, queues, message), False
        persisted = (self.store is not None and (message.persistent or self.queues_storing_all > 0)
                     and bool(self.persist(message, queues)))
        return self.enqueue_routed(queues, message, persisted, publisher)

    def enqueue_routed(self, queues: list[Queue], message: "Message", persisted: bool,
                       publisher: "Publisher | None" = None) -> tuple[bool, bool]:
        """The queues take a routed message, written already where persisted (see publish_to)."""
        refused = False
        for queue in queues:
            queued = message
            if persisted and not queue.stores_all and not message.persistent:
                queued = message.unstored()  # this queue's copy is not on disk: no store records for it
            queue.published += 1
            status = queue.enqueue(queued)
            if status == ENQUEUED_OVER_FLOW_LIMIT:
                if publisher is not None:
                    queue.throttle(publisher)
            elif status == APPENDED:
                persisted = True  # a stream's log writes it with the next batch: a confirm waits for that
            elif status != ENQUEUED:
                refused = refused or status == REFUSED
                if queued.msg_id and queue.stored:
                    self.store.append_removed(queue.store_key, (message.msg_id,))
        return persisted, refused

    def persist(self, message: "Message", queues: list[Queue], transaction: str | None = None) -> tuple[str, ...]:
        """Write a message for those of queues that keep it on disk (a persistent one in every durable queue, a
        transient one in quorum queues), under their held keys where it is a transaction's to hold (its name:
        broker.model.transactions); the keys it was written under (none: it was not written)."""
        persistent = message.persistent
        keys = tuple(queue.store_key for queue in queues if queue.stored and (persistent or queue.stores_all))
        if not keys:
            return keys
        if transaction is not None:
            keys = tuple(held_key(transaction, key) for key in keys)
        node = self.node
        message.msg_id = node.next_msg_id
        node.next_msg_id += 1
        message.place = self.store.append_message(message.msg_id, keys, message.exchange, message.routing_key,
                                                  message.header_payload, message.body)
        return keys

    # --- routing --------------------------------------------------------------------------------------------
    def route(self, exchange: Exchange, routing_keys: list[str], message: "Message") -> list[Queue]:
        """Queues a message published to exchange with these routing keys reaches (each once), following
        exchange-to-exchange bindings and alternate exchanges."""
        if len(routing_keys) == 1 and not exchange.exchange_bindings:
            # the usual case: one key, bindings to queues only; each queue appears once in what route() returns
            destinations = exchange.route(routing_keys[0], message)
            if destinations:
                if not self.unindexing:
                    return cast("list[Queue]", list(destinations))
                live = [queue for queue in cast("Iterable[Queue]", destinations) if not queue.deleted]
                if live:
                    return live
        queues: dict[Queue, None] = {}
        seen: set[Exchange] = set()
        pending = [exchange]
        while pending:
            current = pending.pop()
            if current in seen:
                continue
            seen.add(current)
            routed = False
            for key in routing_keys:
                for destination in current.route(key, message):
                    if isinstance(destination, Queue):
                        if destination.deleted:  # (its bindings leaving the index: _leaving)
                            continue
                        queues[destination] = None
                    else:
                        pending.append(destination)
                    routed = True
            if not routed:
                alternate = self.exchanges.get(current.alternate_exchange or "")
                if alternate is not None and alternate is not self.default_exchange:
                    pending.append(alternate)
        return list(queues)

    # --- connections ----------------------------------------------------------------------------------------
    def connection_closed(self, connection: "QueueOwner", done: "Callable[[], None] | None" = None) -> None:
        """The connection's exclusive queues go (_delete_exclusive); then done() (the close-ok waits for it, as
        RabbitMQ's waits for the deletion). Until its turn comes, a queue stays as it was: another connection is
        refused it, as the closing one's. A copy's (spread_vhosts) were registered at the vhost's home, and their
        stand-ins lock their names on every process: done() waits until the home let them go and every copy
        applied that (another connection may declare one of them again at once, on any process)."""
        queues = list(connection.exclusive_queues)
        crossing = self.crossing
        if self.copy and queues and crossing is not None:
            operation = {"what": "release", "user": "", "connection": connection_token(connection)}
            finished = done

            def released() -> None:
                crossing.run_at_home(self, operation, lambda answer: None if finished is None else finished())
            done = released
        self._delete_exclusive(queues, done)

    def _delete_exclusive(self, queues: list[Queue], done: "Callable[[], None] | None") -> None:
        """The queues (the last first) each deleted whole once its bindings are few enough (unbind_all), a slice a
        loop turn, the clock looked at every PIECE (a few go in the close's own turn, however busy the machine);
        then done()."""
        ends = time.perf_counter() + SLICE_SECONDS
        deleted = 0
        while queues:
            queue = queues[-1]
            if self.has_many_bindings(queue) and not queue.deleted:
                self.unbind_all(queue, lambda: self._delete_exclusive(queues, done))
                return
            self.delete_queue(queues.pop())
            deleted += 1
            if queues and deleted % PIECE == 0 and time.perf_counter() >= ends:
                next_turn(lambda: self._delete_exclusive(queues, done))
                return
        if done is not None:
            done()
