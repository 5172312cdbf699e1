"""A client's end of one AMQP 0-9-1 connection with one channel, over asyncio: what a shovel speaks to its source
and its destination, and a federation link to its upstream. Frames are read and written by the protocol package;
deliveries, confirms and returns are handed to their owner as they are read (no task or future per message); a
method that has a reply is awaited."""

from __future__ import annotations

import asyncio
import ssl
from typing import Callable, cast

from pamqp import commands as spec
from pamqp.base import Frame

from broker.links.uri import Address
from protocol.codec import decode_method, encode_content, encode_method, make_method
from protocol.constants import (
    FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE, NOT_FOUND, PROTOCOL_HEADER,
    REPLY_SUCCESS)
from protocol.errors import AMQPError
from protocol.framing import FrameReader

CHANNEL = 1  # the channel a link moves messages on
SIDE_CHANNEL = 2  # and one where a queue is looked for (a 404 closes that channel alone)
FRAME_MAX = 131072  # the largest frame the link asks for, and reads: a larger one fails the link
REPLY_TIMEOUT = 30.0  # seconds a method's reply may take (a peer that never answers fails the link)
MAX_BODY = 536870912  # bytes of a message's body read at most (RabbitMQ's largest max_message_size): more fails
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
CLIENT_PROPERTIES = {
    "platform": "Python",
    "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                     "connection.blocked": True, "authentication_failure_close": True},
}

# (method, header payload, body) of a delivery or a return
Content = tuple[Frame, bytes, bytes]


class LinkError(Exception):
    """The connection failed or was closed; the text says how (a refusal, a close by the peer, a timeout)."""


class Missing(LinkError):
    """What a passive declare looked for is not there (404): the text is the peer's."""


