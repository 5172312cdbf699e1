"""One client connection: handshake, heartbeats, the channel table, error handling and the write buffer."""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, Callable, Final, Protocol, cast

from pamqp import commands as spec

from broker.connection import greeting, handoff
from broker.connection.refused_login import Refusal, capabilities, check_login
from broker.connection.peer_log import PeerLog
from broker.model.counters import AMQP_LABEL
from broker.model.turns import go_on_after_replies
from broker.session.channel import Channel
from broker.session.limits import ChannelLimits
from protocol import errors
from protocol import erlang_terms
from protocol import stream_start
from protocol.stream_start import StartReader
from protocol.codec import HEARTBEAT_FRAME, decode_method, encode_method
from protocol.constants import (
    ACCESS_REFUSED, CHANNEL_CLOSE, CHANNEL_CLOSE_OK, CHANNEL_OPEN, CONNECTION_FORCED, FRAME_END, FRAME_ERROR,
    FRAME_HEARTBEAT, NOT_ALLOWED, FRAME_METHOD, FRAME_MIN_SIZE, PROTOCOL_HEADER,
)
from protocol.errors import AMQPError, close_for
from protocol.framing import FrameReader

if TYPE_CHECKING:
    from broker.connection.server import Server
    from broker.model.vhost import VirtualHost

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # every line about one client goes through here, so that no client can flood the log

_CLASS_METHOD: Final = struct.Struct(">HH")
_METHOD_INDEX: Final = struct.Struct(">I")  # a method frame's class and method ids, as protocol.constants numbers them
_OPEN_OK_PAYLOAD: Final = struct.pack(">HHI", 20, 11, 0)  # channel.open-ok with an empty channel_id longstr


