"""A shovel at work: it connects its source and its destination, moves each message from one to the other, and
after a failure starts again once its reconnect-delay has passed.

Each message is published with ``mandatory``; in on-confirm mode a source delivery is acked only once the
destination confirmed its copy (a destination's ``multiple`` confirm acks the source the same way, the two
channels keeping one order). A message the destination returns (it routes nowhere) or nacks fails the shovel:
both connections close, every source delivery not yet acked goes back to its queue in its place, and the shovel
tries again after reconnect-delay, its state saying why meanwhile (never a loop that drops, nor a hot one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from typing import Callable

from pamqp import commands as spec

from broker.links.client import Content, Link, LinkError, Missing
from broker.links.headers import prepend_table
from broker.links.status import local_timestamp
from broker.shovel.definition import Endpoint, Shovel
from protocol.codec import LongLong, decode_properties, encode_header_payload, make_method

log = logging.getLogger(__name__)


class Stop(Exception):
    """The shovel has moved all it was to (src-delete-after): it ends and its parameter goes."""


class RunningShovel:
    """One shovel and its state, as GET /api/shovels shows it."""

    def __init__(self, shovel: Shovel, cluster_name: str, local: Callable[[], tuple[str, int]],
                 done: Callable[[Shovel], None]) -> None:
        self.shovel = shovel
        self.local = local  # this node's AMQP host and port, where a URI without a host connects
        self.cluster_name = cluster_name  # the x-shovelled header's shovelled-by
        self.done = done  # told once the shovel moved all it was to
        self.state = "starting"  # then "running", or "terminated" (and why)
        self.reason = ""
        self.said = ""  # the last failure logged: a shovel failing again for the same reason logs it once
        self.since = time.time()  # when the state last changed
        self.blocked: str | None = None  # why the destination blocked its publishes (connection.blocked)
        self.writes_paused = False  # the destination's socket does not take more now
        self.forwarded = 0  # messages published to the destination in this run (as RabbitMQ: 0 again after a failure)
        # messages left to move (src-delete-after), and those left to publish; None: no limit
        self.remaining: int | None = None
        self.remaining_unacked: int | None = None
        self.source: Link | None = None
        self.destination: Link | None = None
        self.unconfirmed: dict[int, int] = {}  # on-confirm: destination publish number -> source delivery tag
        self.published = 0  # publishes on the destination's channel this run (its confirms' numbers)
        self.failed: asyncio.Future[str | None] | None = None  # set when this run must end: why (None: done)
        self.task = asyncio.get_running_loop().create_task(self._run())

    # --- the runs ---------------------------------------------------------------------------------------------
    async def _run(self) -> None:
        shovel = self.shovel
        while True:
            try:
                await self._session()
            except Stop:
                log.info("shovel %r in vhost %r moved all it was to: deleted", shovel.name, shovel.vhost)
                self.done(shovel)
                return
            except LinkError as error:
                self._report("terminated", str(error))
                if str(error) != self.said:
                    log.warning("shovel %r in vhost %r: %s", shovel.name, shovel.vhost, error)
                    self.said = str(error)
            except Exception as error:  # (not foreseen: said, and tried again as any failure)
                self._report("terminated", repr(error))
                if repr(error) != self.said:
                    log.exception("shovel %r in vhost %r failed", shovel.name, shovel.vhost)
                    self.said = repr(error)
            if not shovel.reconnect_delay:  # (0: as RabbitMQ, a failed shovel stays terminated)
                return
            await asyncio.sleep(shovel.reconnect_delay)
            self._report("starting", "")

    async def _session(self) -> None:
        shovel = self.shovel
        self.failed = asyncio.get_running_loop().create_future()
        self.unconfirmed, self.published, self.forwarded = {}, 0, 0
        try:
            self.source = await _connect(shovel, "source", self.local(), on_content=self._delivered)
            self.destination = await _connect(shovel, "destination", self.local(), on_content=self._returned,
                                              on_confirm=self._confirmed, on_blocked=self._blocked,
                                              on_writable=self._writable)
            queue, count = await self._source_queue(self.source)
            await self._destination_queue(self.destination)
            if self.remaining is None and shovel.delete_after != "never":
                self.remaining = count if shovel.delete_after == "queue-length" else int(shovel.delete_after)
            self.remaining_unacked = self.remaining  # (what a failed run left unconfirmed is delivered again)
            if self.remaining == 0:
                raise Stop()
            if shovel.ack_mode == "on-confirm":
                await self.destination.call(spec.Confirm.Select(), spec.Confirm.SelectOk)
            if shovel.ack_mode != "no-ack":
                await self.source.call(spec.Basic.Qos(prefetch_count=shovel.prefetch), spec.Basic.QosOk)
            await self.source.call(make_method(spec.Basic.Consume, queue=queue, consumer_tag=shovel.consumer_name,
                                               no_ack=shovel.ack_mode == "no-ack", arguments=shovel.consumer_args),
                                   spec.Basic.ConsumeOk)
            self._report("running", "")
            self.said = ""
            ends = [self.failed, asyncio.ensure_future(asyncio.shield(self.source.closed)),
                    asyncio.ensure_future(asyncio.shield(self.destination.closed))]
            try:
                finished, _ = await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for end in ends[1:]:
                    end.cancel()
            why = next(iter(finished)).result()
            if why is None:
                raise Stop()
            raise LinkError(why)
        finally:
            for link in (self.source, self.destination):
                if link is not None:
                    link.close()
            self.source = self.destination = None
            self.blocked, self.writes_paused = None, False

    async def _source_queue(self, link: Link) -> tuple[str, int]:
        """The queue the shovel consumes (src-queue, or its own bound to src-exchange), and its ready messages."""
        source = self.shovel.source
        if source.queue is None:
            queue = self.shovel.exchange_queue
            declared = await link.call(make_method(spec.Queue.Declare, queue=queue, durable=True,
                                                   arguments=source.queue_args), spec.Queue.DeclareOk)
            await link.call(make_method(spec.Queue.Bind, queue=queue, exchange=source.exchange,
                                        routing_key=source.exchange_key or ""), spec.Queue.BindOk)
            return queue, declared.message_count
        return source.queue, await _ensure_queue(link, source, "source")

    async def _destination_queue(self, link: Link) -> None:
        if self.shovel.destination.queue is not None:
            await _ensure_queue(link, self.shovel.destination, "destination")

    def stop(self) -> None:
        self.task.cancel()
        for link in (self.source, self.destination):
            if link is not None:
                link.close()

    async def delete_exchange_queue(self) -> None:
        """The shovel was deleted: the queue its exchange source was read through goes too (said if it cannot)."""
        shovel = self.shovel
        if shovel.source.queue is not None:
            return
        try:
            link = await _connect(shovel, "source", self.local())
            try:
                await link.call(make_method(spec.Queue.Delete, queue=shovel.exchange_queue), spec.Queue.DeleteOk)
            finally:
                link.close()
        except LinkError as error:
            log.warning("shovel %r in vhost %r deleted, but not its queue %r at the source: %s", shovel.name,
                        shovel.vhost, shovel.exchange_queue, error)

    # --- messages, as each link reads them ------------------------------------------------------------------
    def _delivered(self, content: Content) -> None:
        deliver, header, body = content
        shovel = self.shovel
        destination, source = self.destination, self.source
        if destination is None or source is None or self._ending() or not isinstance(deliver, spec.Basic.Deliver):
            return
        if self.remaining_unacked == 0:
            return  # (left unacked: back in its queue once the shovel ends)
        if shovel.add_forward_headers or shovel.add_timestamp_header or shovel.publish_properties:
            header = self._rewritten(header, len(body))
        destination_endpoint = shovel.destination
        if destination_endpoint.queue is not None:
            exchange, routing_key = "", destination_endpoint.queue
        else:
            exchange = destination_endpoint.exchange if destination_endpoint.exchange is not None else deliver.exchange
            routing_key = (destination_endpoint.exchange_key if destination_endpoint.exchange_key is not None
                           else deliver.routing_key)
        destination.publish(exchange, routing_key, header, body, mandatory=True)
        self.forwarded += 1
        self.published += 1
        if self.remaining_unacked is not None:
            self.remaining_unacked -= 1
        if shovel.ack_mode == "on-confirm":
            self.unconfirmed[self.published] = deliver.delivery_tag
            return
        if shovel.ack_mode == "on-publish":
            source.send(spec.Basic.Ack(delivery_tag=deliver.delivery_tag))
        self._moved(1)

    def _confirmed(self, tag: int, multiple: bool, acked: bool) -> None:
        source = self.source
        if source is None or self._ending():
            return  # (once a return or a nack ended the run, nothing more is acked: all goes back to the source)
        if not acked:
            self._fail(f"the destination refused a message (basic.nack of publish {tag})")
            return
        if multiple:
            settled = [number for number in self.unconfirmed if number <= tag]
        else:
            settled = [tag] if tag in self.unconfirmed else []
        if not settled:
            return
        source_tag = self.unconfirmed[settled[-1]] if multiple else self.unconfirmed[tag]
        for number in settled:
            del self.unconfirmed[number]
        source.send(spec.Basic.Ack(delivery_tag=source_tag, multiple=multiple))
        self._moved(len(settled))

    def _returned(self, content: Content) -> None:
        returned = content[0]
        if isinstance(returned, spec.Basic.Return):
            self._fail(f"the destination returned a message: {returned.reply_code} {returned.reply_text} "
                       f"(exchange {returned.exchange!r}, routing key {returned.routing_key!r})")

    def _moved(self, count: int) -> None:
        if self.remaining is not None:
            self.remaining -= count
            if self.remaining <= 0 and self.failed is not None and not self.failed.done():
                self.failed.set_result(None)

    def _blocked(self, reason: str | None) -> None:
        self.blocked = reason
        self._hold_source()

    def _writable(self, writable: bool) -> None:
        self.writes_paused = not writable
        self._hold_source()

    def _hold_source(self) -> None:
        """Read no more from the source while the destination takes no more (blocked, or its socket full)."""
        if self.source is not None:
            self.source.hold_reading(self.blocked is not None or self.writes_paused)

    def _ending(self) -> bool:
        return self.failed is not None and self.failed.done()

    def _fail(self, why: str) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(why)

    def _rewritten(self, header: bytes, body_size: int) -> bytes:
        """The content header with dest-publish-properties, x-shovelled and x-shovelled-timestamp applied."""
        shovel = self.shovel
        properties = decode_properties(header)
        for name, value in shovel.publish_properties.items():
            if name == "timestamp":
                value = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
            setattr(properties, name, value)
        headers = dict(properties.headers or {})
        if shovel.add_forward_headers:
            hop = {"shovelled-by": self.cluster_name, "shovel-type": "dynamic", "shovel-name": shovel.name,
                   "shovel-vhost": shovel.vhost, "src-uri": shovel.src_uri, "dest-uri": shovel.dest_uri,
                   **{key.replace("_", "-"): value for key, value in shovel.source.shown("src").items()},
                   **{key.replace("_", "-"): value for key, value in shovel.destination.shown("dest").items()}}
            prepend_table(headers, "x-shovelled", hop)
        if shovel.add_timestamp_header:
            headers["x-shovelled-timestamp"] = LongLong(time.time())  # (a long, as RabbitMQ's)
        properties.headers = headers or None
        return encode_header_payload(body_size, properties)

    # --- what the API shows -----------------------------------------------------------------------------------
    def _report(self, state: str, reason: str) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    def status(self) -> dict:
        """The shovel's entry in GET /api/shovels, as RabbitMQ 4.1 shows it."""
        shovel = self.shovel
        entry = status_entry(shovel.vhost, shovel.name, self.since)
        if self.state == "terminated":
            return {**entry, "state": "terminated", "reason": self.reason}
        if self.state == "starting":
            return {**entry, "state": "starting"}
        blocked = "blocked" if self.blocked is not None else "flow" if self.writes_paused else "running"
        remaining = "unlimited" if self.remaining is None else self.remaining
        unacked = "unlimited" if self.remaining_unacked is None else self.remaining_unacked
        return {**entry, "state": blocked, "blocked_status": blocked, "forwarded": self.forwarded,
                "pending": 0, "remaining": remaining, "remaining_unacked": unacked,
                "src_uri": shovel.src_uri, "src_protocol": "amqp091", "dest_uri": shovel.dest_uri,
                "dest_protocol": "amqp091", **shovel.source.shown("src"), **shovel.destination.shown("dest")}


