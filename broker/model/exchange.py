"""Exchanges and their routing: direct, fanout, topic (trie), headers; bindings to queues or other exchanges."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, Union

from broker.model.arguments.common import text_of
from broker.model.policy import effective_settings, merged_definition
from broker.model.routing.headers import headers_match
from broker.model.routing.topic import TopicTrie

if TYPE_CHECKING:
    from broker.model.features.delayed_messages import DelayedMessages
    from broker.model.message import Message
    from broker.model.policy import Policy
    from broker.model.queue import Queue

Destination = Union["Queue", "Exchange"]


def canonical_arguments(arguments: dict | None) -> str:
    """A hashable, order-independent form of binding arguments (bindings differ by their arguments too)."""
    return repr(sorted((arguments or {}).items(), key=lambda item: item[0])) if arguments else ""


class Binding:
    """A route from a source exchange to a queue or exchange; hashed by identity (one object per binding)."""

    __slots__ = ("source", "destination", "routing_key", "arguments_key", "arguments")

    def __init__(self, source: "Exchange", destination: Destination, routing_key: str, arguments: dict):
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments
        self.arguments_key = canonical_arguments(arguments)  # part of the binding's identity

    @property
    def destination_is_exchange(self) -> bool:
        return isinstance(self.destination, Exchange)

    @property
    def destination_type(self) -> str:
        """"exchange" or "queue", as RabbitMQ names a binding's destination."""
        return "exchange" if self.destination_is_exchange else "queue"

    @property
    def key(self) -> tuple:
        return (self.destination, self.routing_key, self.arguments_key)


class Exchange:
    kind: ClassVar[str] = ""  # its type, as exchange.declare names it
    # an x-delayed-message exchange: messages with an x-delay wait before they are routed
    holds_delayed: ClassVar[bool] = False

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[tuple, Binding] = {}  # (destination, routing_key, arguments_key) -> binding
        self.inbound: set[Binding] = set()  # exchange-to-exchange bindings that route into this exchange
        self.exchange_bindings = 0  # how many of this exchange's bindings lead to another exchange
        self.deleted = False
        self.policy: Policy | None = None  # the policy that applies (the vhost chooses it)
        self.operator_policy: Policy | None = None  # the operator policy that applies
        self.alternate_exchange: str | None = None  # where unroutable messages go: argument, else policy
        self.apply_policies(None, None)

    def definition(self) -> dict:
        """What declared the exchange, in RabbitMQ's keys (stored, exported, compared with a redeclaration)."""
        return {"name": self.name, "type": self.kind, "durable": self.durable, "auto_delete": self.auto_delete,
                "internal": self.internal, "arguments": self.arguments}

    def apply_policies(self, policy: "Policy | None", operator_policy: "Policy | None") -> None:
        self.policy, self.operator_policy = policy, operator_policy
        settings = effective_settings(self.arguments, merged_definition(policy, operator_policy), "exchanges")
        value = settings.get("alternate-exchange")
        self.alternate_exchange = value if isinstance(value, str) else None

    def add_binding(self, binding: Binding) -> bool:
        """Record a binding; False if it already existed."""
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        self._index(binding)
        if binding.destination_is_exchange:
            self.exchange_bindings += 1
        return True

    def remove_binding(self, binding: Binding) -> bool:
        if self.bindings.pop(binding.key, None) is None:
            return False
        self._unindex(binding)
        if binding.destination_is_exchange:
            self.exchange_bindings -= 1
        return True

    def live_bindings(self) -> Iterator[Binding]:
        """Its bindings but those of a deleted queue, still leaving its index (broker.model.vhost's _leaving)."""
        return (binding for binding in self.bindings.values() if not binding.destination.deleted)

    def find_binding(self, destination: Destination, routing_key: str, arguments: dict | None) -> Binding | None:
        return self.bindings.get((destination, routing_key, canonical_arguments(arguments)))

    @property
    def routing_kind(self) -> str:
        """The type whose rules route its messages (its own, but for a delayed exchange)."""
        return self.kind

    def route(self, routing_key: str, message: "Message") -> Iterable[Destination]:
        raise NotImplementedError

    def _index(self, binding: Binding) -> None:
        raise NotImplementedError

    def _unindex(self, binding: Binding) -> None:
        raise NotImplementedError


class _CountedIndex:
    """destination -> number of bindings that lead to it, per lookup key."""

    @staticmethod
    def add(index: dict, key, destination) -> None:
        counts = index.setdefault(key, {})
        counts[destination] = counts.get(destination, 0) + 1

    @staticmethod
    def remove(index: dict, key, destination) -> bool:
        """Returns True when the last binding of destination under key went."""
        counts = index[key]
        counts[destination] -= 1
        if counts[destination]:
            return False
        del counts[destination]
        if not counts:
            del index[key]
        return True


class DirectExchange(Exchange):
    kind = "direct"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        super().__init__(name, durable, auto_delete, internal, arguments)
        self._by_key: dict[str, dict[Destination, int]] = {}  # routing key -> destinations (binding counts)

    def route(self, routing_key, message):
        return self._by_key.get(routing_key, ())

    def _index(self, binding):
        _CountedIndex.add(self._by_key, binding.routing_key, binding.destination)

    def _unindex(self, binding):
        _CountedIndex.remove(self._by_key, binding.routing_key, binding.destination)