class Link(asyncio.Protocol):
    """One connection and its channel. ``on_content`` takes each delivery and return once whole, ``on_confirm``
    each basic.ack and basic.nack (delivery tag, multiple, acked), ``on_blocked`` the peer's connection.blocked
    (its reason) and connection.unblocked (None), ``on_writable`` whether the socket takes more now; ``closed`` is
    done once the connection is gone, with why."""

    def __init__(self, on_content: Callable[[Content], None] = lambda content: None,
                 on_confirm: Callable[[int, bool, bool], None] = lambda tag, multiple, acked: None,
                 on_blocked: Callable[[str | None], None] = lambda reason: None,
                 on_writable: Callable[[bool], None] = lambda writable: None) -> None:
        self.on_content = on_content
        self.on_confirm = on_confirm
        self.on_blocked = on_blocked
        self.on_writable = on_writable  # told when the socket's buffer fills (False) and drains (True)
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()  # why it ended
        self.frame_max = FRAME_MAX  # as tuned with the peer
        self.server_properties: dict = {}  # the peer's connection.start (its cluster_name names it to federation)
        self._reader = FrameReader(FRAME_MAX)
        self._waiting: tuple[asyncio.Future, tuple[type, ...]] | None = None  # a method's future and its replies
        self._content: list = []  # the method of a delivery or return being read, then its header payload, body parts
        self._body_left = 0  # bytes of that content still to come
        self._heard = True  # a frame came since the last heartbeat check
        self._heartbeat: asyncio.TimerHandle | None = None

    # --- opening ----------------------------------------------------------------------------------------------
    @classmethod
    async def open(cls, address: Address, timeout: float, name: str, product: str, **handlers) -> "Link":
        """Connect as the connection name and product (shown by the peer's API), log in, open the vhost and the
        channel; LinkError saying why not."""
        loop = asyncio.get_running_loop()
        link: Link | None = None
        try:
            context = _tls_context(address) if address.tls else None
            async with asyncio.timeout(timeout):
                _, link = await loop.create_connection(lambda: cls(**handlers), address.host, address.port,
                                                       ssl=context)
                await link._handshake(address, name, product)
        except (OSError, TimeoutError, ssl.SSLError, LinkError) as error:
            if link is not None:
                link.close()
            raise LinkError(f"cannot connect to {address.shown}: {error or 'timed out'}") from None
        except asyncio.CancelledError:  # (its owner stopped meanwhile: the connection goes too)
            if link is not None:
                link.close()
            raise
        return link

    async def _handshake(self, address: Address, name: str, product: str) -> None:
        assert self.transport is not None
        self.transport.write(PROTOCOL_HEADER)
        start = await self._reply((spec.Connection.Start,))
        self.server_properties = dict(start.server_properties or {})
        mechanisms = start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else str(start.mechanisms)
        if "PLAIN" not in mechanisms.split():
            raise LinkError(f"{address.shown} does not offer PLAIN authentication")
        response = f"\0{address.user}\0{address.password}"
        properties = {**CLIENT_PROPERTIES, "product": product, "connection_name": name}
        tune = await self.call(spec.Connection.StartOk(client_properties=properties, mechanism="PLAIN",
                                                       response=response), spec.Connection.Tune, channel=0)
        self.frame_max = max(FRAME_MIN_SIZE, min(FRAME_MAX, tune.frame_max or FRAME_MAX))
        heartbeat = min(address.heartbeat, tune.heartbeat) if address.heartbeat and tune.heartbeat else (
            address.heartbeat or tune.heartbeat)
        self._write(0, spec.Connection.TuneOk(channel_max=SIDE_CHANNEL, frame_max=self.frame_max, heartbeat=heartbeat))
        await self.call(spec.Connection.Open(virtual_host=address.vhost), spec.Connection.OpenOk, channel=0)
        if heartbeat:
            self._beat(heartbeat)
        await self.call(spec.Channel.Open(), spec.Channel.OpenOk)

    # --- methods ----------------------------------------------------------------------------------------------
    async def call(self, method: Frame, *replies: type, channel: int = CHANNEL) -> Frame:
        """Send a method and wait for its reply (one of replies); LinkError if the connection ends first."""
        self._write(channel, method)
        return await self._reply(replies)

    async def _reply(self, replies: tuple[type, ...]) -> Frame:
        if self.closed.done():
            raise LinkError(self.closed.result())
        if self._waiting is not None:  # (one method at a time: its owner's code is wrong)
            raise LinkError("a method was sent while another's reply is awaited")
        future = asyncio.get_running_loop().create_future()
        self._waiting = future, replies
        closed = asyncio.ensure_future(asyncio.shield(self.closed))
        try:
            await asyncio.wait((future, closed), timeout=REPLY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            self._waiting = None
        if not future.done():
            if not self.closed.done():
                awaited = " or ".join(reply.__name__ for reply in replies)
                self._fail(f"no reply ({awaited}) within {REPLY_TIMEOUT:g} s")
            raise LinkError(self.closed.result())
        return future.result()

    async def passive(self, declare: Frame, reply: type) -> Frame:
        """The reply to a passive declare (of an exchange or a queue): Missing for a 404, LinkError for any other
        refusal. It runs on a channel of its own, which a refusal closes, the link going on."""
        await self.call(spec.Channel.Open(), spec.Channel.OpenOk, channel=SIDE_CHANNEL)
        answer = await self.call(declare, reply, spec.Channel.Close, channel=SIDE_CHANNEL)
        if isinstance(answer, spec.Channel.Close):
            refusal = f"{answer.reply_code} {answer.reply_text}"
            raise Missing(refusal) if answer.reply_code == NOT_FOUND else LinkError(refusal)
        await self.call(spec.Channel.Close(reply_code=REPLY_SUCCESS, reply_text="", class_id=0, method_id=0),
                        spec.Channel.CloseOk, channel=SIDE_CHANNEL)
        return answer

    def send(self, method: Frame) -> None:
        """Send a method that has no reply (an ack, a nack)."""
        self._write(CHANNEL, method)

    def publish(self, exchange: str, routing_key: str, header_payload: bytes, body: bytes,
                mandatory: bool) -> None:
        """Publish a message whose content header is header_payload, as given."""
        if self.transport is None or self.transport.is_closing():
            return
        publish = make_method(spec.Basic.Publish, exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        self.transport.write(encode_method(CHANNEL, publish)
                             + encode_content(CHANNEL, header_payload, body, self.frame_max))

    def close(self, reason: str = "closed by its owner") -> None:
        """Close the connection (its unacked deliveries go back to their queue) and say why it ended."""
        if self.transport is not None and not self.transport.is_closing():
            self._write(0, spec.Connection.Close(reply_code=REPLY_SUCCESS, reply_text="closing", class_id=0,
                                                 method_id=0))
            self.transport.close()
        self._end(reason)

    def _write(self, channel: int, method: Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(encode_method(channel, method))

    # --- asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is one, though not by its class)

    def pause_writing(self) -> None:
        self.on_writable(False)

    def resume_writing(self) -> None:
        self.on_writable(True)

    def hold_reading(self, held: bool) -> None:
        """Stop reading from the peer (its deliveries wait in the kernel, then in the peer), or go on."""
        if self.transport is not None and not self.transport.is_closing():
            if held:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def connection_lost(self, error: Exception | None) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._end(f"connection lost: {error}" if error else "connection closed by the peer")

    def data_received(self, data: bytes) -> None:
        self._heard = True
        try:
            for frame_type, channel, payload in self._reader.feed(data):
                if frame_type == FRAME_METHOD:
                    self._method(channel, decode_method(payload))
                elif frame_type == FRAME_HEADER and self._content and len(self._content) == 1:
                    self._content.append(payload)
                    self._body_left = int.from_bytes(payload[4:12], "big")
                    if self._body_left > MAX_BODY:
                        raise LinkError(f"a message of {self._body_left} bytes, over {MAX_BODY}")
                    self._content_read()
                elif frame_type == FRAME_BODY and len(self._content) >= 2:
                    self._content.append(payload)
                    self._body_left -= len(payload)
                    self._content_read()
                elif frame_type != FRAME_HEARTBEAT:
                    raise LinkError(f"unexpected frame of type {frame_type} on channel {channel}")
        except (AMQPError, LinkError, ValueError) as error:
            self._fail(f"the peer sent what cannot be read: {error}")

    def _content_read(self) -> None:
        if self._body_left <= 0:
            method, header, *parts = self._content
            self._content = []
            self.on_content((method, header, b"".join(parts)))

    def _method(self, channel: int, method: Frame) -> None:
        if isinstance(method, (spec.Basic.Deliver, spec.Basic.Return)):
            self._content = [method]
        elif isinstance(method, (spec.Basic.Ack, spec.Basic.Nack)):
            self.on_confirm(method.delivery_tag, method.multiple, isinstance(method, spec.Basic.Ack))
        elif isinstance(method, spec.Connection.Blocked):
            self.on_blocked(method.reason or "blocked")
        elif isinstance(method, spec.Connection.Unblocked):
            self.on_blocked(None)
        elif isinstance(method, spec.Channel.Close) and channel != CHANNEL and self._waiting is not None:
            self._write(channel, spec.Channel.CloseOk())  # (a side channel's check failed: its caller decides)
            if not self._waiting[0].done():
                self._waiting[0].set_result(method)
        elif isinstance(method, (spec.Connection.Close, spec.Channel.Close)):
            self._write(channel, spec.Connection.CloseOk() if channel == 0 else spec.Channel.CloseOk())
            self._fail(f"{'connection' if channel == 0 else 'channel'} closed by the peer: {method.reply_code} "
                       f"{method.reply_text}")
        elif isinstance(method, spec.Basic.Cancel):
            self._fail(f"the peer cancelled the consumer {method.consumer_tag!r} (its queue was deleted?)")
        elif self._waiting is not None and isinstance(method, self._waiting[1]):
            if not self._waiting[0].done():
                self._waiting[0].set_result(method)
        else:
            self._fail(f"unexpected {method.name} from the peer")

    def _beat(self, interval: int) -> None:
        """Send a heartbeat every half interval, and give up on a peer silent for two intervals."""
        checks = 0

        def tick() -> None:
            nonlocal checks
            if self.transport is None or self.transport.is_closing():
                return
            self.transport.write(HEARTBEAT_FRAME)
            checks = 0 if self._heard else checks + 1
            self._heard = False
            if checks >= 4:
                self._fail(f"missed heartbeats from the peer for {2 * interval} s")
                return
            self._heartbeat = asyncio.get_running_loop().call_later(interval / 2, tick)

        self._heartbeat = asyncio.get_running_loop().call_later(interval / 2, tick)

    def _fail(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.close()
        self._end(reason)

    def _end(self, reason: str) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)


def _tls_context(address: Address) -> ssl.SSLContext:
    """amqps: the peer's certificate checked against cacertfile (the system's CAs without one) unless verify_none;
    this side's certificate for a peer that asks for one."""
    context = ssl.create_default_context(cafile=address.cacertfile)
    if not address.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if address.certfile:
        context.load_cert_chain(address.certfile, address.keyfile)
    return context
