"""An exchange federation link, as RabbitMQ's (rabbit_federation_exchange_link): what is published upstream to the
upstream exchange and would be routed by a binding of the federated exchange here comes here.

Upstream it declares a durable queue ``federation: X -> CLUSTER`` (names that differ add ``:X`` or ``:VHOST:X``) and
an internal x-federation-upstream exchange named after it with a suffix, `` A`` or `` B``, bound to the queue; each
binding of the federated exchange here is mirrored as a binding from the upstream exchange to that internal
exchange, with an ``x-bound-from`` argument that counts the hops a binding may still travel. A new run sets up the
other suffix's exchange with every binding before it deletes the old one, so nothing published meanwhile is lost.
Each message read is republished to the federated exchange with its routing key and an ``x-received-from`` hop; one
that has crossed max-hops links, or been here before, is dropped (the upstream's exchange type filters as well).
"""

from __future__ import annotations

import asyncio
import logging

from pamqp import commands as spec

from broker.federation.link import INTERNAL_PURPOSE, FederationLink
from broker.links.client import Link, LinkError, Missing
from broker.links.headers import prepend_table
from broker.model.exchange import RECEIVED_FROM, already_seen, canonical_arguments, should_forward
from protocol.codec import LongLong, make_method

BOUND_FROM = "x-bound-from"  # a mirrored binding's argument: where it came from, and the hops it may still travel
MAX_QUEUE_NAME = 253  # bytes: the internal exchange's name adds a suffix, and a name is a short string (255)

log = logging.getLogger(__name__)