class FanoutExchange(Exchange):
    kind = "fanout"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        super().__init__(name, durable, auto_delete, internal, arguments)
        self._all: dict[None, dict[Destination, int]] = {}  # the single key None -> destinations (counts)

    def route(self, routing_key, message):
        return self._all.get(None, ())

    def _index(self, binding):
        _CountedIndex.add(self._all, None, binding.destination)

    def _unindex(self, binding):
        _CountedIndex.remove(self._all, None, binding.destination)


class TopicExchange(Exchange):
    kind = "topic"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        super().__init__(name, durable, auto_delete, internal, arguments)
        self._trie = TopicTrie()
        self._counts: dict[str, dict[Destination, int]] = {}  # pattern -> destinations (counts)

    def route(self, routing_key, message):
        return self._trie.match(routing_key)

    def _index(self, binding):
        if binding.destination not in self._counts.get(binding.routing_key, ()):
            self._trie.bind(binding.routing_key, binding.destination)
        _CountedIndex.add(self._counts, binding.routing_key, binding.destination)

    def _unindex(self, binding):
        if _CountedIndex.remove(self._counts, binding.routing_key, binding.destination):
            self._trie.unbind(binding.routing_key, binding.destination)


class HeadersExchange(Exchange):
    kind = "headers"

    def route(self, routing_key, message):
        headers = message.headers
        return {binding.destination for binding in self.bindings.values()
                if headers_match(binding.arguments, headers)}

    def _index(self, binding):
        pass  # matching walks every binding: headers exchanges are rarely large

    def _unindex(self, binding):
        pass


ROUTING_TYPES: dict[str, type[Exchange]] = {
    cls.kind: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)
}


class DelayedExchange(Exchange):
    """x-delayed-message (the community plugin's type): routes as its x-delayed-type does, through a router of
    that type holding the same bindings; features.delayed_messages holds the messages that wait."""

    kind = "x-delayed-message"
    holds_delayed = True

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        self.router = ROUTING_TYPES[text_of((arguments or {})["x-delayed-type"])](name)  # indexes the bindings
        self.delayed: DelayedMessages | None = None  # the messages waiting, set by the vhost
        super().__init__(name, durable, auto_delete, internal, arguments)

    @property
    def routing_kind(self) -> str:
        return self.router.kind

    def route(self, routing_key, message):
        return self.router.route(routing_key, message)

    def _index(self, binding):
        self.router.bindings[binding.key] = binding  # a headers router matches against its bindings
        self.router._index(binding)

    def _unindex(self, binding):
        del self.router.bindings[binding.key]
        self.router._unindex(binding)


class FederationUpstreamExchange(FanoutExchange):
    """x-federation-upstream: what RabbitMQ's exchange federation declares on its upstream (here, Warren) between
    the federated exchange and the link's queue (rabbit_federation_upstream_exchange). It routes as fanout each
    message that has not crossed x-max-hops links yet (its x-received-from list is shorter) and has not been
    through the downstream already (a cycle: an entry naming x-downstream-name and x-downstream-vhost)."""

    kind = "x-federation-upstream"

    def __init__(self, name: str, durable: bool = True, auto_delete: bool = False, internal: bool = False,
                 arguments: dict | None = None):
        super().__init__(name, durable, auto_delete, internal, arguments)
        given = arguments or {}
        self.max_hops = int(given.get(MAX_HOPS, 1))  # (checked at the declare: a long)
        self.downstream = (given.get("x-downstream-name"), given.get("x-downstream-vhost"))  # who asked for it

    def route(self, routing_key, message):
        headers = message.headers
        if not should_forward(headers.get(RECEIVED_FROM) if headers else None, self.max_hops, *self.downstream):
            return ()
        return self._all.get(None, ())


MAX_HOPS = "x-max-hops"  # (FederationUpstreamExchange's argument)
RECEIVED_FROM = "x-received-from"  # the header a federation link adds to each message it republishes: its hops


def should_forward(hops: object, max_hops: int, cluster_name: object, vhost: object) -> bool:
    """Whether a message whose x-received-from is hops goes on to that cluster's vhost
    (rabbit_federation_util:should_forward): it has crossed fewer than max_hops links, and not been there."""
    return not isinstance(hops, list) or (len(hops) < max_hops and not already_seen(hops, cluster_name, vhost))


def already_seen(hops: list, cluster_name: object, vhost: object) -> bool:
    """Whether a message's (or a binding's) hops name that cluster's vhost: a cycle."""
    return any(isinstance(hop, dict) and hop.get("cluster-name") == cluster_name and hop.get("vhost") == vhost
               for hop in hops)

EXCHANGE_TYPES: dict[str, type[Exchange]] = {**ROUTING_TYPES, DelayedExchange.kind: DelayedExchange,
                                            FederationUpstreamExchange.kind: FederationUpstreamExchange}
