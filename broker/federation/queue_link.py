"""A queue federation link, as RabbitMQ's (rabbit_federation_queue_link): the federated queue takes messages from
its upstream queue while it has a consumer waiting here and nothing ready to give it.

The link consumes from the upstream queue (declared there as the federated queue is, if it is missing) at priority
-1, so that the upstream's own consumers come first, and cancels that consumer whenever the federated queue has
ready messages or no consumer with credit: it looks when a consumer comes, then every DEMAND_INTERVAL while the
queue has consumers. Each message read is republished to the federated queue through the default exchange, with an
``x-received-from`` hop counting its visits; its first hop also records where it was published
(``x-original-exchange``, ``x-original-routing-key``) and renames a CC header ``x-original-cc``, so that
republishing routes it to this queue alone.
"""

from __future__ import annotations

import asyncio

from pamqp import commands as spec

from broker.federation.link import FederationLink
from broker.links.client import Link, LinkError, Missing
from broker.model.exchange import RECEIVED_FROM
from protocol.codec import make_method

DEMAND_INTERVAL = 0.05  # seconds between two looks at whether the federated queue wants messages


class QueueLink(FederationLink):
    kind = "queue"

    def __init__(self, *arguments, **keywords) -> None:
        self.consuming = False  # a consumer of this run reads the upstream queue now
        self.watching: asyncio.TimerHandle | None = None  # the next look at the federated queue's demand
        super().__init__(*arguments, **keywords)

    async def _set_up(self, link: Link) -> None:
        upstream, queue = self.upstream, self.vhost.queues.get(self.name)
        if queue is None:
            raise LinkError(f"the federated queue {self.name!r} is gone")
        capabilities = link.server_properties.get("capabilities") or {}
        if not capabilities.get("consumer_priorities"):
            raise LinkError("the upstream lacks consumer priorities (upstream_lacks_consumer_priorities)")
        try:
            await link.passive(make_method(spec.Queue.Declare, queue=upstream.queue, passive=True),
                               spec.Queue.DeclareOk)
        except Missing:  # declared upstream as it is here
            await link.call(make_method(spec.Queue.Declare, queue=upstream.queue, durable=queue.durable,
                                        auto_delete=queue.auto_delete, arguments=queue.arguments),
                            spec.Queue.DeclareOk)
        if upstream.ack_mode != "no-ack":
            await link.call(spec.Basic.Qos(prefetch_count=upstream.prefetch), spec.Basic.QosOk)
        self.consuming = False
        self._look(link)

    async def _tear_down(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
            self.watching = None
        self.consuming = False

    def topology_changed(self) -> None:
        """A consumer came (or the queue changed otherwise): look now, if no look is due."""
        if self.watching is None and self.link is not None and self.status == "running":
            self._look(self.link)

    def _look(self, link: Link) -> None:
        """Consume upstream while the federated queue is empty and a consumer with credit waits (priority 0 or
        more: RabbitMQ's active_unfederated); cancel otherwise. Looked at again every DEMAND_INTERVAL while the
        queue has consumers; without any, once one comes (topology_changed)."""
        self.watching = None
        queue = self.vhost.queues.get(self.name)
        wanted = queue is not None and not queue.has_ready() and queue.has_waiting_consumer()
        if wanted and not self.consuming:
            link.send(make_method(spec.Basic.Consume, queue=self.upstream.queue,
                                  consumer_tag=self.upstream.consumer_tag, no_ack=self.upstream.ack_mode == "no-ack",
                                  nowait=True, arguments={"x-priority": -1}))
        elif self.consuming and not wanted:
            link.send(make_method(spec.Basic.Cancel, consumer_tag=self.upstream.consumer_tag, nowait=True))
        self.consuming = wanted
        if queue is not None and queue.has_consumers():
            self.watching = asyncio.get_running_loop().call_later(DEMAND_INTERVAL, self._look, link)

    def _target(self, deliver: spec.Basic.Deliver, headers: dict) -> tuple[str, str] | None:
        hops = headers.get(RECEIVED_FROM)
        hop = {"uri": self.uri, "queue": self.name, "redelivered": deliver.redelivered}  # (the federated one's)
        if isinstance(hops, list):  # (visited before: this link's hop is counted, and moves first)
            earlier = [item for item in hops if isinstance(item, dict) and item.get("uri") == self.uri
                       and item.get("queue") == self.name]
            visits = earlier[0].get("visit-count", 0) if earlier else 0
            hops = [item for item in hops if not any(item is seen for seen in earlier)]
        else:  # (the first hop, or a header a client set: where the message was published is kept)
            headers["x-original-exchange"] = deliver.exchange
            headers["x-original-routing-key"] = deliver.routing_key
            visits, hops = 0, []
        if "CC" in headers:
            headers["x-original-cc"] = headers.pop("CC")
        hop["visit-count"] = (visits if isinstance(visits, int) else 0) + 1
        headers[RECEIVED_FROM] = [hop, *hops]
        return "", self.name