class ExchangeLink(FederationLink):
    kind = "exchange"

    def __init__(self, *arguments, **keywords) -> None:
        self.bound: dict[tuple[str, str], dict] = {}  # (routing key, arguments' key) -> arguments bound upstream
        self.internal = ""  # the internal exchange of this run, upstream
        self.suffix = ""  # its suffix
        self.bindings_changed = asyncio.Event()  # the federated exchange's bindings may differ from self.bound
        self.syncing: asyncio.Task | None = None  # the run's task that mirrors them (_keep_up)
        super().__init__(*arguments, **keywords)

    @property
    def queue(self) -> str:
        """The queue the link reads upstream (rabbit_federation_exchange_link:upstream_queue_name)."""
        if self.upstream_vhost == self.vhost.name:
            local = "" if self.upstream.exchange == self.name else f":{self.name}"
        else:
            local = f":{self.vhost.name}:{self.name}"
        return f"federation: {self.upstream.exchange} -> {self.settings.cluster_name}{local}"

    async def _set_up(self, link: Link) -> None:
        upstream, exchange = self.upstream, self.vhost.exchanges.get(self.name)
        if exchange is None:
            raise LinkError(f"the federated exchange {self.name!r} is gone")
        try:
            await link.passive(make_method(spec.Exchange.Declare, exchange=upstream.exchange, passive=True),
                               spec.Exchange.DeclareOk)
        except Missing:  # declared upstream as it is here
            await link.call(make_method(
                spec.Exchange.Declare, exchange=upstream.exchange, exchange_type=exchange.kind,
                durable=exchange.durable, auto_delete=exchange.auto_delete, internal=exchange.internal,
                arguments=exchange.arguments), spec.Exchange.DeclareOk)
        queue = self.queue
        if len(queue.encode()) > MAX_QUEUE_NAME:
            raise LinkError(f"the upstream queue's name would be {len(queue.encode())} bytes long, over "
                            f"{MAX_QUEUE_NAME}: {queue[:80]!r}...")
        old = await self._current_suffix(link, queue)
        self.suffix = "B" if old == "A" else "A"
        self.internal = f"{queue} {self.suffix}"
        await link.call(make_method(spec.Exchange.Delete, exchange=self.internal), spec.Exchange.DeleteOk)
        await self._declare_internal(link)
        arguments = {key: LongLong(value) for key, value in (("x-expires", upstream.expires),
                                                             ("x-message-ttl", upstream.message_ttl))
                     if value is not None}
        if upstream.ha_policy is not None:
            arguments["x-ha-policy"] = upstream.ha_policy
        await link.call(make_method(spec.Queue.Declare, queue=queue, durable=True,
                                    arguments={**arguments, **INTERNAL_PURPOSE}), spec.Queue.DeclareOk)
        await link.call(make_method(spec.Queue.Bind, queue=queue, exchange=self.internal), spec.Queue.BindOk)
        self.bound = {}
        await self._mirror_bindings(link)
        await link.call(make_method(spec.Exchange.Delete, exchange=f"{queue} {old}"), spec.Exchange.DeleteOk)
        if upstream.ack_mode != "no-ack":
            await link.call(spec.Basic.Qos(prefetch_count=upstream.prefetch), spec.Basic.QosOk)
        await link.call(make_method(spec.Basic.Consume, queue=queue, no_ack=upstream.ack_mode == "no-ack"),
                        spec.Basic.ConsumeOk)
        self.syncing = asyncio.get_running_loop().create_task(self._keep_up(link))

    async def _declare_internal(self, link: Link) -> None:
        """The internal exchange, of type x-federation-upstream; where the upstream lacks that type (a RabbitMQ
        without its federation plugin), a fanout one, as RabbitMQ's link falls back: max-hops and cycles are then
        checked here alone. The type is tried on a connection of its own, which RabbitMQ 3.x closes for an unknown
        exchange type (4.x and Warren close the channel)."""
        assert self.address is not None
        declare = dict(exchange=self.internal, durable=True, internal=True, auto_delete=True)
        trial = await Link.open(self.address, self.address.connection_timeout,
                                "Disposable exchange federation link connection", "Warren federation")
        try:
            await trial.call(make_method(spec.Exchange.Declare, exchange_type="x-federation-upstream", arguments={
                "x-max-hops": LongLong(self.upstream.max_hops), "x-downstream-name": self.settings.cluster_name,
                "x-downstream-vhost": self.vhost.name, **INTERNAL_PURPOSE}, **declare), spec.Exchange.DeclareOk)
            return
        except LinkError as error:
            if "unknown exchange type" not in str(error):
                raise
            log.info("federation link of exchange %r in vhost %r: the upstream %r has no x-federation-upstream "
                     "exchange type; a fanout one instead", self.name, self.vhost.name, self.upstream.name)
        finally:
            trial.close()
        await link.call(make_method(spec.Exchange.Declare, exchange_type="fanout", arguments=INTERNAL_PURPOSE,
                                    **declare), spec.Exchange.DeclareOk)

    async def _current_suffix(self, link: Link, queue: str) -> str:
        """The suffix of the internal exchange an earlier run left upstream ("B" where there is none)."""
        try:
            await link.passive(make_method(spec.Exchange.Declare, exchange=f"{queue} A", passive=True),
                               spec.Exchange.DeclareOk)
            return "A"
        except Missing:
            return "B"

    async def _tear_down(self) -> None:
        if self.syncing is not None:
            self.syncing.cancel()
            self.syncing = None

    # --- bindings ---------------------------------------------------------------------------------------------
    def topology_changed(self) -> None:
        self.bindings_changed.set()

    async def _keep_up(self, link: Link) -> None:
        """Mirror the bindings as they change; and every check_interval without a change, look that the internal
        exchange is still there upstream (RabbitMQ's check): a link must not show running while nothing can reach
        its queue."""
        try:
            while True:
                try:
                    await asyncio.wait_for(self.bindings_changed.wait(), self.settings.check_interval)
                except TimeoutError:
                    await link.passive(make_method(spec.Exchange.Declare, exchange=self.internal, passive=True),
                                       spec.Exchange.DeclareOk)
                    continue
                await self._mirror_bindings(link)
        except Missing:
            self._fail(f"the internal exchange {self.internal!r} is gone upstream")
        except Exception as error:  # (a refusal upstream, the connection gone: the next run mirrors afresh)
            self._fail(f"keeping the bindings upstream failed: {error}")

    async def _mirror_bindings(self, link: Link) -> None:
        """Bind upstream what the federated exchange's bindings route here, and unbind what they no longer do."""
        self.bindings_changed.clear()
        exchange = self.vhost.exchanges.get(self.name)
        wanted: dict[tuple[str, str], tuple[str, dict]] = {}
        for binding in (exchange.live_bindings() if exchange is not None else ()):
            arguments = self._mirrored_arguments(binding.arguments)
            if arguments is not None:
                wanted[(binding.routing_key, canonical_arguments(arguments))] = binding.routing_key, arguments
        nowait = self.upstream.bind_nowait
        for key in [key for key in self.bound if key not in wanted]:
            await _command(link, make_method(
                spec.Exchange.Unbind, destination=self.internal, source=self.upstream.exchange, routing_key=key[0],
                arguments=self.bound.pop(key), nowait=nowait), spec.Exchange.UnbindOk)
        for key, (routing_key, arguments) in wanted.items():
            if key not in self.bound:
                await _command(link, make_method(
                    spec.Exchange.Bind, destination=self.internal, source=self.upstream.exchange,
                    routing_key=routing_key, arguments=arguments, nowait=nowait), spec.Exchange.BindOk)
                self.bound[key] = arguments

    def _mirrored_arguments(self, arguments: dict) -> dict | None:
        """A binding's arguments as mirrored upstream, an x-bound-from hop prepended; None where it travels no
        further (rabbit_federation_exchange_link:update_binding): a binding goes as far as messages come back."""
        hops = self.upstream.max_hops
        earlier = arguments.get(BOUND_FROM)
        if isinstance(earlier, list) and earlier and isinstance(earlier[0], dict):
            if already_seen(earlier, self.upstream_cluster, self.upstream_vhost):
                return None
            previous = earlier[0].get("hops")
            hops = min((previous if isinstance(previous, int) else 0) - 1, hops)
        if hops <= 0:
            return None
        mirrored = dict(arguments)
        prepend_table(mirrored, BOUND_FROM, {"cluster-name": self.settings.cluster_name, "vhost": self.vhost.name,
                                             "exchange": f"{self.vhost.name}:{self.name} {self.suffix}",
                                             "hops": hops})
        return mirrored

    # --- messages ---------------------------------------------------------------------------------------------
    def _target(self, deliver: spec.Basic.Deliver, headers: dict) -> tuple[str, str] | None:
        if not should_forward(headers.get(RECEIVED_FROM), self.upstream.max_hops, self.settings.cluster_name,
                              self.vhost.name):
            return None
        hop = {"uri": self.uri, "exchange": self.name, "redelivered": deliver.redelivered}  # (the federated one's)
        if self.upstream_cluster:
            hop["cluster-name"] = self.upstream_cluster
        hop["vhost"] = self.upstream_vhost
        prepend_table(headers, RECEIVED_FROM, hop)
        return self.name, deliver.routing_key

    # --- removal ----------------------------------------------------------------------------------------------
    async def clean_up(self) -> None:
        """Its queue and internal exchanges upstream go too, unless resource-cleanup-mode is never. (A restart, or
        this node stopping, keeps them: what they hold meanwhile is read by the next run.) Where the link connected
        last, or where one of its URIs answers."""
        if not self.upstream.cleanup:
            return
        try:
            link = await (Link.open(self.address, self.address.connection_timeout, self.connection_name,
                                    "Warren federation") if self.address is not None else self._connect())
            try:
                queue = self.queue
                await link.call(make_method(spec.Queue.Delete, queue=queue), spec.Queue.DeleteOk)
                for suffix in "AB":
                    await link.call(make_method(spec.Exchange.Delete, exchange=f"{queue} {suffix}"),
                                    spec.Exchange.DeleteOk)
            finally:
                link.close()
        except Exception as error:  # (said: what is left upstream is the operator's to delete)
            log.warning("federation link of exchange %r in vhost %r removed, but not its queue upstream: %s",
                        self.name, self.vhost.name, error)


async def _command(link: Link, method, reply: type) -> None:
    """A binding method, its reply awaited unless it is nowait (bind-nowait)."""
    if method.nowait:
        link.send(method)
    else:
        await link.call(method, reply)
