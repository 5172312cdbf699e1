"""Federation in a broker: the components of the runtime parameters "federation-upstream" and
"federation-upstream-set", and the links that the policies ask for. A queue or exchange whose policy has
federation-upstream, federation-upstream-set or federation-upstream-pattern gets a link per upstream named; links run
while this process serves the vhost (one process of a node of workers, the leader of the vhost's group in a
cluster: so one link runs in the whole cluster, and moves with the vhost's leadership).

The component learns of changes as the model makes them (broker.model.interfaces.TopologyWatcher): a queue or
exchange made or deleted, a policy applied, an exchange's bindings changed; it looks at what changed on the next
turn of the loop, and starts, stops or updates the links of that object only.
"""

from __future__ import annotations

import asyncio
import logging

from broker.federation.exchange_link import ExchangeLink
from broker.federation.link import INTERNAL_PURPOSE, FederationLink, LinkSettings
from broker.federation.queue_link import QueueLink
from broker.federation.upstream import UPSTREAM, UPSTREAM_SET, Upstream, check_set, check_upstream, upstreams_for
from broker.model.access import InternalAccess
from broker.model.node import Node
from broker.model.operations import Actor
from broker.model.policy import FEDERATION_KEYS, merged_definition
from broker.model.stream import Stream
from broker.model.vhost import OPERATOR_OWNER, VirtualHost

log = logging.getLogger(__name__)


