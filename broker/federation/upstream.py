"""Federation upstreams: the runtime parameters of components "federation-upstream" (where to federate from) and
"federation-upstream-set" (named lists of them, with keys overridden), checked with RabbitMQ's keys, defaults and
texts (rabbit_federation_parameters), and the upstreams a policy names for a queue or exchange
(rabbit_federation_upstream)."""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.links import validation
from broker.links.uri import without_credentials
from broker.links.validation import DefinitionError
from broker.model.patterns import compile_pattern

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
ALL = "all"  # the set every upstream of the vhost is in, without being defined
ACK_MODES = ("no-ack", "on-publish", "on-confirm")
DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5  # seconds

_binary, _number, _boolean = validation.binary, validation.number, validation.boolean
SHARED: dict[str, validation.Check] = {
    "exchange": _binary, "queue": _binary, "consumer-tag": _binary, "prefetch-count": validation.prefetch,
    "reconnect-delay": _number, "max-hops": _number, "expires": _number, "message-ttl": _number,
    "trust-user-id": _boolean, "ack-mode": validation.one_of(*ACK_MODES),
    "resource-cleanup-mode": validation.one_of("default", "never"), "ha-policy": _binary,
    "bind-nowait": _boolean, "channel-use-mode": validation.one_of("multiple", "single"),
}
UPSTREAM_KEYS: dict[str, validation.Check] = {"uri": validation.uris, **SHARED}
SET_KEYS: dict[str, validation.Check] = {"upstream": _binary, **SHARED}


@dataclasses.dataclass(frozen=True)
class Upstream:
    """One upstream as a link uses it, for one federated exchange or queue: the upstream's keys, a set's overrides
    applied, the defaults filled in."""

    name: str
    uris: tuple[str, ...]  # tried in turn
    exchange: str  # the upstream exchange federated (default: the federated exchange's name)
    queue: str  # the upstream queue federated (default: the federated queue's name)
    consumer_tag: str
    prefetch: int
    reconnect_delay: float  # seconds
    max_hops: int
    expires: int | None  # the upstream queue's x-expires (exchange federation), milliseconds
    message_ttl: int | None  # and its x-message-ttl
    ha_policy: str | None  # and its x-ha-policy (RabbitMQ 3's mirroring argument, passed on as RabbitMQ does)
    trust_user_id: bool  # keep a message's user_id (else it is cleared, as the downstream cannot check it)
    ack_mode: str
    bind_nowait: bool
    cleanup: bool  # a removed link deletes its upstream queue and exchange (resource-cleanup-mode default)

    def declares_otherwise(self, other: "Upstream") -> bool:
        """Whether a link with this upstream declares upstream what one with the other would not: elsewhere, or
        its queue with other arguments (which the declare would refuse)."""
        return ((self.uris, self.expires, self.message_ttl, self.ha_policy)
                != (other.uris, other.expires, other.message_ttl, other.ha_policy))

    @property
    def uri(self) -> str:
        """The first URI, without credentials, as links show it."""
        return without_credentials(self.uris[0])


def check_upstream(name: str, value: Any) -> None:
    reasons = validation.proplist(name, value, UPSTREAM_KEYS, ("uri",))
    if reasons:
        raise DefinitionError(reasons)


def check_set(name: str, value: Any) -> None:
    if not isinstance(value, list):
        raise DefinitionError([f"{name} should be a list, actually was {validation.write_value(value)}"])
    reasons = [reason for item in value for reason in validation.proplist(name, item, SET_KEYS, ("upstream",))]
    if reasons:
        raise DefinitionError(reasons)


def upstreams_for(parameters: dict[tuple[str, str], Any], definition: dict, kind: str,
                  name: str) -> list[Upstream]:
    """The upstreams a queue or exchange (kind "queues" or "exchanges") named name federates from, under its
    merged policy definition; a set's entry naming an upstream that does not exist is left out, as RabbitMQ's."""
    defined = {key[1]: value for key, value in parameters.items() if key[0] == UPSTREAM}
    if "federation-upstream" in definition:
        entries = [{"upstream": definition["federation-upstream"]}]
    elif "federation-upstream-set" in definition:
        set_name = definition["federation-upstream-set"]
        entries = ([{"upstream": upstream} for upstream in sorted(defined)] if set_name == ALL
                   else list(parameters.get((UPSTREAM_SET, set_name)) or []))
    elif "federation-upstream-pattern" in definition:
        pattern = compile_pattern(definition["federation-upstream-pattern"])
        entries = [{"upstream": upstream} for upstream in sorted(defined) if pattern.search(upstream)]
    else:
        return []
    return [_upstream(entry, defined[entry["upstream"]], kind, name) for entry in entries
            if isinstance(entry, dict) and entry.get("upstream") in defined]


def _upstream(entry: dict, defined: dict, kind: str, name: str) -> Upstream:
    def key(key: str, default: Any) -> Any:  # a set's entry overrides the upstream's keys
        return entry.get(key, defined.get(key, default))

    uris = key("uri", [])
    upstream_name = entry["upstream"]
    return Upstream(
        name=upstream_name, uris=tuple(uris) if isinstance(uris, list) else (uris,),
        exchange=key("exchange", name), queue=key("queue", name),
        consumer_tag=key("consumer-tag", f"federation-link-{upstream_name}"),
        prefetch=int(key("prefetch-count", DEFAULT_PREFETCH)),
        reconnect_delay=key("reconnect-delay", DEFAULT_RECONNECT_DELAY), max_hops=int(key("max-hops", 1)),
        expires=_whole(key("expires", None)), message_ttl=_whole(key("message-ttl", None)),
        ha_policy=key("ha-policy", None),
        trust_user_id=key("trust-user-id", False), ack_mode=key("ack-mode", "on-confirm"),
        bind_nowait=key("bind-nowait", False), cleanup=key("resource-cleanup-mode", "default") != "never")


def _whole(value: Any) -> int | None:
    return None if value is None else int(value)
