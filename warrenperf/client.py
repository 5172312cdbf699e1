"""A lean AMQP 0-9-1 client for load generation.

pamqp encodes the handshake and every rare frame; publishes and acks are pre-built bytes; incoming frames are split
from a bytearray with an offset, and basic.deliver / basic.ack / basic.nack are counted from a few fixed offsets
without being decoded. The client's own cost per message stays far below a broker's, so the broker is what is measured.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pamqp import body, commands, frame, header

_FRAME_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size
_METHOD_ID = struct.Struct(">I")  # class id and method id read as one number
_DELIVERY_TAG = struct.Struct(">Q")
_ACK_FRAME = struct.Struct(">BHIHHQBB")  # a whole basic.ack frame: header, class, method, tag, multiple, frame end
STAMP = struct.Struct(">Q")  # a latency-stamped body starts with the monotonic clock (ns) at its publishing

FRAME_METHOD = 1
FRAME_BODY = 3
FRAME_END = 0xCE
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120
WRITE_BUFFER_HIGH = 256 * 1024  # bytes queued in the transport before a publisher waits


class BrokerClosed(Exception):
    """The broker closed the channel or the connection (or the socket dropped)."""


@dataclass(frozen=True)
class BrokerURL:
    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool = False  # amqps: over TLS, the server's certificate not checked (loopback benchmarks only)

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        parts = urlsplit(url)
        vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        return cls(parts.hostname or "127.0.0.1", parts.port or 5672, unquote(parts.username or "guest"),
                   unquote(parts.password or "guest"), vhost, parts.scheme == "amqps")


def message_frames(channel: int, exchange: str, routing_key: str, payload: bytes, persistent: bool = False) -> bytes:
    """The three frames of one basic.publish, ready to be written (or repeated) as they are."""
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else None)
    return b"".join((
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel),
        frame.marshal(header.ContentHeader(body_size=len(payload), properties=properties), channel),
        frame.marshal(body.ContentBody(payload), channel),
    ))


class DeliveryCounter:
    """Counts the deliveries of one consumer and, with manual acks, acknowledges them as they arrive."""

    def __init__(self, channel: int, ack_every: int = 0, target: int | None = None, stamped: bool = False) -> None:
        self.delivered = 0  # deliveries received so far
        # seconds from publishing to arrival, when bodies start with their publishing time (warrenperf.roles)
        self.latencies: list[float] | None = [] if stamped else None
        self.reads_bodies = stamped  # the connection hands each body frame to on_body
        self._channel = channel
        self._ack_every = ack_every  # 0: auto-ack; 1: ack each delivery; N > 1: one multiple ack every N deliveries
        self._since_ack = 0  # deliveries received since the last ack sent
        self._target = target  # delivery count that resolves `reached`
        self.reached: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_deliver(self, delivery_tag: int, outgoing: list[bytes]) -> None:
        self.delivered += 1
        if self._ack_every:
            self._since_ack += 1
            if self._since_ack >= self._ack_every:
                outgoing.append(_ACK_FRAME.pack(FRAME_METHOD, self._channel, 13, 60, 80, delivery_tag,
                                                self._ack_every > 1, FRAME_END))
                self._since_ack = 0
        if self.delivered == self._target and not self.reached.done():
            self.reached.set_result(None)

    def on_body(self, body: bytearray, offset: int) -> None:
        """A body that starts with the monotonic clock (ns) at its publishing arrived."""
        self.latencies.append((time.monotonic_ns() - STAMP.unpack_from(body, offset)[0]) / 1e9)

    def fail(self, error: Exception) -> None:
        if not self.reached.done():
            self.reached.set_exception(error)


class ConfirmTracker:
    """Publisher confirms of one channel; with a single queue the broker confirms in tag order."""

    def __init__(self, window: int, record_latency: bool) -> None:
        self.window = window  # most publishes left unconfirmed at once
        self.published = 0  # publishes sent (their tags are 1..published)
        self.confirmed = 0  # publishes acked or nacked
        self.nacked = 0  # publishes the broker refused
        self.latencies: list[float] | None = [] if record_latency else None  # seconds per confirm (window 1)
        self.sent_at = 0.0  # perf_counter() of the last publish, for latencies
        self._room: asyncio.Future[None] | None = None  # resolved when the window has room again

    @property
    def outstanding(self) -> int:
        return self.published - self.confirmed

    def on_confirm(self, delivery_tag: int, multiple: bool, acked: bool) -> None:
        newly = delivery_tag - self.confirmed if multiple else 1
        self.confirmed += newly
        if not acked:
            self.nacked += newly
        if self.latencies is not None:
            self.latencies.append(time.perf_counter() - self.sent_at)
        if self._room is not None and not self._room.done() and self.outstanding < self.window:
            self._room.set_result(None)

    async def wait_for_room(self, limit: int | None = None) -> None:
        """Wait until fewer than `limit` (default: the window) publishes are unconfirmed."""
        limit = self.window if limit is None else limit
        while self.outstanding >= max(limit, 1):
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def wait_for_all(self) -> None:
        while self.outstanding:
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    def fail(self, error: Exception) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_exception(error)


class _Channel:
    """What the reader needs to know about one channel."""

    __slots__ = ("inbox", "counter", "confirms")

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[object] = asyncio.Queue()  # rare method frames (replies) or a BrokerClosed
        self.counter: DeliveryCounter | None = None  # the consumer on this channel, if any
        self.confirms: ConfirmTracker | None = None  # set after confirm.select

    def fail(self, error: BrokerClosed) -> None:
        self.inbox.put_nowait(error)
        if self.counter is not None:
            self.counter.fail(error)
        if self.confirms is not None:
            self.confirms.fail(error)


class BenchConnection(asyncio.Protocol):
    """One AMQP connection: handshake and RPCs through pamqp, deliveries and confirms through fixed offsets."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()  # received bytes not yet split into whole frames
        self._channels: dict[int, _Channel] = {0: _Channel()}
        self._outgoing: list[bytes] = []  # acks produced while reading one chunk, written together at its end
        self._writable = asyncio.Event()  # cleared while the transport's write buffer is over its high mark
        self._writable.set()
        self._next_channel = 1
        self.frame_max = 131072
        self._closing = False  # we sent connection.close

    @classmethod
    async def open(cls, url: BrokerURL) -> BenchConnection:
        tls = None
        if url.tls:
            tls = ssl.create_default_context()
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        _, connection = await asyncio.get_running_loop().create_connection(cls, url.host, url.port, ssl=tls)
        try:
            await connection._handshake(url)
        except BaseException:
            connection.transport.abort()
            raise
        return connection

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        if not self._closing:
            error = BrokerClosed(f"connection lost: {exc}")
            for channel in self._channels.values():
                channel.fail(error)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        end = len(buffer)
        offset = 0
        channels = self._channels
        while end - offset >= 8:
            frame_type, channel, size = _FRAME_HEADER.unpack_from(buffer, offset)
            frame_end = offset + 7 + size  # index of the frame-end octet
            if frame_end >= end:
                break
            if frame_type == FRAME_METHOD:
                method_id = _METHOD_ID.unpack_from(buffer, offset + 7)[0]
                if method_id == BASIC_DELIVER:
                    tag_at = offset + 12 + buffer[offset + 11]  # after the consumer tag (a short string)
                    channels[channel].counter.on_deliver(_DELIVERY_TAG.unpack_from(buffer, tag_at)[0],
                                                         self._outgoing)
                elif method_id == BASIC_ACK or method_id == BASIC_NACK:
                    channels[channel].confirms.on_confirm(_DELIVERY_TAG.unpack_from(buffer, offset + 11)[0],
                                                          bool(buffer[offset + 19] & 1), method_id == BASIC_ACK)
                else:
                    self._on_method(channel, frame.unmarshal(bytes(buffer[offset:frame_end + 1]))[2])
            elif frame_type == FRAME_BODY:
                counter = channels[channel].counter
                if counter is not None and counter.reads_bodies:
                    counter.on_body(buffer, offset + 7)
            offset = frame_end + 1  # content headers, other bodies and heartbeats are skipped
        del buffer[:offset]
        if self._outgoing:
            self.transport.write(b"".join(self._outgoing))
            self._outgoing.clear()

    def _on_method(self, channel: int, method: object) -> None:
        if isinstance(method, commands.Connection.Close):
            self.transport.write(frame.marshal(commands.Connection.CloseOk(), 0))
            self.transport.close()
            self._closing = True
            error = BrokerClosed(f"connection closed: {method.reply_code} {method.reply_text}")
            for state in self._channels.values():
                state.fail(error)
        elif isinstance(method, commands.Channel.Close):
            self.transport.write(frame.marshal(commands.Channel.CloseOk(), channel))
            self._channels[channel].fail(BrokerClosed(f"channel closed: {method.reply_code} {method.reply_text}"))
        elif not isinstance(method, (commands.Basic.Return, commands.Channel.Flow)):
            self._channels[channel].inbox.put_nowait(method)

    # requests

    async def _reply(self, channel: int, expected: type) -> object:
        reply = await self._channels[channel].inbox.get()
        if isinstance(reply, BrokerClosed):
            raise reply
        if not isinstance(reply, expected):
            raise BrokerClosed(f"expected {expected.__name__}, got {reply!r}")
        return reply

    def _send_method(self, channel: int, method: object) -> None:
        self.transport.write(frame.marshal(method, channel))

    async def rpc(self, channel: int, method: object, expected: type) -> object:
        self._send_method(channel, method)
        return await self._reply(channel, expected)

    async def _handshake(self, url: BrokerURL) -> None:
        self.transport.write(frame.marshal(header.ProtocolHeader(), 0))
        await self._reply(0, commands.Connection.Start)
        self._send_method(0, commands.Connection.StartOk(
            client_properties={"product": "warren-perf", "capabilities": {
                "publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                "authentication_failure_close": True}},  # a refused login is told why (connection.close 403)
            mechanism="PLAIN", response=f"\0{url.user}\0{url.password}"))
        tune = await self._reply(0, commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or 131072, 131072)
        self._send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                                        frame_max=self.frame_max, heartbeat=0))
        await self.rpc(0, commands.Connection.Open(virtual_host=url.vhost), commands.Connection.OpenOk)

    async def open_channel(self) -> int:
        channel = self._next_channel
        self._next_channel += 1
        self._channels[channel] = _Channel()
        await self.rpc(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        return channel

    async def declare_queue(self, channel: int, name: str, durable: bool = False, passive: bool = False) -> int:
        """Declare a queue; returns its message count."""
        reply = await self.rpc(channel, commands.Queue.Declare(queue=name, durable=durable, passive=passive),
                               commands.Queue.DeclareOk)
        return reply.message_count

    async def delete_queue(self, channel: int, name: str) -> None:
        await self.rpc(channel, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)

    async def declare_exchange(self, channel: int, name: str, kind: str) -> None:
        await self.rpc(channel, commands.Exchange.Declare(exchange=name, exchange_type=kind),
                       commands.Exchange.DeclareOk)

    async def delete_exchange(self, channel: int, name: str) -> None:
        await self.rpc(channel, commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)

    async def bind_queue(self, channel: int, queue: str, exchange: str, routing_key: str = "") -> None:
        await self.rpc(channel, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key),
                       commands.Queue.BindOk)

    async def qos(self, channel: int, prefetch_count: int) -> None:
        await self.rpc(channel, commands.Basic.Qos(prefetch_count=prefetch_count), commands.Basic.QosOk)

    async def consume(self, channel: int, queue: str, counter: DeliveryCounter, no_ack: bool) -> None:
        self._channels[channel].counter = counter
        await self.rpc(channel, commands.Basic.Consume(queue=queue, no_ack=no_ack), commands.Basic.ConsumeOk)

    async def select_confirms(self, channel: int, tracker: ConfirmTracker) -> None:
        self._channels[channel].confirms = tracker
        await self.rpc(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)

    async def send(self, data: bytes) -> None:
        """Write pre-built frames; waits while the broker does not keep up, else yields once to let reads run."""
        if self.transport.is_closing():  # uvloop refuses a write to a closed transport with a RuntimeError
            raise BrokerClosed("connection lost while publishing")
        self.transport.write(data)
        if self._writable.is_set():
            await asyncio.sleep(0)
        else:
            await self._writable.wait()
        if self.transport.is_closing() and not self._closing:
            raise BrokerClosed("connection lost while publishing")

    async def close(self) -> None:
        self._closing = True
        if self.transport.is_closing():
            return
        goodbye = commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0)
        await self.rpc(0, goodbye, commands.Connection.CloseOk)
        self.transport.close()