class Federation:
    """Both components (broker.model.interfaces.ParameterComponent), the topology watcher, and the links."""

    def __init__(self, node: Node, settings: LinkSettings) -> None:
        self.node = node
        self.settings = settings  # what every link shares
        # (vhost, "exchanges" or "queues", name) -> (upstream, its exchange or queue) -> its link at work (a set may
        # name one upstream twice, with two exchanges or queues: two links)
        self.links: dict[tuple[str, str, str], dict[tuple[str, str], FederationLink]] = {}
        # (vhost, kind) -> names of objects whose links are looked at on the next turn of the loop
        self.pending_names: dict[tuple[str, str], set[str]] = {}
        self.looking: asyncio.Handle | None = None  # the next turn's look, once scheduled
        self.started = False  # start() has run: changes start links at once (before, start() does)
        self.federating: set[str] = set()  # the vhosts that have upstreams
        # (object's key, link's key) -> a removed link deleting what it declared upstream
        self.cleaning: dict[tuple[tuple[str, str, str], tuple[str, str]], asyncio.Task] = {}
        node.parameter_components[UPSTREAM] = self
        node.parameter_components[UPSTREAM_SET] = _UpstreamSets(self)
        node.watch(self)

    # --- broker.model.interfaces.ParameterComponent (federation-upstream) ----------------------------------
    def check(self, vhost: str, name: str, value: object, user: str | None) -> None:
        check_upstream(name, value)

    def changed(self, vhost: str, name: str, value: object) -> None:
        self.look_at_vhost(vhost)

    # --- broker.model.interfaces.TopologyWatcher ------------------------------------------------------------
    def topology_changed(self, vhost: VirtualHost, kind: str, name: str) -> None:
        if not self.started or (vhost.name not in self.federating and (vhost.name, kind, name) not in self.links):
            return  # (a vhost without upstreams federates nothing: its changes cost a set lookup)
        self.pending_names.setdefault((vhost.name, kind), set()).add(name)
        if self.looking is None:
            self.looking = asyncio.get_running_loop().call_soon(self._look)

    def look_at_vhost(self, vhost_name: str) -> None:
        """Every federated object of a vhost is looked at again (an upstream or a set changed)."""
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is not None and any(component == UPSTREAM for component, _ in vhost.parameters):
            self.federating.add(vhost_name)
        else:
            self.federating.discard(vhost_name)
        for kind, objects in (("exchanges", vhost.exchanges if vhost else {}),
                              ("queues", vhost.queues if vhost else {})):
            linked = [key[2] for key in self.links if key[:2] == (vhost_name, kind)]
            for name in [*(name for name, target in objects.items() if _federated(target)), *linked]:
                if vhost is not None:
                    self.topology_changed(vhost, kind, name)
                else:
                    self._set_links((vhost_name, kind, name), [], "")

    def _look(self) -> None:
        self.looking = None
        pending, self.pending_names = self.pending_names, {}
        for (vhost_name, kind), names in pending.items():
            for name in names:
                try:
                    self._reconcile(vhost_name, kind, name)
                except Exception:  # (not foreseen: said, and the other objects are still looked at)
                    log.exception("federation of %s %r in vhost %r could not be set up", kind, name, vhost_name)

    def _reconcile(self, vhost_name: str, kind: str, name: str) -> None:
        """Start, stop or update the links of one queue or exchange to what its policy asks for now."""
        key = (vhost_name, kind, name)
        vhost = self.node.vhosts.get(vhost_name)
        if vhost is not None and not (self.started and self.node.serves(vhost_name)):
            for link in self.links.pop(key, {}).values():
                link.stop()  # (not served here now: what they declared upstream is kept for the next run)
            return
        target = (vhost.exchanges if kind == "exchanges" else vhost.queues).get(name) if vhost is not None else None
        wanted: list[Upstream] = []
        policy = ""
        if target is not None and name != "" and not INTERNAL_PURPOSE.keys() & target.arguments.keys() and not (
                isinstance(target, Stream) or getattr(target, "internal", False)):  # (as RabbitMQ: none of these)
            definition = merged_definition(target.policy, target.operator_policy)
            policy = target.policy.name if target.policy is not None else ""
            wanted = upstreams_for(vhost.parameters, definition, kind, name)
        self._set_links(key, wanted, policy)
        for link in self.links.get(key, {}).values():
            link.topology_changed()

    def _set_links(self, key: tuple[str, str, str], wanted: list[Upstream], policy: str) -> None:
        """The object's links become those wanted. A link no longer wanted, or whose upstream changed what it
        declares there (where, or the queue's arguments), is stopped and what it declared upstream deleted before
        any new link of it starts; one whose upstream changed otherwise is stopped and started again."""
        links = self.links.setdefault(key, {})
        read = (lambda upstream: upstream.exchange) if key[1] == "exchanges" else (lambda upstream: upstream.queue)
        wanted_by_key = {(upstream.name, read(upstream)): upstream for upstream in wanted}
        for link_key, link in list(links.items()):
            upstream = wanted_by_key.get(link_key)
            if upstream == link.upstream and link.policy == policy:
                continue
            del links[link_key]
            link.stop()
            if upstream is None or upstream.declares_otherwise(link.upstream):
                self._clean_up(key, link_key, link)
        vhost = self.node.vhosts.get(key[0])
        for link_key, upstream in wanted_by_key.items():
            if link_key not in links and vhost is not None:
                actor = Actor(vhost, InternalAccess(self.node, vhost.name), OPERATOR_OWNER)
                kind = ExchangeLink if key[1] == "exchanges" else QueueLink
                links[link_key] = kind(actor, key[2], upstream, policy, self.settings,
                                       self.cleaning.get((key, link_key)))
        if not links:
            del self.links[key]

    def _clean_up(self, key: tuple[str, str, str], link_key: tuple[str, str], link: FederationLink) -> None:
        """Delete what a stopped link declared upstream; a new link of the same object and upstream waits for it."""
        log.info("federation link of %s %r in vhost %r from upstream %r removed", link.kind, link.name, key[0],
                 link_key[0])
        task = asyncio.get_running_loop().create_task(link.clean_up())
        self.cleaning[(key, link_key)] = task  # (the loop keeps tasks by weak references)
        task.add_done_callback(lambda done: self.cleaning.get((key, link_key)) is done and self.cleaning.pop(
            (key, link_key)))

    # --- the broker's start and stop --------------------------------------------------------------------------
    def start(self) -> None:
        """Run the links of the vhosts this process serves (once it serves)."""
        self.started = True
        for vhost in self.node.vhosts.values():
            self.look_at_vhost(vhost.name)

    def stop(self) -> None:
        """Stop every link, leaving what they declared upstream (the next start goes on reading it)."""
        self.started = False
        if self.looking is not None:
            self.looking.cancel()
            self.looking = None
        self.pending_names = {}
        for links in self.links.values():
            for link in links.values():
                link.stop()
        self.links.clear()

    # --- what the API asks ------------------------------------------------------------------------------------
    def status(self, vhost: str | None = None) -> list[dict]:
        """The links' entries in GET /api/federation-links (of one vhost, or all), by vhost, object and upstream
        (the API adds the node's name)."""
        return [link.entry() for key, links in sorted(self.links.items()) if vhost is None or key[0] == vhost
                for _, link in sorted(links.items())]

    def restart(self, vhost: str, link_id: str) -> bool:
        """Start a link again at once; False if none runs here with that id."""
        for key, links in self.links.items():
            for link_key, link in links.items():
                if key[0] == vhost and link.id == link_id:
                    link.stop()
                    links[link_key] = type(link)(link.actor, link.name, link.upstream, link.policy, self.settings,
                                                 None)
                    return True
        return False


class _UpstreamSets:
    """The federation-upstream-set component: its values are checked, and a change looks at the vhost again."""

    def __init__(self, federation: Federation) -> None:
        self.federation = federation

    def check(self, vhost: str, name: str, value: object, user: str | None) -> None:
        check_set(name, value)

    def changed(self, vhost: str, name: str, value: object) -> None:
        self.federation.look_at_vhost(vhost)


def _federated(target) -> bool:
    """Whether a queue's or exchange's policy names upstreams (operator policies cannot)."""
    policy = target.policy
    return policy is not None and any(key in policy.definition for key in FEDERATION_KEYS)
