"""The front door of a node whose vhosts are led by processes of other nodes too (a cluster of worker processes,
cluster.worker): it answers a client's handshake up to connection.open *without checking the login*,
keeping every byte the client sent after its protocol header, and reads the vhost from connection.open. The client
then goes to the process that leads that vhost, which reads those bytes through its ordinary handshake, checks the
login there, and leaves unsent the frames the front door answered (connection.start, and connection.tune once a
start-ok came):

- a worker of this node: the socket is handed over with the bytes (broker.connection.handoff);
- a worker of another node: a TCP connection to that node's AMQP port carries a PROXY v2 header naming the client
  (and saying whether it speaks TLS here), the protocol header and the bytes; the frames that node's front door
  answers first (the ones this one answered already) are dropped, and the two sockets are spliced. A connection
  that came that way (a PROXY header from a member) goes to a worker of this node or nowhere, so that two nodes
  that disagree cannot pass it round. A PROXY header from an address not among the members known here has the
  members read again before it is judged.

What the front door cannot read as a handshake (a malformed frame, a method out of place, a start-ok past the size
a handshake frame may have) it does not judge: the client goes to the leader of the default group with what it
sent, and that worker's handshake gives the error any broker would. Only a wrong protocol header is answered here,
as a worker answers it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Union

from pamqp import commands as spec

from broker.config import Config
from broker.connection import greeting, handoff
from broker.connection.connection import HANDSHAKE_TIMEOUT
from broker.connection.peer_log import PeerLog
from broker.connection.splice import SpliceEnd
from protocol import proxy_header, stream_start
from protocol.codec import decode_method, encode_method
from protocol.constants import (
    CONNECTION_FORCED, FRAME_END, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE, INTERNAL_ERROR, PROTOCOL_HEADER,
)
from protocol.errors import AMQPError
from protocol.framing import FrameReader

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

START_OK, TUNE_OK, OPEN = (10, 11), (10, 31), (10, 40)  # (class, method) of the handshake's client methods
_METHOD_ID = struct.Struct(">HH")
_FRAME_HEADER = struct.Struct(">BHI")
# Bytes a handshake may hold before connection.open: a start-ok, tune-ok and open of the largest size a handshake
# frame may have, and then some. A client that sends more goes to the default group's leader, which judges it.
HANDSHAKE_LIMIT = 4 * FRAME_MIN_SIZE
CONNECT_TIMEOUT = 2.0  # seconds the leading node has to accept a forwarded client before it is told to come again
TURNED_AWAY = ("CONNECTION_FORCED - broker forced connection closure with reason 'the node that leads the vhost did "
               "not take the connection'; connect again")

# Where a client goes: a worker of this node (the socket its hand-offs are sent to), another node's AMQP address,
# or nowhere, with the reason it is told
Route = Union[socket.socket, tuple[str, int], str]


@dataclass
class FrontDoors:
    """What every front door of a process shares."""

    config: Config
    version: str  # the broker's, as connection.start gives it
    platform: str
    # Where a connection to a vhost goes (None: whatever the front door could not read goes to the default group);
    # forwarded: it came from another node's front door, so only a worker of this node may take it
    route: Callable[[str | None, bool], Route]
    trusted_proxies: frozenset[str] = frozenset()  # the cluster's members: they may send a PROXY header first
    # reads the members again, for a PROXY header from an address not trusted yet (a node that has just joined);
    # at most once a second, however many ask (None: never)
    recheck: Callable[[], Awaitable[None]] | None = None
    open: set[FrontDoor] = field(default_factory=set)  # clients in the handshake here
    # forwards, and TLS sessions joined to a worker, being made; members read again for a PROXY header
    splicing: set[asyncio.Task] = field(default_factory=set)


class FrontDoor(asyncio.Protocol):
    """One client, from its protocol header to connection.open."""

    def __init__(self, doors: FrontDoors) -> None:
        self.doors = doors
        self.transport: Any = None
        self.header = b""  # the protocol header (after a PROXY header) as received so far
        self.proxy_allowed = False  # the peer is a member: it may name the client it forwards in a PROXY header
        self.rechecked = False  # the members were read again for its PROXY header
        self.forwarded = False  # it did: the client came through another node's front door
        self.peer: tuple = ("", 0)  # the client's address and port
        self.local: tuple = ("", 0)  # the address it connected to
        self.tls = False  # the client speaks TLS: to this node, or to the node that forwarded it (its PROXY header)
        self.kept = bytearray()  # everything the client sent after its protocol header
        self.reader = FrameReader(FRAME_MIN_SIZE)  # the handshake's frames (a larger one goes to a worker to judge)
        self.answered = 0  # frames sent: 1 after connection.start, 2 after connection.tune
        self.tuned = False  # tune-ok came
        self.connected_at = 0  # wall-clock milliseconds when the socket was accepted
        self.sent = 0  # bytes written to the client
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = tuple(transport.get_extra_info("peername") or ("", 0))[:2]
        self.local = tuple(transport.get_extra_info("sockname") or ("", 0))[:2]
        self.proxy_allowed = self.peer[0] in self.doors.trusted_proxies
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.connected_at = int(time.time() * 1000)
        self.doors.open.add(self)
        self.timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT, self._timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def _done(self) -> None:
        self.doors.open.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        peer_log.warning(self.peer[0], "closing AMQP connection from %s:%s: handshake timeout", *self.peer)
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.answered:
            data = self._protocol_header(data)
            if not data:
                return
        self.kept += data
        try:
            frames, failed = self.reader.feed(data), False
        except AMQPError as error:  # (the frames before the bad one still count: open may be among them)
            frames, failed = error.frames, True
        for frame_type, channel, payload in frames:
            if frame_type == FRAME_HEARTBEAT and channel == 0:
                continue
            method = _METHOD_ID.unpack_from(payload) if frame_type == FRAME_METHOD and channel == 0 and len(
                payload) >= 4 else None
            if method == START_OK and self.answered == 1:
                self._send(greeting.tune(self.doors.config))
                self.answered = 2
            elif method == TUNE_OK and self.answered == 2 and not self.tuned:
                self.tuned = True
            elif method == OPEN and self.tuned:
                try:
                    vhost = decode_method(payload).virtual_host
                except (AMQPError, ValueError, TypeError, struct.error):
                    vhost = None
                self._go(vhost)
                return
            else:
                self._go(None)
                return
        if failed or len(self.kept) > HANDSHAKE_LIMIT:
            self._go(None)  # the default group's leader reads the same bytes, and says what is wrong with them

    def _protocol_header(self, data: bytes) -> bytes:
        """As a worker's: a trusted proxy's PROXY header, then the 8-byte protocol header, answered with
        connection.start; a wrong one is answered with ours and the socket closed. Returns what follows."""
        self.header += data
        if not self.proxy_allowed and not self.rechecked and self.doors.recheck is not None and (
                proxy_header.could_start(self.header[:1])):  # (a PROXY header, or no protocol header at all)
            self._recheck(self.doors.recheck)
            return b""
        try:
            start = stream_start.read_start(self.header, self.proxy_allowed)
        except proxy_header.ProxyHeaderError as error:
            peer_log.warning(self.peer[0], "closing connection from %s:%s: malformed PROXY header: %s", *self.peer,
                             error)
            self.transport.abort()
            return b""
        except stream_start.WrongProtocolHeader:
            self.transport.write(PROTOCOL_HEADER)
            self.transport.close()
            return b""
        if start is None:
            return b""
        self.header = b""
        self.proxy_allowed = False
        if start.proxied is not None:
            if start.proxied.ends is not None:
                self.peer, self.local = start.proxied.ends
                self.forwarded = True
            self.tls = self.tls or start.proxied.tls
        self._send(greeting.start(self.doors.config, self.doors.version, self.doors.platform))
        self.answered = 1
        return start.rest

    def _recheck(self, recheck: Callable[[], Awaitable[None]]) -> None:
        """Read the members again before this peer's PROXY header is judged; its bytes wait meanwhile."""
        self.rechecked = True
        self.transport.pause_reading()

        async def judge() -> None:
            await recheck()
            if not self.transport.is_closing():
                self.proxy_allowed = self.peer[0] in self.doors.trusted_proxies
                self.transport.resume_reading()
                self.data_received(b"")

        task = asyncio.get_running_loop().create_task(judge())
        self.doors.splicing.add(task)
        task.add_done_callback(self.doors.splicing.discard)

    def _send(self, method: Any) -> None:
        data = encode_method(0, method)
        self.transport.write(data)
        self.sent += len(data)

    def _go(self, vhost: str | None) -> None:
        """Send the client where the vhost is led."""
        self.transport.pause_reading()
        self._done()
        route = self.doors.route(vhost, self.forwarded)
        if isinstance(route, socket.socket):
            self._hand_over(route)
        elif isinstance(route, tuple):
            task = asyncio.get_running_loop().create_task(self._forward(route, vhost))
            self.doors.splicing.add(task)
            task.add_done_callback(self.doors.splicing.discard)
        else:
            self._refuse(INTERNAL_ERROR, f"INTERNAL_ERROR - {route}")

    def _hand_over(self, sender: socket.socket) -> None:
        """The socket goes to the worker; over a TLS session of this node's, which stays here, one end of a socket
        pair goes instead, joined to the client here (as a worker hands an amqps connection to another:
        broker.connection.splice). A client that spoke TLS to the node that forwarded it is plain TCP here."""
        handed = handoff.HandedOver(
            user="", client_properties=b"", frame_max=0, channel_max=0, heartbeat=0, peer=list(self.peer),
            local=list(self.local), connected_at=self.connected_at, received_bytes=len(PROTOCOL_HEADER),
            sent_bytes=self.sent, tls=self.tls,
            answered=self.answered, data=bytes(self.kept))
        try:
            handoff.hand_over(self.transport, sender, handed, self.doors.splicing)
        except OSError as error:
            peer_log.warning(self.peer[0], "closing AMQP connection from %s:%s: cannot hand it to the worker that "
                             "leads its vhost: %s", *self.peer, error)
            self._refuse(CONNECTION_FORCED, handoff.UNAVAILABLE)

    async def _forward(self, address: tuple[str, int], vhost: str | None) -> None:
        loop = asyncio.get_running_loop()
        client_end = SpliceEnd()
        client_end.transport = self.transport
        self.transport.set_protocol(client_end)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, leader_end = await loop.create_connection(lambda: Dropping(self.answered), *address)
        except OSError as error:  # TimeoutError included
            reason = "no answer in time" if isinstance(error, TimeoutError) else error.strerror or str(error)
            peer_log.warning(address[0], "cannot forward a client to the node at %s:%d that leads its vhost: %s",
                             *address, reason)
            self._refuse(CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure with reason "
                                            f"'vhost {vhost!r} unavailable'")
            return
        client_end.other, leader_end.other = leader_end, client_end
        leader_end.transport.write(proxy_header.encode(self.peer, self.local, self.tls) + PROTOCOL_HEADER +
                                   bytes(self.kept))
        for end in (client_end, leader_end):  # what either read before they were joined
            for data in end.waiting:
                end.other.transport.write(data)
            end.waiting.clear()
        if self.transport.is_closing():
            leader_end.transport.close()
            return
        self.transport.resume_reading()

    def _refuse(self, code: int, text: str) -> None:
        """Tell the client, past its connection.open, why it cannot go on (it may connect again)."""
        if not self.transport.is_closing():
            close = spec.Connection.Close(reply_code=code, reply_text=text[:255], class_id=0, method_id=0)
            self.transport.write(encode_method(0, close))
            self.transport.close()


