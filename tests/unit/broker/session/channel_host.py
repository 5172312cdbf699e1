"""A connection as a channel sees it (broker.session.interfaces.ChannelHost), with no socket: the channel unit
tests open channels on it, feed them frames as a client would send them, and read back what the channel wrote."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands as spec
from pamqp.base import Frame

from broker.model.node import Node
from broker.session.channel import Channel
from broker.session.limits import ChannelLimits
from broker.session.settlement import SETTLE_SLICE
from protocol.codec import decode_method, decode_properties, encode_content, encode_header_payload, encode_method
from protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from protocol.errors import AMQPError, close_for
from protocol.framing import FrameReader

FRAME_MAX = 131072
DISPATCH_ROUNDS = 10_000  # a bound on the dispatcher's rounds in one turn(): more means a queue never runs dry
MANY = 3 * SETTLE_SLICE + 5  # deliveries that one multiple ack settles over several loop turns
SETTLED_WITHIN = 30.0  # seconds a settlement of many may take (each of its slices ends after 5 ms of the clock)


class Host:
    """One connection on a node of its own, kept in memory, with guest logged in to vhost "/"."""

    def __init__(self, default_consumer_prefetch: int = 0) -> None:
        node = Node()
        node.bootstrap("/", "guest", "guest")
        self.vhost = node.vhosts["/"]
        self.user = "guest"
        self.frame_max = FRAME_MAX
        self.write_paused = False
        self.client_capabilities: dict = {"consumer_cancel_notify": True}
        self.exclusive_queues: set = set()
        self.limits = ChannelLimits(node, 1 << 27, default_consumer_prefetch, 1_800_000, 1 << 30)
        self.channels: dict[int, Channel] = {}
        self.failures: list[tuple[int, str]] = []  # (reply code, reply text) of each error that closed something
        self.blocked = False
        self._written = FrameReader(0)  # what the channels wrote, not read back yet
        self._out = bytearray()

    # --- ChannelHost --------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self._out += data

    def block(self, reason: str) -> None:
        self.blocked = True

    def unblock(self) -> None:
        self.blocked = False

    def throttle(self, queue) -> None:
        pass

    def unthrottle(self, queue) -> None:
        pass

    def hold_reading_for(self, channel: Channel) -> None:
        pass

    def replay(self, channel: Channel, frames: list) -> None:
        for frame_type, _, payload in frames:
            self._handle(channel, frame_type, payload)

    def failed(self, error: AMQPError, channel: Channel | None) -> None:
        """As a connection: a soft error closes its channel, a hard one every channel (the connection)."""
        self.failures.append((error.reply_code, error.text))
        if channel is None or close_for(error, True).connection:
            closing = list(self.channels)
        else:
            closing = [channel.number]
        for number in closing:
            if number in self.channels:
                self.close_channel(number, send_close_ok=False)

    def close_channel(self, number: int, send_close_ok: bool) -> None:
        self.channels.pop(number).shutdown()

    # --- the client's side ----------------------------------------------------------------------------------
    def open(self, number: int = 1) -> Channel:
        channel = self.channels[number] = Channel(self, number)
        return channel

    def send(self, channel: Channel, *methods: Frame) -> list:
        """Send methods on channel as one read, then let its queues deliver; what the channel wrote back."""
        return self.send_frames(channel, b"".join(encode_method(channel.number, method) for method in methods))

    def publish(self, channel: Channel, routing_key: str, *bodies: bytes, exchange: str = "",
                mandatory: bool = False, properties: spec.Basic.Properties | None = None) -> list:
        """Publish each body (one read), then let queues deliver; what the channel wrote back."""
        header = properties or spec.Basic.Properties()
        frames = b"".join(encode_method(channel.number, spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                                           mandatory=mandatory))
                          + encode_content(channel.number, encode_header_payload(len(body), header), body, FRAME_MAX)
                          for body in bodies)
        return self.send_frames(channel, frames)

    def send_frames(self, channel: Channel, data: bytes) -> list:
        for frame_type, _, payload in FrameReader(0).feed(data):
            if channel.number not in self.channels:
                break
            self._handle(channel, frame_type, payload)
        if channel.open:
            channel.read_processed()
        return self.turn()

    def turn(self) -> list:
        """The end of an event-loop turn and of those the dispatcher carries its queues over (its turn is bounded in
        time: a busy machine leaves some for the next): queues deliver all they can; what was written meanwhile,
        decoded: methods as pamqp methods, content as (properties, body)."""
        dispatcher = self.vhost.dispatcher
        dispatcher.run()
        for _ in range(DISPATCH_ROUNDS):
            if not dispatcher.pending:
                break
            dispatcher.run()
        else:
            raise AssertionError(f"queues still dispatching after {DISPATCH_ROUNDS} rounds")
        data, self._out = bytes(self._out), bytearray()
        received: list = []
        for frame_type, _, payload in self._written.feed(data):
            if frame_type == FRAME_METHOD:
                received.append(decode_method(payload))
            elif frame_type == FRAME_HEADER:
                received.append((decode_properties(payload), b""))
            elif frame_type == FRAME_BODY:
                properties, body = received[-1]
                received[-1] = (properties, body + payload)
        return received

    def _handle(self, channel: Channel, frame_type: int, payload: bytes) -> None:
        try:
            channel.handle_frame(frame_type, payload)
        except AMQPError as error:
            self.failed(error, channel)


def bodies(received: list) -> list[bytes]:
    """The bodies of the deliveries (or returns, or get-oks) among what a channel wrote."""
    return [item[1] for item in received if isinstance(item, tuple)]


def methods(received: list, kind: type) -> list:
    """The methods of one kind among what a channel wrote."""
    return [item for item in received if isinstance(item, kind)]


def consuming(host: Host, queue: str, count: int, prefetch: int = 0):
    """A channel consuming queue with manual acks after count messages m0.. were published to it; the deliveries."""
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue=queue), spec.Basic.Qos(prefetch_count=prefetch))
    host.publish(channel, queue, *[f"m{number}".encode() for number in range(count)])
    received = host.send(channel, spec.Basic.Consume(queue=queue, consumer_tag="c"))
    return channel, methods(received, spec.Basic.Deliver)


def ready(host: Host, queue: str) -> list[bytes]:
    """The queue's ready messages, head first (taken with basic.get, no ack, on a channel of their own)."""
    channel = host.channels.get(9) or host.open(9)
    taken = []
    while True:
        received = host.send(channel, spec.Basic.Get(queue=queue, no_ack=True))
        if methods(received, spec.Basic.GetEmpty):
            return taken
        taken += bodies(received)


def consuming_many(host: Host, queue: str):
    """A channel with MANY deliveries of queue unacked."""
    channel, delivered = consuming(host, queue, MANY)
    assert len(delivered) == MANY
    return channel


async def settled(host: Host, channel) -> list:
    """Let the loop turn until the channel's settlements of many deliveries are done; what it wrote meanwhile. A
    slice stops after 5 ms of the clock, so a busy machine takes more turns: waited for SETTLED_WITHIN seconds,
    not for a number of turns."""
    received = []
    deadline = time.monotonic() + SETTLED_WITHIN
    while time.monotonic() < deadline:
        received += host.turn()
        if not channel.settling:
            return received + host.turn()
        await asyncio.sleep(0)  # one loop turn: the settlement's next slice
    raise AssertionError(f"{len(channel.settling)} settlements still under way after {SETTLED_WITHIN} s")
