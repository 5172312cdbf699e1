"""A federation link at work, what exchange and queue links share: it connects to its upstream, sets up what it
reads there (the subclass's part), republishes each message it reads into this broker and acks it upstream as its
ack-mode says; after a failure it starts again once its reconnect-delay has passed, its status saying why meanwhile.

Messages are republished in this process, through the same operation as the management API's publishes
(broker.model.operations.publish), with every right in the vhost, as RabbitMQ's links publish through an internal
connection. In on-confirm mode an upstream delivery is acked only once the store has made it durable
(store.when_durable: the fsync, and in a cluster the in-sync replicas): one multiple ack for all that one write
covered. Should a run end first, its unacked deliveries go back to their upstream queue as the connection closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Callable

from pamqp import commands as spec

from broker.federation.upstream import Upstream
from broker.links.client import Content, Link, LinkError
from broker.links.status import local_timestamp
from broker.links.uri import Address, parse, without_credentials
from broker.model import operations
from broker.model.message import Address as PublishedTo
from broker.model.message import Header, Message, carbon_copy_keys
from protocol.codec import decode_properties, encode_header_payload
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.operations import Actor
    from broker.model.vhost import VirtualHost

log = logging.getLogger(__name__)

MIN_RECONNECT_DELAY = 1.0  # seconds between runs at least, whatever reconnect-delay says (never a hot loop)
SETTLE_TIMEOUT = 5.0  # seconds a run that ends waits at most for the store, to ack what it wrote
INTERNAL_PURPOSE = {"x-internal-purpose": "federation"}  # marks what links declare upstream: never federated itself


@dataclasses.dataclass(frozen=True)
class LinkSettings:
    """What every federation link of this broker shares."""

    cluster_name: str  # this broker's, in the headers that tell where a message has been
    local: Callable[[], tuple[str, int]]  # this node's AMQP host and port, where a URI without a host connects
    check_interval: float  # seconds between two checks that what an exchange link reads upstream is still there


class FederationLink:
    """One federated exchange or queue and one of its upstreams, as GET /api/federation-links shows it."""

    kind = ""  # "exchange" or "queue": the subclass's

    def __init__(self, actor: "Actor", name: str, upstream: Upstream, policy: str, settings: LinkSettings,
                 after: "asyncio.Task | None") -> None:
        self.actor = actor  # who republishes, and where: the federated object's vhost
        self.after = after  # a removed link's clean-up upstream, which the first run waits for
        self.name = name  # the federated exchange or queue
        self.upstream = upstream
        self.policy = policy  # the name of the policy that federates it (in the connection's name)
        self.settings = settings
        self.status = "starting"  # then "running", or "error" (and why)
        self.error = ""
        self.said = ""  # the last failure logged: a link failing again for the same reason logs it once
        self.since = time.time()  # when the status last changed
        self.link: Link | None = None  # the connection to the upstream, while a run has it
        self.address: Address | None = None  # where the link connected last
        self.uri = upstream.uri  # and its URI (without credentials)
        self.upstream_vhost = ""  # and its vhost
        self.upstream_cluster = ""  # the upstream's cluster_name ("" if it says none)
        self.failed: asyncio.Future[str] | None = None  # set when this run must end: why
        self.last_tag = 0  # on-confirm: the latest delivery republished in this run
        self.awaiting_store = False  # on-confirm: a when_durable is pending
        # on-confirm: the processes that own queues republished to since (broker.model.remote), whose acks it awaits
        self.crossed: dict[int, int] = {}  # (owner -> the frame before the first sent to it since)
        self.settled: asyncio.Future | None = None  # set once none is pending, while a run ends (_settle)
        self.stopping = False  # stop() was called: the run ends, and no other starts
        self.task = asyncio.get_running_loop().create_task(self._run())

    @property
    def vhost(self) -> "VirtualHost":
        return self.actor.vhost

    @property
    def connection_name(self) -> str:
        return f"Federation link (upstream: {self.upstream.name}, policy: {self.policy})"

    # --- the runs ---------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        if self.after is not None:
            await asyncio.wait((self.after,))
        while True:
            try:
                await self._session()
            except (LinkError, AMQPError) as error:
                if self.stopping:
                    return
                self._failed(str(error) if isinstance(error, LinkError) else error.text)
            except Exception as error:  # (not foreseen: said, and tried again as any failure)
                if repr(error) != self.said:
                    log.exception("federation link of %s %r in vhost %r (upstream %r) failed", self.kind, self.name,
                                  self.vhost.name, self.upstream.name)
                self._failed(repr(error), logged=True)
            await asyncio.sleep(max(MIN_RECONNECT_DELAY, self.upstream.reconnect_delay))
            self._report("starting", "")

    async def _session(self) -> None:
        self.failed = asyncio.get_running_loop().create_future()
        self.last_tag, self.awaiting_store = 0, False
        try:
            self.link = link = await self._connect()
            await self._set_up(link)
            self._report("running", "")
            self.said = ""
            log.info("federation link of %s %r in vhost %r connected to upstream %r (%s)", self.kind, self.name,
                     self.vhost.name, self.upstream.name, self.uri)
            closed = asyncio.ensure_future(asyncio.shield(link.closed))
            try:
                finished, _ = await asyncio.wait((self.failed, closed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
            raise LinkError(next(iter(finished)).result())
        finally:
            await self._settle()
            await self._tear_down()
            if self.link is not None:
                self.link.close()
            self.link = None

    async def _settle(self) -> None:
        """Before a run ends, the acks of what the store is writing go out (at most SETTLE_TIMEOUT later), so that
        an end for a reason of this side (a refusal, a stop) sends none of it again."""
        link = self.link
        if link is None or link.closed.done() or not self.awaiting_store:
            return
        self.settled = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((self.settled,), timeout=SETTLE_TIMEOUT)
        finally:
            self.settled = None

    async def _connect(self) -> Link:
        """A link to one of the upstream's URIs (in a random order, as RabbitMQ picks one at random)."""
        failures = []
        for uri in random.sample(self.upstream.uris, len(self.upstream.uris)):
            address = parse(uri, self.vhost.name)
            if address.local:  # (amqp://: this node, as RabbitMQ's direct connection)
                host, port = self.settings.local()
                address = dataclasses.replace(address, host=host, port=port)
            try:
                link = await Link.open(address, address.connection_timeout, self.connection_name,
                                       "Warren federation", on_content=self._delivered)
            except LinkError as error:
                failures.append(str(error))
                continue
            self.address = address
            self.uri, self.upstream_vhost = without_credentials(uri), address.vhost
            cluster = link.server_properties.get("cluster_name")
            self.upstream_cluster = cluster.decode() if isinstance(cluster, bytes) else str(cluster or "")
            return link
        raise LinkError("; ".join(failures))

    async def _set_up(self, link: Link) -> None:
        """Declare and bind what the link reads upstream, and start reading (the subclass's)."""
        raise NotImplementedError

    async def _tear_down(self) -> None:
        """What the subclass stops as a run ends."""

    def topology_changed(self) -> None:
        """What it federates may have changed (an exchange's bindings, a queue's consumers): the subclass looks."""

    def stop(self) -> None:
        """The link is no longer wanted here (removed, changed, restarted, the vhost served elsewhere): its run
        ends, the acks of what the store is writing sent first (at most SETTLE_TIMEOUT)."""
        self.stopping = True
        if self.link is None or self.status != "running" or not self.awaiting_store:
            self.task.cancel()
            if self.link is not None:
                self.link.close()
            return
        self._fail("stopped")  # (the run settles, then closes; cancelled should the store not answer)
        asyncio.get_running_loop().call_later(SETTLE_TIMEOUT, self.task.cancel)

    async def clean_up(self) -> None:
        """The link was stopped for good (its policy or upstream gone, the object deleted): delete what it
        declared upstream (the subclass's)."""

    # --- messages ---------------------------------------------------------------------------------------------
    def _target(self, deliver: spec.Basic.Deliver, headers: dict) -> tuple[str, str] | None:
        """Where a delivery is republished (exchange, routing key), its headers updated in place; None: it is not
        (acked upstream and dropped). The subclass's."""
        raise NotImplementedError

    def _delivered(self, content: Content) -> None:
        deliver, header, body = content
        link = self.link
        if link is None or self.failed is None or self.failed.done() or not isinstance(deliver, spec.Basic.Deliver):
            return
        properties = decode_properties(header)
        headers = dict(properties.headers or {})
        target = self._target(deliver, headers)
        ack_mode = self.upstream.ack_mode
        if target is None:
            if ack_mode != "no-ack":
                link.send(spec.Basic.Ack(delivery_tag=deliver.delivery_tag))
            return
        exchange, routing_key = target
        routing_keys = [routing_key, *carbon_copy_keys(headers, "CC"), *carbon_copy_keys(headers, "BCC")]
        headers.pop("BCC", None)
        properties.headers = headers or None
        if not self.upstream.trust_user_id:
            properties.user_id = None
        header = Header(encode_header_payload(len(body), properties))
        message = Message(PublishedTo(exchange, routing_key), header, body)
        try:
            published = operations.publish(self.actor, exchange, routing_keys, message,
                                           confirm=ack_mode == "on-confirm")
        except AMQPError as error:
            self._fail(f"cannot republish to {exchange or routing_key!r}: {error.text}")
            return
        if published.refused and ack_mode != "no-ack":  # (not acked: it goes back upstream, and comes again later)
            self._fail(f"a queue refused a message republished to {exchange or routing_key!r} (reject-publish)")
            return
        if ack_mode == "on-publish":
            link.send(spec.Basic.Ack(delivery_tag=deliver.delivery_tag))
        elif ack_mode == "on-confirm":
            self.last_tag = deliver.delivery_tag
            for owner, before in (published.crossed or {}).items():
                self.crossed.setdefault(owner, before)
            if not self.awaiting_store:
                self._await_store(link)

    def _await_store(self, link: Link) -> None:
        tag = self.last_tag
        if self.vhost.store is None:
            link.send(spec.Basic.Ack(delivery_tag=tag, multiple=True))
            return
        self.awaiting_store = True
        crossed, self.crossed = self.crossed, {}
        self.vhost.when_durable(lambda ok: self._stored(link, tag, ok, bool(crossed)), crossed)

    def _stored(self, link: Link, tag: int, ok: bool, crossed: bool = False) -> None:
        """What was republished up to tag is durable (or the store failed, or, where some went to queues other
        workers own, one of those refused it or ended)."""
        if link is not self.link:
            return  # (that run ended: its unacked deliveries went back upstream)
        self.awaiting_store = False
        if not ok:
            self._fail("a queue of another worker refused what was republished (reject-publish), or that worker "
                       "ended" if crossed else "the store could not write what was republished")
            if self.settled is not None and not self.settled.done():
                self.settled.set_result(None)
            return
        link.send(spec.Basic.Ack(delivery_tag=tag, multiple=True))
        if self.last_tag > tag:
            self._await_store(link)
        elif self.settled is not None and not self.settled.done():
            self.settled.set_result(None)

    def _fail(self, why: str) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(why)

    # --- what the API shows -----------------------------------------------------------------------------------
    def _failed(self, why: str, logged: bool = False) -> None:
        self._report("error", why)
        if why != self.said and not logged:
            log.warning("federation link of %s %r in vhost %r (upstream %r): %s", self.kind, self.name,
                        self.vhost.name, self.upstream.name, why)
        self.said = why

    def _report(self, status: str, error: str) -> None:
        self.status, self.error, self.since = status, error, time.time()

    @property
    def upstream_name(self) -> str:
        """The upstream exchange or queue it reads."""
        return self.upstream.exchange if self.kind == "exchange" else self.upstream.queue

    @property
    def id(self) -> str:
        """A short id of the link (its vhost, object, upstream), as RabbitMQ's: 8 hex digits."""
        key = json.dumps([self.vhost.name, self.kind, self.name, self.upstream.name, self.upstream_name])
        return hashlib.sha256(key.encode()).hexdigest()[:8]

    def entry(self) -> dict:
        """The link's entry in GET /api/federation-links, in RabbitMQ's keys (the API adds the node's name)."""
        if self.kind == "exchange":
            identity: dict[str, Any] = {"exchange": self.name, "upstream_exchange": self.upstream.exchange}
        else:
            identity = {"queue": self.name, "upstream_queue": self.upstream.queue,
                        "consumer_tag": self.upstream.consumer_tag}
        identity.update(type=self.kind, vhost=self.vhost.name, upstream=self.upstream.name, id=self.id,
                        status=self.status)
        if self.status == "running":
            identity["local_connection"] = self.connection_name
        elif self.status == "error":
            identity["error"] = self.error
        return {**identity, "uri": self.uri, "timestamp": local_timestamp(self.since)}
