"""The front door of a clustered node, whose vhosts are led by processes of other nodes too (each of its workers,
cluster.worker, one or more): it answers a client's handshake up to connection.open, keeping every byte the client
sent after its protocol header, and reads the vhost from connection.open. Where its process holds the node's users
(its worker leads its group) it checks the login at start-ok, as any broker does, and answers a refused one there;
elsewhere it cannot, and goes on. The client then goes to the process that leads that vhost, which reads those
bytes through its ordinary handshake, checks the login there, and leaves unsent the frames the front door answered
(connection.start, and connection.tune once a start-ok came):

- a worker of this node: the socket is handed over with the bytes (broker.connection.handoff);
- another node (its worker that leads the vhost): a TCP connection to that node's AMQP port carries a
  PROXY v2 header naming the client (and saying whether it speaks TLS here); once that node has proven it knows the
  cluster's secret and this one has proven it in turn (protocol.stream_start), the protocol header and the bytes
  follow; the frames that node answers first (the ones this one answered already) are dropped, and the two sockets
  are spliced. A connection that came that way (a proven PROXY header) goes to a worker of this node or nowhere, so
  that two nodes that disagree cannot pass it round; should that node stop leading the vhost, the client is dropped
  (FrontDoors.reroute), and connects again;
- nowhere: the client is told why at its connection.open, and connects again.

What the front door cannot read as a handshake (a malformed frame, a method out of place, a start-ok past the size
a handshake frame may have) it does not judge: the client goes to the leader of the default group with what it
sent, and that worker's handshake gives the error any broker would. Only a wrong protocol header is answered here,
as a worker answers it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol, Union

from pamqp import commands as spec

from broker.config import Config
from broker.connection import greeting, handoff
from broker.connection.connection import HANDSHAKE_TIMEOUT, SHUTDOWN
from broker.connection.peer_log import PeerLog
from broker.connection.auth import parse_response
from broker.connection.refused_login import Refusal, check_login
from broker.connection.splice import SpliceEnd, join
from broker.model.node import vhost_down
from protocol import node_proof, proxy_header, stream_start
from protocol.stream_start import LINK, MQTT_LINK, Forwarding, StartReader, StreamStart
from protocol.codec import decode_method, encode_method
from protocol.constants import (
    ACCESS_REFUSED, CONNECTION_FORCED, FRAME_END, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE, INTERNAL_ERROR, PROTOCOL_HEADER,
)
from protocol.errors import AMQPError, short_text
from protocol.framing import FrameReader

if TYPE_CHECKING:
    from broker.connection.server import Server

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


class Router(Protocol):
    def __call__(self, vhost: str | None, forwarded: bool, copies: bool = True, mqtt: bool = False) -> Route:
        """Where a client of vhost goes; copies: a worker that keeps a copy of the vhost ([server] spread_vhosts)
        may serve it (False: its home alone, which keeps what its MQTT clients share); mqtt: an MQTT client (on
        another node: that node's MQTT address)."""
        ...


@dataclass
class FrontDoors:
    """What every front door of a process shares."""

    config: Config
    version: str  # the broker's, as connection.start gives it
    platform: str
    # Where a connection to a vhost goes (None: whatever the front door could not read goes to the default group);
    # forwarded: it came from another node's front door, so only a worker of this node may take it
    route: Router
    secret: Callable[[], str]  # the cluster's, which forwards between nodes are proven with ("": not learnt yet)
    # The broker of this process while it holds the node's users (it leads its group): logins are checked here
    users: Callable[[], Server | None] = lambda: None
    towards: ssl.SSLContext | None = None  # [cluster] tls: the TLS of forwards (to the other node's amqps port)
    open: set[FrontDoor] = field(default_factory=set)  # clients in the handshake here
    splicing: set[asyncio.Task] = field(default_factory=set)  # forwards, and TLS sessions joined to a worker, being made
    joined: set[_Joined] = field(default_factory=set)  # the clients' ends of their forwards to another node
    # The node is in maintenance: a client of its own is dropped at its protocol header, as a closed port would
    # (one another node's front door forwards still comes in: this node may lead its vhost yet)
    suspended: bool = False

    def suspend(self, on: bool = True) -> None:
        """With on, drop every client here and take no new one (the node goes into maintenance); else take them."""
        self.suspended = on
        if on:
            self.close()

    def keep(self, making: Coroutine) -> None:
        """Run making (a forward, or a TLS session's splice) as a task that close() cancels while it runs."""
        task = asyncio.get_running_loop().create_task(making)
        self.splicing.add(task)
        task.add_done_callback(self.splicing.discard)

    def reroute(self) -> None:
        """Drop every client forwarded to a node that no longer leads its vhost (the leader changed, or none is
        known now): it connects again, and goes where its vhost is led now, rather than wait on a node that may be
        out of reach (as after a partition)."""
        for client in list(self.joined):
            if self.route(client.vhost, False, copies=not client.mqtt, mqtt=client.mqtt) != client.address:
                client.abort()

    def close(self) -> None:
        """Drop every client here at once: in its handshake (one that had connection.start is told of the shutdown,
        as a broker tells it), being forwarded, or forwarded (whose connection on the other node then closes too)."""
        for door in list(self.open):
            if door.answered:
                door.refuse(CONNECTION_FORCED, SHUTDOWN)
            else:
                door.transport.abort()
        for task in list(self.splicing):
            task.cancel()
        for client in list(self.joined):
            client.abort()


async def open_doors(doors: FrontDoors, tls: ssl.SSLContext | None = None, door: type[Door] | None = None,
                     **where: Any) -> asyncio.Server:
    """A listener whose every client comes in through a front door (door: MqttFrontDoor on an MQTT port); where: host
    and port, or sock. With tls, the TLS session ends here, and a client that does not finish its TLS handshake
    within the handshake timeout is dropped, as the broker's own amqps port drops it."""
    return await asyncio.get_running_loop().create_server(
        lambda: (door or FrontDoor)(doors), backlog=1024, ssl=tls,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls else None, **where)


def close_frame(code: int, text: str, method: tuple[int, int] = (0, 0)) -> bytes:
    """connection.close with code and text (cut to a short string's 255 bytes); method: the one refused, if any."""
    return encode_method(0, spec.Connection.Close(code, short_text(text), *method))


TURNED_AWAY_FRAME = close_frame(CONNECTION_FORCED, TURNED_AWAY)


def refused(vhost: str | None, why: str) -> str:
    """What a route tells a client whose vhost no process can take now."""
    what = f"vhost '{vhost}'" if vhost is not None else "the cluster"
    return f"{what} is unavailable: {why}; connect again"


class Door(asyncio.Protocol):
    """What an AMQP and an MQTT front door share: the client's ends, another node's PROXY header, the way on."""

    what = "AMQP connection from %s:%s: handshake timeout"  # the timeout's log line
    timeout = HANDSHAKE_TIMEOUT  # seconds a client has to reach the point where it is sent on

    def __init__(self, doors: FrontDoors) -> None:
        self.doors = doors
        self.transport: Any = None
        self.start: StartReader | None = None  # reads another node's PROXY header and proofs (AMQP: and the header)
        self.forwarded = False  # the client came through another node's front door (a proven PROXY header)
        self.peer: tuple = ("", 0)  # the client's address and port
        self.local: tuple = ("", 0)  # the address it connected to
        self.tls = False  # the client speaks TLS: to this node, or to the node that forwarded it (its PROXY header)
        self.web = False  # it speaks MQTT over a WebSocket, here or to the node that forwarded it
        self.kept = bytearray()  # what the client sent after its protocol header (MQTT: all of it)
        self.connected_at = 0  # wall-clock milliseconds when the socket was accepted
        self.timer: asyncio.TimerHandle | None = None  # drops a client that does not finish in time

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = tuple(transport.get_extra_info("peername") or ("", 0))[:2]
        self.local = tuple(transport.get_extra_info("sockname") or ("", 0))[:2]
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.connected_at = int(time.time() * 1000)
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()

    def _done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        peer_log.warning(self.peer[0], "closing " + self.what, *self.peer)
        self.transport.abort()

    def _read_start(self, data: bytes) -> StreamStart | None:
        """Another node's PROXY header and proofs, then the protocol header (MQTT: none); a wrong one is answered
        with ours and the socket closed. The start once whole (the client's ends then those that header names)."""
        assert self.start is not None
        try:
            challenge, start = self.start.feed(data)
        except (proxy_header.ProxyHeaderError, stream_start.NotProven) as error:
            peer_log.warning(self.peer[0], "closing connection from %s:%s: %s PROXY header: %s", *self.peer,
                             "malformed" if isinstance(error, proxy_header.ProxyHeaderError) else "refused", error)
            self.transport.abort()
            return None
        except stream_start.WrongProtocolHeader:
            self.transport.write(PROTOCOL_HEADER)
            self.transport.close()
            return None
        if challenge:
            self.transport.write(challenge)
        if start is None:
            return None
        self.start = None
        if start.forwarded is not None:
            self.peer, self.local = start.forwarded
            self.forwarded = True
            self.tls, self.web = start.tls, start.web  # (the client's, not the link's between the nodes)
        elif self.doors.suspended:  # (the node is in maintenance: its own clients go, as at a closed port)
            self.transport.abort()
            return None
        return start

    def _handed(self, **fields: Any) -> handoff.HandedOver:
        return handoff.HandedOver(peer=list(self.peer), local=list(self.local), connected_at=self.connected_at,
                                  tls=self.tls, web=self.web, data=bytes(self.kept), **fields)


class FrontDoor(Door):
    """One AMQP client, from its protocol header to connection.open."""

    def __init__(self, doors: FrontDoors) -> None:
        super().__init__(doors)
        self.reader = FrameReader(FRAME_MIN_SIZE)  # the handshake's frames (a larger one goes to a worker to judge)
        self.answered = 0  # frames sent: 1 after connection.start, 2 after connection.tune
        self.tuned = False  # tune-ok came
        self.sent = 0  # bytes written to the client
        self.refusal: Refusal | None = None  # a refused login waiting to be answered (nothing more is read)
        self.user = ""  # the user the start-ok names
        self.owing: socket.socket | None = None  # where the socket goes once what is owed to the client is written
        self.checked = False  # its login was checked here, and accepted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.start = StartReader(self.doors.secret())
        self.doors.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()
        if self.refusal is not None:
            self.refusal.cancel()

    def _done(self) -> None:
        self.doors.open.discard(self)
        super()._done()

    def resume_writing(self) -> None:
        sender, self.owing = self.owing, None
        if sender is not None and not self.transport.is_closing():
            self._done()
            self.transport.set_write_buffer_limits()
            self._hand_over(sender)

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return  # (read before reading paused)
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
                if not self._logged_in(payload):
                    return
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

    def _logged_in(self, payload: bytes) -> bool:
        """Where this process holds the node's users, the start-ok's login is checked here, as the broker's own
        handshake checks it, and a refused one answered (a client another node forwarded goes on: the worker it goes
        to checks it, behind the frames that node's front door answered). False once refused."""
        try:
            start_ok = decode_method(payload)
            self.user = (parse_response(start_ok.mechanism, start_ok.response) or ("",))[0]
        except (AMQPError, ValueError, TypeError, struct.error):
            return True  # (the worker's handshake says what is wrong with it)
        server = self.doors.users()
        if server is None or self.forwarded:
            return True
        peer = f"{self.peer[0]}:{self.peer[1]}"
        self.checked = check_login(server, start_ok, self.peer[0], peer) is not None
        if self.checked:
            return True
        if self.timer is not None:
            self.timer.cancel()  # the refusal's wait is bounded
        self.refusal = Refusal(server, self.transport, self.peer[0], start_ok, self._answer_refused)
        return False

    def _answer_refused(self, text: str | None) -> None:
        self.refusal = None
        if text is None:
            self.transport.close()
        else:
            self.refuse(ACCESS_REFUSED, text)

    def _protocol_header(self, data: bytes) -> bytes:
        """As a worker's (after another node's PROXY header and proofs): answered with connection.start. Returns
        what follows."""
        start = self._read_start(data)
        if start is None:
            return b""
        self._send(greeting.start(self.doors.config, self.doors.version, self.doors.platform))
        self.answered = 1
        return start.rest

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
            unreachable = close_frame(CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure with "
                                      f"reason 'vhost {vhost!r} unavailable'")
            self.doors.keep(forward(self, route, vhost, PROTOCOL_HEADER + bytes(self.kept), self.answered,
                                    unreachable, TURNED_AWAY_FRAME))
        else:
            self._unavailable(vhost, route)

    def _unavailable(self, vhost: str | None, why: str) -> None:
        """No process can take the vhost now: RabbitMQ's answer for a vhost that is down, after its access check
        where this process holds the users; why goes to the log."""
        if vhost is None:
            self.refuse(INTERNAL_ERROR, f"INTERNAL_ERROR - {why}")
            return
        server = self.doors.users()
        if server is not None and self.checked:
            try:
                server.node.open_vhost(self.user, vhost)
            except AMQPError as error:
                self.refuse(error.reply_code, error.text, OPEN)
                return
        peer_log.info(self.peer[0], "closing AMQP connection from %s:%s: %s", *self.peer, why)
        down = vhost_down(vhost, self.user)
        self.refuse(down.reply_code, down.text, OPEN)

    def _hand_over(self, sender: socket.socket) -> None:
        """The socket goes to the worker; over a TLS session of this node's, which stays here, one end of a socket
        pair goes instead, joined to the client here (as a worker hands an amqps connection to another:
        broker.connection.splice). A client that spoke TLS to the node that forwarded it is plain TCP here."""
        if self.transport.get_write_buffer_size() and self.transport.get_extra_info("sslcontext") is None:
            # What this door wrote and the client's window did not take yet would stay in this process's transport:
            # the socket goes once it is written, nothing being read meanwhile, the handshake timeout running
            self.owing = sender
            self.doors.open.add(self)
            self.timer = asyncio.get_running_loop().call_later(self.timeout, self._timed_out)
            self.transport.set_write_buffer_limits(high=0, low=0)  # resume_writing once it is all written
            return
        handed = self._handed(user=self.user if self.checked else "", received_bytes=len(PROTOCOL_HEADER),
                              sent_bytes=self.sent, answered=self.answered)
        try:
            handoff.hand_over(self.transport, sender, handed, self.doors.keep)
        except OSError as error:
            peer_log.warning(self.peer[0], "closing AMQP connection from %s:%s: cannot hand it to the worker that "
                             "leads its vhost: %s", *self.peer, error)
            self.refuse(CONNECTION_FORCED, handoff.UNAVAILABLE)

    def refuse(self, code: int, text: str, method: tuple[int, int] = (0, 0)) -> None:
        """Tell the client why it cannot go on (it may connect again); method: the one refused, as (class, method)."""
        if not self.transport.is_closing():
            self.transport.write(close_frame(code, text, method))
            self.transport.close()


async def forward(door: Door, address: tuple[str, int], vhost: str | None, after: bytes, answered: int,
                  unreachable: bytes, turned_away: bytes, link: str = LINK) -> None:
    """The door's client goes on through the node at address, once each node has proven to the other that it knows
    the cluster's secret (ForwardEnd); after: what the client sent here; answered: the handshake frames this door
    sent, which that node answers first; unreachable: what the client is told when that node cannot be reached,
    turned_away when it does not take it; link: the kind of link the proofs are made for (MQTT_LINK: to that node's
    MQTT port)."""
    transport = door.transport
    client_end = _Joined(door.doors.joined, vhost, address, link == MQTT_LINK)
    client_end.transport = transport
    transport.set_protocol(client_end)
    secret = door.doors.secret()
    try:
        if not secret:
            raise ConnectionRefusedError(0, "this node has not learnt the cluster's secret yet")
        forwarding = Forwarding(secret, door.peer, door.local, door.tls, link=link, web=door.web)
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await asyncio.get_running_loop().create_connection(
                lambda: ForwardEnd(answered, forwarding, after, client_end, turned_away), *address,
                ssl=door.doors.towards)
    except OSError as error:  # TimeoutError included
        reason = "no answer in time" if isinstance(error, TimeoutError) else error.strerror or str(error)
        peer_log.warning(address[0], "cannot forward a client to the node at %s:%d that leads its vhost: %s",
                         *address, reason)
        if not transport.is_closing():
            transport.write(unreachable)
            transport.close()


class _Joined(SpliceEnd):
    """A client's end of its forward to another node, in its front doors' set while it is open."""

    def __init__(self, joined: set[_Joined], vhost: str | None, address: tuple[str, int], mqtt: bool) -> None:
        super().__init__()
        self.joined = joined
        self.vhost = vhost  # what it opened (None: what the front door could not read)
        self.address = address  # the node it was forwarded to, which led that vhost then
        self.mqtt = mqtt  # an MQTT client (forwarded to that node's MQTT port)
        joined.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.joined.discard(self)
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop both sockets at once, whatever they hold unsent."""
        self.transport.abort()
        if self.other is not None and self.other.transport is not None:
            self.other.transport.abort()


class ForwardEnd(SpliceEnd):
    """The leading node's end of a forwarded client (from a front door).
    It sends the PROXY header, checks that node's challenge and answers it with this node's proof, then what the
    client sent here; only then is it joined to the client. The frames that node's front door answers first, which
    this node's answered already, are dropped; what follows goes to the client. A node that cannot prove it knows
    the cluster's secret, answers otherwise, or closes first has the client told to come again."""

    def __init__(self, frames: int, forwarding: Forwarding, after: bytes, client: SpliceEnd,
                 turned_away: bytes) -> None:
        super().__init__()
        self.turned_away = turned_away  # what the client is told when this node cannot take it
        self.frames = frames  # answered frames still to drop
        self.head = b""  # the start of the one being dropped
        self.forwarding: Forwarding | None = forwarding  # the proofs under way (None once the client's bytes go on)
        self.after = after  # what goes once this node has proven itself: the protocol header, the handshake's bytes
        self.other = client  # the client's end: joined to this one once the proofs are through, else told to come again
        self.deadline: asyncio.TimerHandle | None = None  # fires when the other node's challenge is late

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.forwarding is not None
        self.transport.write(self.forwarding.header)
        self.deadline = asyncio.get_running_loop().call_later(CONNECT_TIMEOUT, self._failed, "no challenge in time")

    def data_received(self, data: bytes) -> None:
        if self.forwarding is not None:
            data = self._prove(data)
            if not data:
                return
        if self.frames:
            data = self._drop(self.head + data)
            if not data:
                return
        super().data_received(data)

    def _prove(self, data: bytes) -> bytes:
        """Read the other node's challenge; once it is whole and right, send the proof and the client's bytes, and
        join the client. Returns what followed the challenge."""
        assert self.forwarding is not None
        try:
            proof, rest = self.forwarding.feed(data)
        except node_proof.ProofError as error:
            self._failed(str(error))
            return b""
        if proof is None:
            return b""
        self.forwarding = None
        if self.deadline is not None:
            self.deadline.cancel()
        self.transport.write(proof + self.after)
        join(self.other, self)  # (and what the client sent while the proofs went on)
        return rest

    def _failed(self, why: str) -> None:
        """The other node did not prove it knows the cluster's secret: the client is told to come again."""
        if self.forwarding is None:
            return
        peer = self.transport.get_extra_info("peername") or ("?", 0)
        peer_log.warning(peer[0], "refused to forward a client to the node at %s:%s: %s", peer[0], peer[1], why)
        self.forwarding = None
        self._turned_away()

    def _drop(self, data: bytes) -> bytes:
        while self.frames:
            if len(data) < _FRAME_HEADER.size:
                self.head = data
                return b""
            frame_type, channel, size = _FRAME_HEADER.unpack_from(data)
            end = _FRAME_HEADER.size + size
            if frame_type != FRAME_METHOD or size > HANDSHAKE_LIMIT:  # (no handshake frame: no use waiting for it)
                self._no_handshake()
                return b""
            if len(data) <= end:
                self.head = data
                return b""
            if channel != 0 or data[end] != FRAME_END:
                self._no_handshake()
                return b""
            data = data[end + 1:]
            self.frames -= 1
        self.head = b""
        return data

    def eof_received(self) -> bool:
        if self.forwarding is not None or self.frames:  # (the client is told to come again once the socket closes)
            return False
        return super().eof_received()

    def _no_handshake(self) -> None:
        peer = self.transport.get_extra_info("peername") or ("?", 0)
        peer_log.warning(peer[0], "the node at %s:%s a client was forwarded to did not answer with a handshake: "
                                  "closing it", peer[0], peer[1])
        self._turned_away()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        if self.forwarding is not None:  # closed before its proofs were through
            self._failed("it closed the connection")
        elif self.frames:  # or before its handshake's answers were
            self._turned_away()
        super().connection_lost(exc)

    def _turned_away(self) -> None:
        """Tell the client to come again, and close both sockets."""
        self.frames = 0
        client = self.other.transport if self.other is not None else None
        if client is not None and not client.is_closing():
            client.write(self.turned_away)
            client.close()
        self.transport.close()