class Dropping(SpliceEnd):
    """The leading node's end of a forwarded client: the frames its front door answers first, which this node's
    answered already, are dropped; what follows goes to the client. A node that answers otherwise (it does not
    take this one for a member yet) or closes first has the client told to come again."""

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.frames = frames  # answered frames still to drop
        self.head = b""  # the start of the one being dropped

    def data_received(self, data: bytes) -> None:
        if self.frames:
            data = self._drop(self.head + data)
            if not data:
                return
        super().data_received(data)

    def _drop(self, data: bytes) -> bytes:
        while self.frames:
            if len(data) < _FRAME_HEADER.size:
                self.head = data
                return b""
            frame_type, channel, size = _FRAME_HEADER.unpack_from(data)
            end = _FRAME_HEADER.size + size
            if frame_type != FRAME_METHOD or size > HANDSHAKE_LIMIT:  # (no handshake frame: no use waiting for it)
                log.warning("the node a client was forwarded to did not answer with a handshake: closing it")
                self._turned_away()
                return b""
            if len(data) <= end:
                self.head = data
                return b""
            if frame_type != FRAME_METHOD or channel != 0 or data[end] != FRAME_END:
                log.warning("the node a client was forwarded to did not answer with a handshake: closing it")
                self._turned_away()
                return b""
            data = data[end + 1:]
            self.frames -= 1
        self.head = b""
        return data

    def connection_lost(self, exc: Exception | None) -> None:
        if self.frames:  # closed before its handshake's answers were through
            self._turned_away()
        super().connection_lost(exc)

    def _turned_away(self) -> None:
        """Tell the client to come again, and close both sockets."""
        self.frames = 0
        client = self.other.transport if self.other is not None else None
        if client is not None and not client.is_closing():
            close = spec.Connection.Close(reply_code=CONNECTION_FORCED, reply_text=TURNED_AWAY, class_id=0,
                                          method_id=0)
            client.write(encode_method(0, close))
            client.close()
        self.transport.close()