class Transport(Protocol):
    """What a connection asks of its transport (uvloop's, or asyncio's for TLS; uvloop's is no asyncio.Transport)."""

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def can_write_eof(self) -> bool: ...
    def write_eof(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class State(enum.Enum):
    """Where a connection is: the handshake's steps, open, then the close."""

    AWAIT_HEADER = "awaiting the protocol header"
    AWAIT_START_OK = "awaiting connection.start-ok"
    AWAIT_TUNE_OK = "awaiting connection.tune-ok"
    AWAIT_OPEN = "awaiting connection.open"
    OPEN = "open"
    CLOSING = "closing: connection.close sent, awaiting close-ok"
    CLOSE_RECEIVED = "the client closed: its exclusive queues go, then close-ok"
    DRAINING = "draining: the close exchange is over, reading and discarding until the peer closes its socket"
    CLOSED = "closed"


# The states by their own names (under mypyc, a pointer compared: the hot path checks the state per frame)
AWAIT_HEADER: Final = State.AWAIT_HEADER
AWAIT_START_OK: Final = State.AWAIT_START_OK
AWAIT_TUNE_OK: Final = State.AWAIT_TUNE_OK
AWAIT_OPEN: Final = State.AWAIT_OPEN
OPEN: Final = State.OPEN
CLOSING: Final = State.CLOSING
CLOSE_RECEIVED: Final = State.CLOSE_RECEIVED
DRAINING: Final = State.DRAINING
CLOSED: Final = State.CLOSED

# Every move a connection makes, in one table (as h11's _state.py): a state -> the states it may go to. Any state
# may end CLOSED (the socket lost or dropped); a handshake error closes (CLOSING) or drops the socket.
MOVES: Final[dict[State, frozenset[State]]] = {
    AWAIT_HEADER: frozenset({AWAIT_START_OK, CLOSED}),
    AWAIT_START_OK: frozenset({AWAIT_TUNE_OK, CLOSING, CLOSE_RECEIVED, CLOSED}),
    AWAIT_TUNE_OK: frozenset({AWAIT_OPEN, CLOSING, CLOSE_RECEIVED, CLOSED}),
    AWAIT_OPEN: frozenset({OPEN, CLOSING, CLOSE_RECEIVED, CLOSED}),
    OPEN: frozenset({CLOSING, CLOSE_RECEIVED, CLOSED}),
    CLOSING: frozenset({DRAINING, CLOSED}),
    CLOSE_RECEIVED: frozenset({DRAINING, CLOSED}),  # DRAINING: its exclusive queues are gone, close-ok sent
    DRAINING: frozenset({CLOSED}),
    CLOSED: frozenset({CLOSED}),
}

HANDSHAKE_TIMEOUT: Final = 10.0  # seconds a client has to complete the handshake (RabbitMQ's default)
SHUTDOWN: Final = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"  # (its reply text)
CLOSE_OK_TIMEOUT: Final = 3.0  # seconds we wait for connection.close-ok after sending connection.close
# Seconds we go on reading (and discarding) after the close exchange, until the peer closes its socket: closing
# ours while its frames are still arriving would reset the connection and lose our close-ok (RabbitMQ's
# CLOSING_TIMEOUT).
DRAIN_TIMEOUT: Final = 30.0
# Bytes one connection may hand us per event-loop turn before it waits for the next turn; without this limit the
# loop reads a fast publisher's socket for megabytes on end while deliveries and other clients wait.
READ_BUDGET: Final = 128 * 1024
# Seconds the frames (an MQTT client's packets) of one read of more than CLOCK_LOOK_EVERY may take before the rest
# wait for a later loop turn: READ_BUDGET bounds the bytes, not what they ask (its 128 KiB of queue.declare, 3,200 of
# them, held every other client 160 ms; 20,000 MQTT subscribes and unsubscribes, 550 ms)
READ_SECONDS: Final = 0.005
# Such a read looks at the clock as it begins and at every CLOCK_LOOK_EVERY-th frame or packet after (its READ_SECONDS
# began at the first of those looks at its 32nd frame: a burst of costly frames, publishes to a fanout exchange of 300
# queues, ran 6 ms before they counted). A read of fewer frames, most of them, reads no clock.
CLOCK_LOOK_EVERY: Final = 32
# Unread bytes queued to one client (what its transport still holds plus this turn's frames) above which we stop
# reading it until it has read them. Deliveries already wait at the transport's 64 KiB high-water mark, so this
# bounds replies (get-ok, confirms, returns): a client that publishes with confirms while deliveries flow to it has a
# few KiB of them unread at a time, and a client that gets large messages stays busy; a client that never reads can
# make us hold this much plus one reply, instead of a copy of a message per basic.get for as long as it sends them.
OUTPUT_LIMIT: Final = 4 * 1024 * 1024
# Longest a queue's flow control holds a publisher back at a time. Consumers that wait for acks from a paused
# connection (an RPC client, or two connections feeding each other) would otherwise wait for ever.
FLOW_MAX_PAUSE: Final = 0.1


def read_deadline(ends: float) -> float:
    """At a look at the clock while a read's frames (an MQTT client's packets) are handled, given the last answer
    (0.0 at the first, as the read begins): when they must be done by, READ_SECONDS from the first look; -1.0 once
    that has passed."""
    now = time.perf_counter()
    if not ends:
        return now + READ_SECONDS
    return -1.0 if now > ends else ends


class Connection(asyncio.Protocol):
    protocol: Final = "AMQP 0-9-1"  # as the management API names it
    protocol_label: Final = AMQP_LABEL  # as RabbitMQ's metrics label it
    def __init__(self, server: "Server", handed: handoff.HandedOver | None = None):
        self.server = server
        # The handshake a front door answered for this connection, whose socket it handed to this process (which
        # leads the vhost); None for a connection accepted here
        self.handed = handed
        config = server.config
        self.vhost: VirtualHost | None = None  # the VirtualHost connection.open chose
        self.loop = asyncio.get_running_loop()
        self.transport: Transport | None = None  # from connection_made on
        self.state: State = AWAIT_HEADER  # changed only by _enter, along MOVES
        # reads the protocol header (None once read, or for a connection a front door read it for)
        self.start: StartReader | None = None
        self.reader = FrameReader(FRAME_MIN_SIZE)  # RabbitMQ accepts only 4096-byte frames until tune-ok
        self.frame_max: int = config.frame_max  # negotiated in tune-ok
        self.channel_max: int = config.channel_max  # negotiated in tune-ok
        self.heartbeat: int = 0  # negotiated seconds, 0 = off
        self.channels: dict[int, Channel] = {}  # open channels by number
        self.closing_channels: set[int] = set()  # channels we sent channel.close on, awaiting close-ok
        # Channels the client closed whose close-ok waits for their deliveries to go back to their queues (their
        # frames meanwhile are ignored)
        self.settling_channels: dict[int, Channel] = {}
        self.out: list[bytes] = []  # frames to write at the end of this loop turn
        self.out_size = 0  # bytes in out
        self.output_room = OUTPUT_LIMIT  # bytes out may hold before we stop processing frames (see OUTPUT_LIMIT)
        # Frames read but not processed while the client's unread output is over OUTPUT_LIMIT, or once the read's
        # READ_SECONDS were spent, and the frame error that followed them; reading stops until they are processed.
        self.held: tuple[list, AMQPError | None] | None = None
        self.resume_scheduled = False  # the held frames are processed at the next loop turn
        self.unread_at_tick = 0  # bytes the transport held at the last heartbeat tick, while frames are held
        # Channels that hold many frames while a reply of theirs waits for the disk: not read until they are done
        self.waiting_channels: set[Channel] = set()
        self.flush_scheduled = False  # a flush is queued on the loop
        self.handled: dict[Channel, None] = {}  # channels that handled frames of the read being processed
        self.write_paused: bool = False  # the transport's buffer is full: no deliveries until it drains
        self.exclusive_queues: set = set()  # exclusive queues this connection owns, deleted with it
        self.limits: ChannelLimits = server.channel_limits  # what its channels work within (session.interfaces)
        self.client_properties: dict = {}
        self.client_capabilities: dict = {}
        self.user: str = ""  # who logged in
        self.last_received = 0.0  # loop time of the last bytes from the client
        self.read_this_turn = 0  # bytes received in the current event-loop turn (see READ_BUDGET)
        self.received_bytes = 0  # since the socket was accepted (RabbitMQ's recv_oct)
        self.sent_bytes = 0  # likewise written (send_oct)
        self.turn_paused = False  # reading paused until the next loop turn (READ_BUDGET)
        self.throttled_by: set = set()  # queues over their flow-control limit that this connection publishes to
        self.flow_timer: asyncio.TimerHandle | None = None  # ends a flow-control pause after FLOW_MAX_PAUSE
        self.blocked = False  # published while the memory alarm was on: not read until it clears
        self.sent_since_tick = False  # whether any traffic but our own heartbeats was written since the last tick
        self.timer: asyncio.TimerHandle | None = None  # handshake timeout, then heartbeat ticks, then close wait
        self.peer = ""  # host:port of the client, for logs
        self.name = ""  # RabbitMQ's name of the connection: "client host:port -> server host:port"
        self.peer_address = ""  # the client's IP address
        self.peer_port = 0  # and its port
        self.local: tuple[Any, ...] | None = None  # (host, port) the client connected to: ours, or its proxy's
        self.connected_at = 0  # wall-clock milliseconds when the socket was accepted (shown by the management API)
        # the client speaks TLS (amqps): here, to the front door that handed the connection over, or to the cluster
        # node that forwarded it (its PROXY header says so)
        self.tls = False
        self.refusal: Refusal | None = None  # a refused login waiting to be answered: nothing the client sends is read

    # --- state -------------------------------------------------------------------------------------------------
    def _enter(self, state: State) -> None:
        """Move to state, along MOVES (a move the table lacks is a bug)."""
        assert state in MOVES[self.state], f"{self.state.name} -> {state.name}"
        self.state = state

    def _handshaking(self) -> bool:
        """Before connection.open is answered: frames are read one at a time, and the handshake timeout runs."""
        state = self.state
        return state is AWAIT_HEADER or state is AWAIT_START_OK or state is AWAIT_TUNE_OK or state is AWAIT_OPEN

    def _closing(self) -> bool:
        """A close has begun (CLOSING, CLOSE_RECEIVED, DRAINING or CLOSED): only the close exchange counts now."""
        state = self.state
        return state is CLOSING or state is CLOSE_RECEIVED or state is DRAINING or state is CLOSED

    def _close_done(self) -> bool:
        """The close exchange is over (DRAINING or CLOSED): whatever arrives is discarded."""
        state = self.state
        return state is DRAINING or state is CLOSED

    # --- transport callbacks -------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(Transport, transport)  # a stream transport: this protocol is served over TCP
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:  # (a TLS connection a front door keeps is not TCP)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tls = transport.get_extra_info("sslcontext") is not None
        if self.handed is None:  # (a handed connection's ends are the client's, which its state names)
            self._set_ends(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
            self.start = StartReader(None)  # (outside a cluster: no PROXY header is read)
        self.connected_at = int(time.time() * 1000)
        self.server.connections.add(self)
        self.timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)
        if self.handed is not None:
            self._take_over(self.handed)

    def _take_over(self, handed: handoff.HandedOver) -> None:
        """A front door sent connection.start (and connection.tune, if it read a start-ok) and kept what the client
        sent after its protocol header: read that as if it came now, leaving unsent what the client has had."""
        self._set_ends(tuple(handed.peer), tuple(handed.local))
        self.connected_at = handed.connected_at
        self.tls = handed.tls
        self.sent_bytes = handed.sent_bytes
        self.received_bytes = handed.received_bytes
        self._enter(AWAIT_START_OK)
        peer_log.info(self.peer_address, "accepting AMQP connection %s", self.name)
        if handed.data:
            self.data_received(handed.data)

    def _set_ends(self, peer: tuple[Any, ...] | None, local: tuple[Any, ...] | None) -> None:
        """The client's address and the one it connected to, as logs, access checks and the management API see them."""
        self.peer_address = peer[0] if peer else ""
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_port = peer[1] if peer else 0
        self.local = local
        self.name = f"{self.peer} -> {local[0]}:{local[1]}" if local else self.peer

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return  # (a replayed handshake's tune-ok and open, or what came before reading paused)
        self.last_received = self.loop.time()
        if self.state is AWAIT_HEADER:
            data = self._protocol_header(data)
            if not data:
                return
        if self._close_done():
            return
        self.read_this_turn += len(data)
        self.received_bytes += len(data)
        # Until tune-ok, a frame at a time: tune-ok sets the frame_max that the frames after it, sent in the same
        # write, are judged by (RabbitMQ reads each frame with the limits of its time).
        reader = self.reader
        while data and self._handshaking() and self.refusal is None:
            end = reader.frame_end(data)
            if not self._feed(data[:end]) or self._close_done():
                return  # a frame error drops the rest of the read, as it does below
            data = data[end:]
        if data and self.refusal is None:
            self._feed(data)
        if self.read_this_turn > READ_BUDGET and self.state is OPEN:
            self.turn_paused = True
            self._update_reading()
            self.loop.call_soon(self._next_turn)

    def _feed(self, data: bytes) -> bool:
        """Read and handle the frames of data; False if a frame error cut it short."""
        try:
            frames = self.reader.feed(data)
            failure = None
        except AMQPError as error:
            frames, failure = error.frames, error  # RabbitMQ acts on the good frames before the bad one
        self._handle(frames, failure)
        return failure is None

    def _next_turn(self) -> None:
        self.read_this_turn = 0
        self.turn_paused = False
        self._update_reading()

    def throttle(self, queue) -> None:
        self.throttled_by.add(queue)
        if self.flow_timer is None:
            self.flow_timer = self.loop.call_later(FLOW_MAX_PAUSE, self._flow_pause_over)
        self._update_reading()

    def unthrottle(self, queue) -> None:
        self.throttled_by.discard(queue)
        if not self.throttled_by and self.flow_timer is not None:
            self.flow_timer.cancel()
            self.flow_timer = None
        self._update_reading()

    def _flow_pause_over(self) -> None:
        self.flow_timer = None
        for queue in list(self.throttled_by):
            queue.throttled.discard(self)
        self.throttled_by.clear()
        self._update_reading()

    def block(self, reason: str) -> None:
        """A publish arrived during a resource alarm: stop reading, and say why ("low on memory") to clients that
        listen."""
        if not self.blocked:
            self.blocked = True
            self._update_reading()
            if self.client_capabilities.get("connection.blocked"):
                self.send_method(0, spec.Connection.Blocked(reason=reason))

    def unblock(self) -> None:
        if self.blocked:
            self.blocked = False
            self._update_reading()
            if self.client_capabilities.get("connection.blocked"):
                self.send_method(0, spec.Connection.Unblocked())

    def reading_paused(self) -> bool:
        return not self._close_done() and (self.turn_paused or bool(self.throttled_by) or self.blocked
                                          or self.held is not None or bool(self.waiting_channels))

    def _update_reading(self) -> None:
        """Read from the socket unless the turn's budget is spent, a queue holds this publisher back, the memory
        alarm blocks it, or it has not read what we sent. A connection draining after its close reads (and
        discards) everything."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.reading_paused():
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _handle(self, frames: list, failure: AMQPError | None) -> None:
        """Process frames, then the frame error that cut them short; hold what is left once the client's unread
        output passes OUTPUT_LIMIT. Then each channel that handled frames sends its confirms (as rabbit_channel's
        next_state after each message)."""
        transport = self.transport
        assert transport is not None, "frames come from it"
        self.output_room = OUTPUT_LIMIT - transport.get_write_buffer_size()
        rest = self._process(frames)
        if rest is not None:
            self.held = (rest, failure)
            self.unread_at_tick = transport.get_write_buffer_size()
            self._update_reading()
        elif failure is not None:
            self.failed(failure, None)
        handled, self.handled = self.handled, {}
        for channel in handled:
            if channel.open:
                channel.read_processed()

    def hold_reading_for(self, channel: Channel) -> None:
        """A channel waiting for the disk holds many frames already: read nothing more until it is done."""
        self.waiting_channels.add(channel)
        self._update_reading()

    def replay(self, channel: Channel, frames: list) -> None:
        """The frames a channel held while it waited for the disk, processed now (ahead of any frames held for
        the client's output, which were read after them); then reading goes on."""
        self.waiting_channels.discard(channel)
        if frames:
            if self.held is not None:
                held, failure = self.held
                self.held = (frames + held, failure)
            else:
                self._handle(frames, None)
        self._update_reading()

    def _resume_held_soon(self, after_replies: bool = False) -> None:
        """Process the held frames at the next loop turn (after_replies: go_on_after_replies)."""
        if not self.resume_scheduled:
            self.resume_scheduled = True
            if after_replies:
                go_on_after_replies(self.loop, self._resume_held)
            else:
                self.loop.call_soon(self._resume_held)

    def _resume_held(self) -> None:
        """The client has read enough of its output, or a loop turn has passed: process the held frames, then read
        again."""
        self.resume_scheduled = False
        if self.held is None or self._close_done():
            return
        (frames, failure), self.held = self.held, None
        self._handle(frames, failure)
        self._update_reading()

    def _process(self, frames: list) -> list | None:
        """Dispatch frames; return those left unprocessed because the output passed its room, or READ_SECONDS
        were spent (to go on once the next loop turn's replies are out), if any."""
        channels = self.channels
        ends = read_deadline(0.0) if len(frames) > CLOCK_LOOK_EVERY else 0.0
        look_at = CLOCK_LOOK_EVERY  # the index of the frame before which the clock is looked at next
        for index, (frame_type, number, payload) in enumerate(frames):
            if self.out_size > self.output_room:
                return frames[index:]
            if index == look_at:
                ends = read_deadline(ends)
                look_at += CLOCK_LOOK_EVERY
                if ends < 0:
                    self._resume_held_soon(after_replies=True)
                    return frames[index:]
            if self.state is not OPEN and self._closing() and not (number == 0 and frame_type == FRAME_METHOD):
                continue
            channel = channels.get(number)
            if channel is not None and (self.state is not OPEN or frame_type == FRAME_HEARTBEAT):
                channel = None  # the connection's own frame
            try:
                if channel is not None:
                    self.handled[channel] = None
                    channel.handle_frame(frame_type, payload)
                else:
                    self._other_frame(frame_type, number, payload)
            except AMQPError as error:
                self.failed(error, channel, frame_type, payload)
            except Exception:
                peer_log.internal_error(self.peer_address, "internal error on channel %d of %s", number, self.peer)
                self.failed(errors.internal_error("internal error"), None)
            if self.state is not OPEN and self._close_done():
                return None
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is not AWAIT_HEADER and not self._closing():
            peer_log.warning(self.peer_address, "closing AMQP connection %s: client unexpectedly closed TCP "
                             "connection", self.described())
        self._enter(CLOSED)
        if self.vhost is not None:
            self.vhost.counters.connections_closed += 1
        if self.timer is not None:
            self.timer.cancel()
        if self.refusal is not None:
            self.refusal.cancel()
        self._release()
        for queue in self.throttled_by:
            queue.throttled.discard(self)
        if self.flow_timer is not None:
            self.flow_timer.cancel()
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume_held()
        for channel in self.channels.values():
            channel.offer_credit({consumer.queue for consumer in channel.consumers.values()})

    # --- writing -------------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.out.append(data)
        self.out_size += len(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write everything queued this loop turn in one transport.write."""
        self.flush_scheduled = False
        if self.out and not self._close_done() and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self.out)
            self.transport.write(data)
            self.sent_bytes += len(data)
            self.sent_since_tick = True
        self.out.clear()
        self.out_size = 0
        if self.held is not None and not self.write_paused:  # it all went out at once: go on at the next turn
            self._resume_held_soon()

    def send_method(self, channel: int, method) -> None:
        self.write(encode_method(channel, method))

    # --- handshake -----------------------------------------------------------------------------------------
    def _protocol_header(self, data: bytes) -> bytes:
        """Collect the 8-byte protocol header; answer a wrong one (a PROXY header included: clients another node
        forwards come through a front door, broker.connection.front_door) with ours and close. Returns what
        follows."""
        transport, reading = self.transport, self.start
        assert transport is not None and reading is not None, "the header came from it"
        try:
            _, start = reading.feed(data)
        except stream_start.WrongProtocolHeader:
            transport.write(PROTOCOL_HEADER)
            self._enter(CLOSED)
            transport.close()
            return b""
        if start is None:
            return b""
        self.start = None
        self._enter(AWAIT_START_OK)
        # logged once the client speaks AMQP, so that port probes (load balancers' health checks) leave no line
        peer_log.info(self.peer_address, "accepting AMQP connection %s", self.name)
        self._send_start()
        return start.rest

    def _send_start(self) -> None:
        server = self.server
        self.send_method(0, greeting.start(server.config, server.version, server.platform))

    def _other_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        """Frames on channel 0, on channels not open, and everything before the connection is open."""
        if frame_type == FRAME_HEARTBEAT:
            if number != 0:
                raise errors.unexpected_frame("type 8, all octets = <<>>")
            return
        if number == 0:
            if frame_type != FRAME_METHOD:
                raise errors.unexpected_frame("expected method frame, got non method frame instead")
            method = _decode_connection_method(payload)
            if method.name.split(".")[0] != "Connection":
                raise errors.channel_error("unexpected method in connection state running")
            self._connection_method(method)
            return
        if self.state is not OPEN:
            raise errors.command_invalid("channel frame received before the connection was opened")
        if number in self.settling_channels:
            return
        if number in self.closing_channels:
            method_index = _METHOD_INDEX.unpack_from(payload)[0] if frame_type == FRAME_METHOD else 0
            if method_index == CHANNEL_CLOSE_OK or method_index == CHANNEL_CLOSE:
                self.closing_channels.discard(number)
                if method_index == CHANNEL_CLOSE:
                    self.send_method(number, spec.Channel.CloseOk())
            return
        if frame_type != FRAME_METHOD:
            raise errors.unexpected_frame("expected method frame, got non method frame instead")
        if _METHOD_INDEX.unpack_from(payload)[0] != CHANNEL_OPEN:
            raise errors.channel_error("expected 'channel.open'")
        opened = len(self.channels) + len(self.closing_channels) + len(self.settling_channels)
        if opened >= self.channel_max:
            raise AMQPError(NOT_ALLOWED, f"number of channels opened ({opened}) has reached the negotiated "
                                         f"channel_max ({self.channel_max})", 0, 0)
        self.channels[number] = Channel(self, number)
        # RabbitMQ sends an empty channel_id, which pamqp's Channel.OpenOk refuses to encode.
        self.write(struct.pack(">BHI", FRAME_METHOD, number, len(_OPEN_OK_PAYLOAD)) + _OPEN_OK_PAYLOAD
                   + bytes((FRAME_END,)))

    def _connection_method(self, method) -> None:
        state = self.state
        if isinstance(method, spec.Connection.StartOk) and state is AWAIT_START_OK:
            self._start_ok(method)
        elif isinstance(method, spec.Connection.TuneOk) and state is AWAIT_TUNE_OK:
            self._tune_ok(method)
        elif isinstance(method, spec.Connection.Open) and state is AWAIT_OPEN:
            self._open(method)
        elif isinstance(method, spec.Connection.Close):
            if state is CLOSING:  # both sides closed at once: answer, and still wait for the peer's close-ok
                self.send_method(0, spec.Connection.CloseOk())
            elif state is not CLOSE_RECEIVED:  # (a second close, while the first is answered: nothing more)
                peer_log.info(self.peer_address, "closing AMQP connection %s: the client closed it (%d %.200r)",
                              self.described(), method.reply_code, method.reply_text)
                self._enter(CLOSE_RECEIVED)
                self._release(self._closed_by_client)
        elif isinstance(method, spec.Connection.CloseOk) and state is CLOSING:
            self._drain()
        elif isinstance(method, (spec.Connection.Blocked, spec.Connection.Unblocked, spec.Connection.UpdateSecret)):
            if isinstance(method, spec.Connection.UpdateSecret):
                self.send_method(0, spec.Connection.UpdateSecretOk())
        elif state is OPEN:
            raise errors.command_invalid(f"unexpected method {method.name} on channel 0")
        else:
            raise errors.command_invalid(f"expected connection handshake method, got {method.name}")

    def _start_ok(self, method: spec.Connection.StartOk) -> None:
        handed = self.handed
        # (a front door of this node that holds the users checked the login already, and counted it)
        user = handed.user if handed is not None and handed.user else check_login(
            self.server, method, self.peer_address, self.peer)
        if user is None:
            assert self.transport is not None and self.timer is not None, "the handshake runs on a transport, timed"
            self.timer.cancel()  # the handshake timeout: the refusal's wait is bounded
            self.refusal = Refusal(self.server, self.transport, self.peer_address, method, self._answer_refused)
            return
        self.user = user
        self.client_properties = method.client_properties or {}  # kept only once the client has logged in
        self.client_capabilities = capabilities(self.client_properties)
        self._enter(AWAIT_TUNE_OK)
        if handed is None or handed.answered < 2:  # (a front door sent tune after the start-ok it read)
            self.send_method(0, greeting.tune(self.server.config))

    def _answer_refused(self, text: str | None) -> None:
        self.refusal = None
        if self._closing():  # the client left meanwhile
            return
        if text is None:
            self._terminate()
            return
        assert self.transport is not None, "the handshake runs on a transport"
        self.transport.resume_reading()  # for the close-ok
        self.close(ACCESS_REFUSED, text)

    def _tune_ok(self, method: spec.Connection.TuneOk) -> None:
        config = self.server.config
        self.frame_max = _negotiate("frame_max", method.frame_max, config.frame_max, FRAME_MIN_SIZE)
        self.channel_max = _negotiate("channel_max", method.channel_max, config.channel_max, 1)
        self.reader.frame_max = self.frame_max
        self.heartbeat = method.heartbeat
        self._enter(AWAIT_OPEN)

    def _open(self, method: spec.Connection.Open) -> None:
        vhost = self.vhost = self.server.node.open_vhost(self.user, method.virtual_host)
        self._enter(OPEN)
        vhost.counters.connections_opened += 1
        provided = self.client_properties.get("connection_name")
        peer_log.info(self.peer_address, "connection %s: user '%s' authenticated and granted access to vhost '%s'%s",
                      self.name, self.user, vhost.name,
                      f" (client-provided name: {provided[:200]!r})" if isinstance(provided, str) else "")
        self.send_method(0, spec.Connection.OpenOk())
        self._start_heartbeats()

    def _handshake_timeout(self) -> None:
        if self._handshaking():
            peer_log.warning(self.peer_address, "closing AMQP connection %s: handshake timeout", self.name)
            self._terminate()

    # --- heartbeats ----------------------------------------------------------------------------------------
    def _start_heartbeats(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.heartbeat:
            self.timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        transport = self.transport
        if self.state is not OPEN or transport is None:
            return
        now = self.loop.time()
        if self.held is not None:  # we stopped reading because the client does not read: alive while it drains
            unread = transport.get_write_buffer_size()
            if unread < self.unread_at_tick:
                self.last_received = now
            self.unread_at_tick = unread
        elif self.reading_paused():
            self.last_received = now  # we are not reading: the client's heartbeats wait in the socket
        if now - self.last_received > 2 * self.heartbeat:
            peer_log.warning(self.peer_address, "closing AMQP connection %s: missed heartbeats from client, "
                             "timeout: %ds", self.described(), self.heartbeat)
            self._terminate()
            return
        if not self.sent_since_tick:
            # Written at once and not counted as traffic, as rabbit_heartbeat counts only what was sent between two
            # checks: an idle connection gets a heartbeat every half interval.
            transport.write(HEARTBEAT_FRAME)
        self.sent_since_tick = False
        self.timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # --- errors and closing ---------------------------------------------------------------------------------
    def failed(self, error: AMQPError, channel: Channel | None, frame_type: int = 0, payload: bytes = b"") -> None:
        """The one place errors close things, as protocol.errors.close_for decides: channel.close for a soft error
        on an open channel, else connection.close (or, where RabbitMQ does so, a dropped socket)."""
        close = close_for(error, channel is not None, frame_type, payload)
        if not close.connection and channel is not None:  # (close_for closes the connection when there is none)
            peer_log.info(self.peer_address, "channel error on connection %s, channel %d: %d %s",
                          self.described(), channel.number, close.reply_code, close.reply_text)
            self.close_channel(channel.number, send_close_ok=False)
            self.closing_channels.add(channel.number)
            self.send_method(channel.number, spec.Channel.Close(close.reply_code, close.reply_text, close.class_id,
                                                                close.method_id))
            return
        if self._closing():
            return
        peer_log.warning(self.peer_address, "closing AMQP connection %s: %d %s", self.described(), close.reply_code,
                         close.reply_text)
        if close.send_close:
            self.close(close.reply_code, close.reply_text, close.class_id, close.method_id)
        else:
            self._terminate()

    def close_channel(self, number: int, send_close_ok: bool) -> None:
        channel = self.channels.pop(number)
        channel.shutdown()
        if channel in self.waiting_channels:
            self.waiting_channels.discard(channel)
            self._update_reading()
        if send_close_ok:
            self.settling_channels[number] = channel
            channel.when_back(lambda: self._channel_closed(number))

    def _channel_closed(self, number: int) -> None:
        """A channel's close-ok, its deliveries back in their queues, unless the connection closed meanwhile."""
        if self.settling_channels.pop(number, None) is not None and self.state is OPEN:
            self.send_method(number, spec.Channel.CloseOk())

    def close(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Start a server-initiated close: channels go at once, the socket after close-ok or a timeout."""
        if self.transport is None or self._closing():
            return
        if self.state is AWAIT_HEADER:  # it has not spoken AMQP yet: there is no one to tell, the socket just goes
            self._terminate()
            return
        self._enter(CLOSING)
        close = spec.Connection.Close(reply_code, reply_text, class_id, method_id)
        self._release(lambda: self._send_close(close))

    def _send_close(self, close: spec.Connection.Close) -> None:
        """The server's close, once the connection's exclusive queues are gone (RabbitMQ deletes them before it sends
        its close); then close-ok is awaited, CLOSE_OK_TIMEOUT at most."""
        if self.state is not CLOSING:  # the socket went meanwhile
            return
        self.send_method(0, close)
        self.flush()
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._terminate)

    def close_for_shutdown(self) -> None:
        self.close(CONNECTION_FORCED, SHUTDOWN)

    def close_by_operator(self, reason: str) -> None:
        """An operator closed the connection, or deleted its user or vhost: 320 with reason, as RabbitMQ."""
        peer_log.warning(self.peer_address, "closing AMQP connection %s: %d %s", self.described(), CONNECTION_FORCED,
                         reason)
        self.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")

    def described(self) -> str:
        """The connection's name, with its vhost and user once it has them, for log lines."""
        if self.vhost is None:
            return f"{self.name} (user '{self.user}')" if self.user else self.name
        return f"{self.name} (vhost '{self.vhost.name}', user '{self.user}')"

    def _release(self, done: Callable[[], None] | None = None) -> None:
        """Channels and exclusive queues go as soon as the connection closes (before close-ok, as in RabbitMQ), not
        when the socket goes: a client may declare the same exclusive queue again right after its close-ok. The
        queues go a slice a loop turn; done() is called once they are gone and every channel's deliveries are back
        in their queues (RabbitMQ's close-ok waits for its channels to end)."""
        closed = [*self.channels.values(), *self.settling_channels.values()]
        for channel in self.channels.values():
            channel.shutdown()
        self.channels.clear()
        self.settling_channels.clear()
        self.waiting_channels.clear()
        settled = None if done is None else lambda: _when_back(closed, done)
        if self.vhost is not None:
            self.vhost.connection_closed(self, settled)
        elif settled is not None:
            settled()
        self.exclusive_queues.clear()

    def _closed_by_client(self) -> None:
        """The client's close, once its exclusive queues are gone: close-ok, unless the socket went meanwhile."""
        if self.state is CLOSE_RECEIVED:
            self.send_method(0, spec.Connection.CloseOk())
            self._drain()

    def _drain(self) -> None:
        """The close exchange is over: send what is queued (close-ok included) and our end of the stream, then
        read and discard until the peer closes its socket, or DRAIN_TIMEOUT passes."""
        self.flush()
        self._enter(DRAINING)
        transport = self.transport
        assert transport is not None, "a close exchange ran on it"
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(DRAIN_TIMEOUT, self._terminate)

    def _terminate(self) -> None:
        self._enter(CLOSED)
        if self.transport is not None:
            self.transport.close()


def _when_back(channels: list[Channel], done: Callable[[], None]) -> None:
    """done() once every one of the closed channels has its deliveries back in their queues."""
    while channels:
        channel = channels.pop()
        if not channel.back():
            channel.when_back(lambda: _when_back(channels, done))
            return
    done()


def _decode_connection_method(payload: bytes):
    """decode_method for channel 0, whose handshake tables arrive before login: whatever escapes the decoder is the
    client's malformed frame (501 and one log line), never an internal error with a traceback."""
    try:
        return decode_method(payload)
    except AMQPError:
        raise
    except Exception:
        text = "cannot decode " + erlang_terms.write(payload[4:132])
        raise AMQPError(FRAME_ERROR, text, *_CLASS_METHOD.unpack_from(payload)) from None


def _negotiate(name: str, client_value: int, server_max: int, minimum: int) -> int:
    """RabbitMQ's rules for tune-ok: 0 means 'no limit', which is above any maximum we offer."""
    if client_value == 0 or client_value > server_max:
        raise errors.not_allowed(f"{name}={client_value} > {server_max} max size")
    if client_value < minimum:
        raise errors.not_allowed(f"{name}={client_value} < {minimum} min size")
    return client_value