def status_entry(vhost: str, name: str, since: float) -> dict:
    """What every shovel's entry in GET /api/shovels has: RabbitMQ's keys, its timestamp of the last change of
    state."""
    return {"name": name, "vhost": vhost, "type": "dynamic", "timestamp": local_timestamp(since)}


async def _connect(shovel: Shovel, side: str, local: tuple[str, int], **handlers) -> Link:
    """A link to the first of the side's URIs that answers (one without a host: this node, at local), named as
    RabbitMQ names a shovel's connections."""
    failures = []
    for address in (shovel.source if side == "source" else shovel.destination).addresses():
        if address.local:
            address = dataclasses.replace(address, host=local[0], port=local[1])
        try:
            return await Link.open(address, address.connection_timeout, f"Shovel {shovel.name}", "Warren shovel",
                                   **handlers)
        except LinkError as error:
            failures.append(str(error))
    raise LinkError(f"failed to connect to {side}: {'; '.join(failures)}")


async def _ensure_queue(link: Link, endpoint: Endpoint, side: str) -> int:
    """The endpoint's queue, declared durable if it is missing (unless predeclared); its ready messages."""
    assert endpoint.queue is not None
    try:
        found = await link.passive(make_method(spec.Queue.Declare, queue=endpoint.queue, passive=True),
                                   spec.Queue.DeclareOk)
        return found.message_count
    except Missing as missing:
        if endpoint.predeclared:
            raise LinkError(f"failed to set up topology: the {side}'s queue {endpoint.queue!r}: {missing}") from None
    except LinkError as error:
        raise LinkError(f"failed to set up topology: the {side}'s queue {endpoint.queue!r}: {error}") from None
    await link.call(make_method(spec.Queue.Declare, queue=endpoint.queue, durable=True,
                                arguments=endpoint.queue_args), spec.Queue.DeclareOk)
    return 0
