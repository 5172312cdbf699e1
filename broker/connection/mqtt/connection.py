"""One MQTT client connection (3.1, 3.1.1 or 5.0): CONNECT and its login, the session's queues, PUBLISH, SUBSCRIBE,
keepalive, wills and takeover. Everything it does with messages goes through one AMQP channel of its own
(broker.session.channel, the one AMQP clients use, with every check, confirm and settlement of theirs): an MQTT
publish is a basic.publish to the MQTT exchange (amq.topic), a subscription a binding of the client's queue
(mqtt-subscription-<client id>qos0 or qos1) consumed by the channel, a PUBACK from the client a basic.ack, a
confirm of the channel a PUBACK to it (broker.connection.mqtt.replies reads what the channel writes back)."""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Final

from pamqp import commands as spec

from broker.connection import handoff
from broker.connection.auth import authenticate
from broker.connection.connection import CLOCK_LOOK_EVERY, read_deadline
from broker.connection.mqtt import topics
from broker.connection.mqtt.expiry import MAX_SESSION_EXPIRY
from broker.connection.mqtt.messages import amqp_header, encoded_properties, view_of
from broker.connection.mqtt.replies import ChannelReplies
from broker.connection.mqtt.retained_out import RetainedSender
from broker.connection.mqtt.subscriptions import SHARED_TAG_PREFIX, Subscriptions, qos_of_consumer, queue_name
from broker.connection.mqtt.websocket import OVER_A_WEBSOCKET
from broker.connection.peer_log import PeerLog
from broker.model.operations import Actor, delete_queue
from broker.model.turns import go_on_after_replies
from broker.session.channel import Channel
from protocol import mqtt
from protocol.codec import encode_method
from protocol.constants import CHANNEL_CLOSE_OK, FRAME_BODY, FRAME_HEADER, FRAME_METHOD, BASIC_PUBLISH
from protocol.errors import AMQPError
from protocol.fastpath import encode_ack

if TYPE_CHECKING:
    from broker.connection.server import Server
    from broker.model.retained import Retained
    from broker.model.vhost import VirtualHost
    from broker.session.limits import ChannelLimits

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # every line about one client goes through here, so that no client can flood the log

CONNECT_TIMEOUT: Final = 10.0  # seconds a client has to send CONNECT (RabbitMQ's login_timeout)
UNAUTHENTICATED_PACKET_SIZE: Final = 65_536  # largest packet before the login (RabbitMQ 4.x's)
RECEIVE_MAXIMUM: Final = 1024  # QoS 2 publishes a client may have waiting for their PUBREL (5.0: in CONNACK)
TOPIC_ALIAS_MAXIMUM: Final = 16  # 5.0: topic aliases a client may set (as RabbitMQ 4.x)
READ_BUDGET: Final = 128 * 1024  # bytes read from one client per loop turn (as an AMQP connection's)
OUTPUT_LIMIT: Final = 4 * 1024 * 1024  # unread bytes to a client above which it is not read until it reads them
FLOW_MAX_PAUSE: Final = 0.1  # longest a queue's flow control holds the client back at a time (as AMQP's)
_PUBLISH_HEAD: Final = struct.Struct(">IHB")  # basic.publish's method id, ticket, exchange length
_CHANNEL: Final = 1  # the number of the connection's one channel
METRIC_LABELS: Final = {mqtt.MQTT_3_1: "mqtt310", mqtt.MQTT_3_1_1: "mqtt311", mqtt.MQTT_5: "mqtt50"}


class State(enum.Enum):
    AWAIT_CONNECT = "awaiting CONNECT"
    CONNECTING = "CONNECT read: logging in and opening the session"
    OPEN = "open"
    CLOSED = "closed"


AWAIT_CONNECT: Final = State.AWAIT_CONNECT
CONNECTING: Final = State.CONNECTING
OPEN: Final = State.OPEN
CLOSED: Final = State.CLOSED


class _Pending:
    """A method sent to the channel, waiting for its reply: ok() then, or refused(error) if the channel refuses it."""

    __slots__ = ("payload", "ok", "refused")

    def __init__(self, payload: bytes, ok: Callable[[], None], refused: Callable[[AMQPError], None]):
        self.payload = payload  # its frame's payload: the very object the channel hands back if it held the frame
        self.ok = ok
        self.refused = refused


class MqttConnection(asyncio.Protocol):
    """An MQTT client's socket, and the ChannelHost (broker.session.interfaces) of its one channel."""

    def __init__(self, server: "Server", handed: handoff.HandedOver | None = None):
        self.server = server
        self.handed = handed  # what a front door read of the client (broker.connection.mqtt.front_door), if one did
        self.config = server.config
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.state = AWAIT_CONNECT
        self.reader = mqtt.PacketReader(UNAUTHENTICATED_PACKET_SIZE)
        self.level = mqtt.MQTT_3_1_1  # the protocol level CONNECT asked for
        self.client_id = ""
        self.clean = True  # a clean session: its queues go with the connection (5.0: session expiry 0)
        self.session_expiry = 0  # 5.0: seconds the session outlives the connection
        self.keepalive = 0  # seconds, 0 = none
        self.will: mqtt.Will | None = None  # published if the client goes without DISCONNECT
        self.user = ""  # who logged in
        self.vhost: VirtualHost | None = None
        self.channel: Channel | None = None
        self.replies = ChannelReplies(self)
        self.channel_out: list[bytes] = []  # what the channel wrote, read once the call that wrote it is over
        self.draining_scheduled = False
        self.draining = False  # the channel's output is being read (what is written meanwhile joins it)
        self.waiting: deque[_Pending] = deque()  # methods sent to the channel, in order, waiting for replies
        self.next_seq = 1  # the channel's confirm number of the next publish
        # confirm number -> (packet id, PUBACK or PUBREC) of QoS 1 and 2 publishes, answered once confirmed
        self.awaiting_confirm: dict[int, tuple[int, int]] = {}
        # QoS 2 publishes taken, by packet id, until the client's PUBREL: whether PUBREC went (a resend is not
        # published again); the session's, which a connection that takes it up goes on with
        self.received_qos2: dict[int, bool] = {}
        self.next_packet_id = 1  # of the next QoS 1 message sent to the client
        self.inflight: dict[int, int] = {}  # packet id -> delivery tag (0: a retained message) awaiting PUBACK
        self.retained_inflight = 0  # of those, retained messages
        self.receive_maximum = self.config.mqtt_prefetch  # QoS 1 messages it takes unacknowledged (a consumer's)
        self.retained_out: RetainedSender | None = None  # sends the retained messages of new subscriptions
        self.to_ack: list[int] = []  # deliveries of the QoS 1 queue sent at QoS 0: acked as soon as they are sent
        self.subscriptions = Subscriptions(self)
        self.topic_aliases: dict[int, str] = {}  # 5.0: the topics the client's publishes name by alias
        self.client_max_packet = mqtt.MAX_REMAINING_LENGTH  # 5.0: the largest packet the client takes
        self.client_alias_maximum = 0  # 5.0: topic aliases the client takes from the server
        self.server_aliases: dict[str, int] = {}  # 5.0: topic -> the alias this server gave it (first come)
        self.early: list[tuple[int, bytes]] = []  # packets that came while CONNECT was being answered
        self.out: list[bytes] = []
        self.out_size = 0
        self.flush_scheduled = False
        self.write_paused = False  # (ChannelHost) the client reads too slowly: no deliveries until it catches up
        self.exclusive_queues: set = set()  # (ChannelHost) none: the session queues are never exclusive
        self.limits: ChannelLimits = server.channel_limits
        self.frame_max = 0  # (ChannelHost) no limit: a delivery's body comes in one frame (0 in the API, as RabbitMQ)
        # (ChannelHost) a consumer its queue's deletion cancels is told (basic.cancel): the connection closes then
        self.client_capabilities: dict = {"consumer_cancel_notify": True}
        self.last_received = 0.0  # loop time of the last bytes from the client
        self.read_this_turn = 0
        self.turn_paused = False
        self.held_by_channel = False  # the channel holds many frames while a reply waits for the disk
        # a SUBSCRIBE is being made: the packets after it wait for its SUBACK, as RabbitMQ handles a packet at a time
        # (a PUBLISH right after it was routed before the first subscription's binding was made, and lost)
        self.subscribing = False
        self.throttled_by: set = set()  # queues over their flow-control limit this client publishes to
        self.flow_timer: asyncio.TimerHandle | None = None
        self.blocked = False  # published during a resource alarm: not read until it clears
        self.timer: asyncio.TimerHandle | None = None  # the CONNECT timeout, then keepalive checks
        self.disconnected = False  # it sent DISCONNECT: no will
        self.taken_over = False  # another connection took its client id: no will
        # marks its publishes while it has no_local subscriptions: its client id's, keyed (never the id itself)
        self.token = ""
        self.fresh_session = False  # it took a client id over from a clean session: there is none to resume
        self.peer = self.peer_address = self.name = ""
        self.peer_port = 0
        self.connected_at = 0  # wall-clock milliseconds, for the management API
        self.received_bytes = self.sent_bytes = 0
        self.tls = False
        self.web = False  # it speaks MQTT over a WebSocket (RabbitMQ's Web MQTT), here or to its front door
        # What the management API shows of it, as it shows an AMQP connection (RabbitMQ's keys)
        self.channels: dict[int, Channel] = {}  # its one channel, once logged in
        self.channel_max = 1
        self.client_properties: dict = {}  # RabbitMQ's for an MQTT client: product and client id
        self.local: tuple | None = None  # (host, port) the client connected to

    # --- the socket --------------------------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handed = self.handed  # (a handed connection's ends, and whether it speaks TLS, are what its front door saw)
        self.tls = handed.tls if handed is not None else transport.get_extra_info("sslcontext") is not None
        self.web = handed.web if handed is not None else transport.get_extra_info(OVER_A_WEBSOCKET) is True
        peer = tuple(handed.peer) if handed is not None else transport.get_extra_info("peername")
        local = tuple(handed.local) if handed is not None else transport.get_extra_info("sockname")
        self.peer_address, self.peer_port = (peer[0], peer[1]) if peer else ("", 0)
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.local = tuple(local) if local else None
        self.name = f"{self.peer} -> {local[0]}:{local[1]}" if local else self.peer
        self.connected_at = handed.connected_at if handed is not None else int(time.time() * 1000)
        self.last_received = self.loop.time()
        self.server.connections.add(self)
        self.timer = self.loop.call_later(CONNECT_TIMEOUT, self._connect_timeout)
        if handed is not None and handed.data:
            self.data_received(handed.data)

    def data_received(self, data: bytes) -> None:
        if self.state is CLOSED:
            return
        self.last_received = self.loop.time()
        self.received_bytes += len(data)
        self.read_this_turn += len(data)
        try:
            packets = self.reader.feed(data)
            failure = None
        except mqtt.MqttError as error:
            packets, failure = [], error
        self._handle(packets)
        if failure is not None and self.state is not CLOSED:
            self._refuse_packet(failure)
        if self.read_this_turn > READ_BUDGET and self.state is not CLOSED:
            self.turn_paused = True
            self._update_reading()
            self.loop.call_soon(self._next_turn)

    def _handle(self, packets: list[tuple[int, bytes]]) -> None:
        """Handle packets; those left when CONNECT is being answered, the channel waits, a SUBSCRIBE is being made,
        or the read's time is spent (read_deadline) wait (the last until the next loop turn's replies are out:
        go_on_after_replies)."""
        channel = self.channel
        ends = read_deadline(0.0) if len(packets) > CLOCK_LOOK_EVERY else 0.0
        look_at = CLOCK_LOOK_EVERY  # the index of the packet before which the clock is looked at next
        for index, (first, body) in enumerate(packets):
            if self.state is CLOSED:
                return
            if index == look_at:
                ends = read_deadline(ends)
                look_at += CLOCK_LOOK_EVERY
            spent = ends < 0
            if self.state is CONNECTING or self.held_by_channel or self.subscribing or spent:
                self.early.extend(packets[index:])
                self._update_reading()
                if spent:
                    go_on_after_replies(self.loop, self._go_on)
                break
            try:
                if self.state is AWAIT_CONNECT:
                    self._connect(first, body)
                else:
                    self._packet(mqtt.read_packet(first, body, self.level))
            except mqtt.MqttError as error:
                self._refuse_packet(error)
                return
            except AMQPError as error:
                self._refused_by_channel(error)
                return
            except Exception:
                peer_log.internal_error(self.peer_address, "internal error on MQTT connection %s", self.described())
                self._terminate()
                return
            channel = self.channel
        if channel is not None and channel.open:
            channel.read_processed()
        self._drain_channel()

    def _next_turn(self) -> None:
        self.read_this_turn = 0
        self.turn_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if (self.turn_paused or self.throttled_by or self.blocked or self.held_by_channel or self.early
                or self.out_size + transport.get_write_buffer_size() > OUTPUT_LIMIT):
            transport.pause_reading()
        else:
            transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is OPEN and not self.disconnected and not self.taken_over:
            peer_log.warning(self.peer_address, "MQTT connection %s will terminate because peer closed TCP "
                             "connection", self.described())
            self._publish_will()
        self._release()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._update_reading()
        if self.retained_out is not None:
            self.retained_out.resume()
        channel = self.channel
        if channel is not None and channel.open:
            channel.offer_credit({consumer.queue for consumer in channel.consumers.values()})

    # --- writing to the client ---------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.out.append(data)
        self.out_size += len(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        transport = self.transport
        if self.out and transport is not None and not transport.is_closing():
            data = b"".join(self.out)
            transport.write(data)
            self.sent_bytes += len(data)
        self.out.clear()
        self.out_size = 0
        self._update_reading()

    # --- CONNECT -----------------------------------------------------------------------------------------------
    def _connect(self, first: int, body: bytes) -> None:
        if first >> 4 != mqtt.CONNECT:
            peer_log.warning(self.peer_address, "MQTT protocol error on connection %s: the first packet is %s, "
                             "not CONNECT", self.name, mqtt.NAMES.get(first >> 4, first >> 4))
            self._terminate()
            return
        if first & 0x0F:
            raise mqtt.malformed("CONNECT with flags")
        try:
            connect = mqtt.read_connect(body)
        except mqtt.MqttError as error:
            if error.reason == mqtt.UNSUPPORTED_PROTOCOL_VERSION:
                level = mqtt.MQTT_5 if error.text.endswith("level 5 is not supported") else mqtt.MQTT_3_1_1
                peer_log.warning(self.peer_address, "MQTT connection %s refused: %s", self.name, error.text)
                self._refuse_connect(mqtt.REFUSED_PROTOCOL_VERSION, mqtt.UNSUPPORTED_PROTOCOL_VERSION, level)
                return
            raise
        self.level = connect.level
        self.keepalive = connect.keepalive
        self.will = connect.will
        self.clean = connect.clean_start
        if connect.level == mqtt.MQTT_5:
            properties = connect.properties
            if "authentication_method" in properties:  # (enhanced authentication: refused, as RabbitMQ 4.x does)
                peer_log.warning(self.peer_address, "MQTT cannot accept connection %s: enhanced authentication "
                                 "(method %.100r) is not supported", self.name, properties["authentication_method"])
                self._refuse_connect(mqtt.REFUSED_NOT_AUTHORIZED, mqtt.BAD_AUTHENTICATION_METHOD)
                return
            self.session_expiry = min(properties.get("session_expiry_interval", 0), MAX_SESSION_EXPIRY)
            if properties.get("receive_maximum") == 0 or properties.get("maximum_packet_size") == 0:
                raise mqtt.protocol_error("a receive maximum or maximum packet size of 0")
            self.client_max_packet = properties.get("maximum_packet_size", self.client_max_packet)
            # (as many as it takes, up to as many as it may give: the broker keeps a topic for each)
            self.client_alias_maximum = min(properties.get("topic_alias_maximum", 0), TOPIC_ALIAS_MAXIMUM)
        elif not connect.clean_start:
            self.session_expiry = MAX_SESSION_EXPIRY
        assigned = None
        client_id = connect.client_id
        if not client_id:
            if not connect.clean_start and connect.level != mqtt.MQTT_5:
                peer_log.warning(self.peer_address, "MQTT cannot accept connection %s: client uses an invalid ID",
                                 self.name)
                self._refuse_connect(mqtt.REFUSED_IDENTIFIER, mqtt.CLIENT_IDENTIFIER_NOT_VALID)
                return
            client_id = assigned = _generated_id()
        if len(queue_name(client_id, 0).encode()) > 255:
            peer_log.warning(self.peer_address, "MQTT cannot accept connection %s: its client id is longer than "
                             "the %d bytes a queue name leaves it", self.name, 255 - len(queue_name("", 0)))
            self._refuse_connect(mqtt.REFUSED_IDENTIFIER, mqtt.CLIENT_IDENTIFIER_NOT_VALID)
            return
        self.client_id = client_id
        self.state = CONNECTING
        self._log_in(connect, assigned)

    def _log_in(self, connect: mqtt.Connect, assigned: str | None) -> None:
        """Check the login as AMQP's is checked: the node's users, loopback users from this machine alone, the
        throttle on refused logins; then the vhost and its permissions."""
        config = self.config
        username, password = connect.username, connect.password
        if username is None and password is None and config.mqtt_allow_anonymous:
            username, password = config.mqtt_default_user, config.mqtt_default_pass.encode()
        if username is None or password is None:
            peer_log.warning(self.peer_address, "MQTT login failed for connection %s: no credentials provided",
                             self.name)
            self._refuse_login()
            return
        vhost_name, username = vhost_and_user(username, config.mqtt_vhost)
        server = self.server
        node = server.node
        login = authenticate(node, config.loopback_users, "PLAIN",
                             b"\x00" + username.encode() + b"\x00" + password, self.peer_address)
        counters = node.counters_of(self.protocol_label)
        counters.auth_attempts += 1
        if not login.accepted:
            counters.auth_failed += 1
            peer_log.warning(self.peer_address, "MQTT login failed for user %.100r from %s: %s", username, self.peer,
                             login.reason)
            self._refuse_login()
            return
        server.failed_logins.accepted(self.peer_address)
        self.user = login.user
        if vhost_name not in node.vhosts:
            peer_log.warning(self.peer_address, "MQTT login failed for user %.100r: virtual host %.200r does not "
                             "exist", username, vhost_name)
            self._refuse_connect(mqtt.REFUSED_BAD_CREDENTIALS, mqtt.BAD_USER_NAME_OR_PASSWORD)
            return
        try:
            vhost = node.open_vhost(login.user, vhost_name)
        except AMQPError as error:
            peer_log.warning(self.peer_address, "MQTT login failed for user %.100r: virtual host access not "
                             "allowed (%s)", username, error.reply_text)
            self._refuse_connect(mqtt.REFUSED_NOT_AUTHORIZED, mqtt.NOT_AUTHORIZED)
            return
        self.vhost = vhost
        self.token = hmac.new(self.server.mqtt_token_key, f"{vhost.name}\x00{self.client_id}".encode(),
                              hashlib.sha256).hexdigest()[:32]
        self.retained_out = RetainedSender(node.retained, vhost.name, self._send_retained, self._may_send_retained)
        self.reader.max_size = config.mqtt_max_packet_size
        counters.connections_opened += 1
        peer_log.info(self.peer_address, "accepting MQTT connection %s (client id: %.200r)", self.name,
                      self.client_id)
        self._take_client_id()
        self.channel = Channel(self, _CHANNEL)
        self.channel.access.client_id = self.client_id  # ({client_id} in topic permissions)
        self.channel.counters = counters  # (its publishes counted as MQTT's, as RabbitMQ's global counters are)
        self.channels = {_CHANNEL: self.channel}
        self.client_properties = {"product": "MQTT client", "client_id": self.client_id}
        self.send_method(spec.Confirm.Select(), lambda: None)
        prefetch = self.receive_maximum = min(config.mqtt_prefetch,
                                              connect.properties.get("receive_maximum", config.mqtt_prefetch))
        self.send_method(spec.Basic.Qos(prefetch_count=prefetch), lambda: None)
        if "receive_maximum" in connect.properties:  # (5.0: a limit of the whole connection, whatever it consumes)
            self.send_method(spec.Basic.Qos(prefetch_count=prefetch, global_=True), lambda: None)
        self._open_session(lambda present: self._accepted(present, assigned))

    def _refuse_login(self) -> None:
        """A refused login's CONNACK waits as an AMQP one's close does (broker.connection.login_throttle)."""
        self.transport.pause_reading()
        if self.timer is not None:
            self.timer.cancel()
        answer = lambda: self._refuse_connect(mqtt.REFUSED_BAD_CREDENTIALS, mqtt.BAD_USER_NAME_OR_PASSWORD)
        self.server.failed_logins.count_refused(
            self.peer_address, self.config.failed_login_delay,
            lambda delay: self._later(delay, answer))

    def _later(self, delay: float, action: Callable[[], None]) -> None:
        if self.state is CLOSED:
            return
        self.timer = self.loop.call_later(max(delay, 0), action)

    def _refuse_connect(self, code: int, reason: int, level: int | None = None) -> None:
        """CONNACK with the refusal (a 3.1.1 return code, or a 5.0 reason code), then close."""
        level = self.level if level is None else level
        self.send(mqtt.connack(False, reason if level == mqtt.MQTT_5 else code, level))
        self.flush()
        self._terminate()

    def _take_client_id(self) -> None:
        """A second connection with the same client id in the vhost takes over: the first is closed, without its
        will (RabbitMQ keys client ids by vhost and client id since 3.13)."""
        assert self.vhost is not None, "logged in"
        key = (self.vhost.name, self.client_id)
        clients = self.server.mqtt_clients
        earlier = clients.get(key)
        clients[key] = self
        waiting_qos2 = self.server.mqtt_sessions.cancel(key)  # (taken up, or ended below)
        if self.clean:  # (the session a held will waits on ends now; one taken up again keeps its will back)
            self.server.mqtt_wills.session_ended(key, self.peer_address)
        else:
            self.server.mqtt_wills.cancel(key)
            self.received_qos2 = dict.fromkeys(waiting_qos2, True)
        if earlier is not None and earlier is not self:
            self.fresh_session = not earlier.session_expiry  # (its session ends with it: none goes on here)
            if not self.clean and not self.fresh_session:
                self.received_qos2 = dict.fromkeys(earlier.received_qos2, True)
            earlier.take_over()

    def take_over(self) -> None:
        peer_log.warning(self.peer_address, "MQTT disconnecting client %s with duplicate id %.200r", self.name,
                         self.client_id)
        self.taken_over = True
        if self.level == mqtt.MQTT_5 and self.state is OPEN:
            self.send(mqtt.disconnect(mqtt.SESSION_TAKEN_OVER))
            self.flush()
        self._terminate()

    def _open_session(self, done: Callable[[bool], None]) -> None:
        """A clean session deletes the queue a persistent one left; a persistent one consumes the queues it left
        (done(present): whether there was a session to go on with)."""
        assert self.vhost is not None, "logged in"
        name = self.subscriptions.queue_name(1)
        existed = name in self.vhost.queues
        if self.clean or self.fresh_session:
            if existed:
                self.send_method(spec.Queue.Delete(queue=name), lambda: done(False), self._session_refused)
            else:
                done(False)
            return
        if not existed:
            done(False)
            return
        self.subscriptions.resume(self.vhost.queues[name])
        self.subscriptions.ensure_queue(1, lambda: done(True), self._session_refused, resumed=True)

    def _session_refused(self, error: AMQPError) -> None:
        peer_log.warning(self.peer_address, "MQTT cannot start a session for connection %s: %s", self.name,
                         error.reply_text)
        self._refuse_connect(mqtt.REFUSED_SERVER_UNAVAILABLE, mqtt.IMPLEMENTATION_SPECIFIC_ERROR)

    def _accepted(self, session_present: bool, assigned: str | None) -> None:
        if self.state is not CONNECTING:
            return
        properties: dict = {}
        if self.level == mqtt.MQTT_5:
            properties = {"receive_maximum": RECEIVE_MAXIMUM, "retain_available": 1, "shared_subscription_available": 1,
                          "subscription_identifier_available": 1, "wildcard_subscription_available": 1,
                          "topic_alias_maximum": TOPIC_ALIAS_MAXIMUM,
                          "maximum_packet_size": self.config.mqtt_max_packet_size}
            if assigned is not None:
                properties["assigned_client_identifier"] = assigned
        self.send(mqtt.connack(session_present, mqtt.ACCEPTED, self.level, properties))
        self.state = OPEN
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.keepalive:
            self.timer = self.loop.call_later(self.keepalive * 1.5, self._keepalive_check)
        self._go_on()

    def _go_on(self) -> None:
        """Handle the packets that waited (for CONNACK, or for the channel), then read again."""
        early, self.early = self.early, []
        if early:
            self._handle(early)
        self._update_reading()

    # --- packets after CONNECT ---------------------------------------------------------------------------------
    def _packet(self, packet: mqtt.Packet) -> None:
        if isinstance(packet, mqtt.Publish):
            self._publish(packet)
        elif isinstance(packet, mqtt.Acknowledgement):
            self._acknowledged(packet)
        elif isinstance(packet, mqtt.Subscribe):
            self.subscribing = True
            self.subscriptions.subscribe(packet)
        elif isinstance(packet, mqtt.Unsubscribe):
            self.subscriptions.unsubscribe(packet)
        elif isinstance(packet, mqtt.Ping):
            self.send(mqtt.PINGRESP_PACKET)
        elif isinstance(packet, mqtt.Disconnect):
            expiry = packet.properties.get("session_expiry_interval")
            if expiry is not None:  # (5.0: the session's expiry changed as the connection goes)
                if expiry and not self.session_expiry:
                    raise mqtt.protocol_error("a session expiry interval set at DISCONNECT after CONNECT's 0")
                self.session_expiry = min(expiry, MAX_SESSION_EXPIRY)
            if self.level == mqtt.MQTT_5 and packet.reason == 0x04:  # "disconnect with will message"
                self._publish_will()
            self.disconnected = True
            peer_log.info(self.peer_address, "closing MQTT connection %s (client disconnected)", self.described())
            self._terminate()
        else:
            raise mqtt.protocol_error("AUTH outside an authentication exchange")

    def _publish(self, packet: mqtt.Publish) -> None:
        if "topic_alias" in packet.properties:
            self._resolve_alias(packet)
        if packet.qos == 2:
            received = self.received_qos2.get(packet.packet_id)
            if received is not None:  # (a resend of one published already: PUBREC again, once it went)
                if received:
                    self.send(mqtt.acknowledgement(mqtt.PUBREC, packet.packet_id, self.level))
                return
            if len(self.received_qos2) >= RECEIVE_MAXIMUM:
                raise mqtt.MqttError(mqtt.RECEIVE_MAXIMUM_EXCEEDED, f"more than {RECEIVE_MAXIMUM} QoS 2 publishes "
                                                                    f"wait for their PUBREL")
            self.received_qos2[packet.packet_id] = False
        qos = min(packet.qos, 1)  # (stored as QoS 1: a QoS 2 publish is once here by its packet id)
        self._send_publish(packet.topic, packet.payload, qos, packet.dup, packet.properties, packet.retain)
        if qos:
            answer = mqtt.PUBREC if packet.qos == 2 else mqtt.PUBACK
            self.awaiting_confirm[self.next_seq - 1] = (packet.packet_id, answer)
        if packet.retain:  # (the user may write there, whether or not the channel has taken the publish yet)
            assert self.vhost is not None and self.channel is not None, "logged in"
            access, exchange = self.channel.access, self.config.mqtt_exchange
            access.check_publish(exchange)
            if (found := self.vhost.exchanges.get(exchange)) is not None:
                access.check_published_keys(found, [topics.routing_key(packet.topic)])
            self.server.node.retained.put(self.vhost.name, packet.topic, packet.payload, qos,
                                          _retained_properties(packet.properties))

    def _resolve_alias(self, packet: mqtt.Publish) -> None:
        """5.0: a topic alias set (with a topic) or used (without)."""
        alias = packet.properties["topic_alias"]
        if not 0 < alias <= TOPIC_ALIAS_MAXIMUM:
            raise mqtt.MqttError(mqtt.TOPIC_ALIAS_INVALID, f"topic alias {alias} is outside 1 to {TOPIC_ALIAS_MAXIMUM}")
        if packet.topic:
            self.topic_aliases[alias] = packet.topic
            return
        topic = self.topic_aliases.get(alias)
        if topic is None:
            raise mqtt.protocol_error(f"topic alias {alias} was never set")
        packet.topic = topic

    def _send_publish(self, topic: str, payload: bytes, qos: int, dup: bool, properties: dict,
                      retain: bool) -> None:
        """basic.publish to the MQTT exchange, through the channel."""
        key = topics.routing_key(topic).encode()
        if len(key) > 255:
            raise mqtt.MqttError(mqtt.TOPIC_NAME_INVALID, f"the topic {topic[:100]!r}... is longer than the 255 "
                                                          f"bytes of a routing key")
        channel = self.channel
        assert channel is not None, "logged in"
        exchange = self.config.mqtt_exchange.encode()
        channel.handle_frame(FRAME_METHOD, _PUBLISH_HEAD.pack(BASIC_PUBLISH, 0, len(exchange)) + exchange
                             + bytes((len(key),)) + key + b"\x00")
        publisher = self.token if self.subscriptions.no_local else ""
        channel.handle_frame(FRAME_HEADER, amqp_header(qos, dup, len(payload), properties, retain, publisher))
        if payload:
            channel.handle_frame(FRAME_BODY, payload)
        self.next_seq += 1

    def _acknowledged(self, packet: mqtt.Acknowledgement) -> None:
        if packet.kind == mqtt.PUBACK:
            tag = self.inflight.pop(packet.packet_id, None)
            if tag:
                self._ack(tag)
            elif tag == 0:
                self.retained_inflight -= 1
                self.retained_out.resume()
        elif packet.kind == mqtt.PUBREL:
            known = self.received_qos2.pop(packet.packet_id, None) is not None
            self.send(mqtt.acknowledgement(mqtt.PUBCOMP, packet.packet_id, self.level,
                                           mqtt.SUCCESS if known else mqtt.PACKET_IDENTIFIER_NOT_FOUND))

    def _ack(self, tag: int) -> None:
        channel = self.channel
        if channel is not None and channel.open:
            channel.handle_frame(FRAME_METHOD, encode_ack(_CHANNEL, tag, False)[7:-1])

    def log_refusal(self, topic_filter: str, why: str) -> None:
        peer_log.warning(self.peer_address, "MQTT connection %s: subscription to %.200r refused: %s", self.name,
                         topic_filter, why)

    def subscribed(self, packet_id: int, codes: list[int], granted: list[tuple[str, int]]) -> None:
        """SUBACK, then the retained messages the new subscriptions (topic filter, QoS) match, a slice at a time;
        the packets that came after the SUBSCRIBE are handled at the next loop turn."""
        self.subscribing = False
        self.loop.call_soon(self._go_on)
        if self.state is not OPEN:
            return
        self.send(mqtt.suback(packet_id, codes, self.level))
        for topic_filter, qos in granted:
            if not self.retained_out.add(topic_filter, qos):
                peer_log.warning(self.peer_address, "MQTT connection %s: no retained messages for %.200r: the "
                                 "retained messages of too many subscriptions wait to be sent", self.described(),
                                 topic_filter)

    def _may_send_retained(self, qos: int) -> bool:
        """A retained message goes while the client reads, and at QoS 1 within the prefetch's count of retained
        messages unacknowledged."""
        return not self.write_paused and (not qos or self.retained_inflight < self.receive_maximum)

    def _send_retained(self, message: "Retained", topic_filter: str, qos: int) -> None:
        qos = min(qos, message.qos)
        properties = b""
        if self.level == mqtt.MQTT_5:
            extra = dict(message.properties)
            if identifier := self.subscriptions.identifiers.get(topic_filter):
                extra["subscription_identifier"] = [identifier]
            if message.expires_at:  # (what is left of its expiry interval)
                extra["message_expiry_interval"] = _seconds_left(message.expires_at)
            properties = mqtt.encode_properties(extra)
        topic = message.topic.encode()
        if mqtt.publish_size(topic, message.payload, qos, properties) > self.client_max_packet:
            return  # (5.0: a message the client cannot take is dropped)
        packet_id = 0
        if qos:
            packet_id = self._packet_id(0)
            self.retained_inflight += 1
        self.send(mqtt.publish(topic, message.payload, qos, True, False, packet_id, properties))

    # --- the channel -------------------------------------------------------------------------------------------
    def send_method(self, method, ok: Callable[[], None],
                     refused: Callable[[AMQPError], None] | None = None) -> None:
        """Hand the channel a method; ok() once it replied, refused(error) if it refused it (None: the refusal
        ends the connection)."""
        channel = self.channel
        if channel is None or not channel.open:
            return
        pending = _Pending(encode_method(_CHANNEL, method)[7:-1], ok, refused or self._refused_by_channel)
        self.waiting.append(pending)
        try:
            channel.handle_frame(FRAME_METHOD, pending.payload)
        except AMQPError as error:
            self._method_refused(pending, error)

    def _method_refused(self, pending: _Pending, error: AMQPError) -> None:
        """A method was refused: it gets no reply (those of the methods before it still come, in order)."""
        self.waiting.remove(pending)
        pending.refused(error)

    def write(self, data: bytes) -> None:
        """(ChannelHost) what the channel writes: read once the call that wrote it returns."""
        self.channel_out.append(data)
        if not self.draining_scheduled:
            self.draining_scheduled = True
            self.loop.call_soon(self._drain_channel)

    def _drain_channel(self) -> None:
        """Read what the channel wrote, in order (what its reading makes the channel write joins the end)."""
        self.draining_scheduled = False
        if self.draining:
            return
        self.draining = True
        out = self.channel_out
        try:
            while out and self.state is not CLOSED:
                self.replies.feed(out.pop(0))
                to_ack, self.to_ack = self.to_ack, []
                for tag in to_ack:
                    self._ack(tag)
        except AMQPError as error:
            self._refused_by_channel(error)
        except Exception:
            peer_log.internal_error(self.peer_address, "internal error on MQTT connection %s", self.described())
            self._terminate()
        finally:
            self.draining = False
        out.clear()

    def delivered(self, consumer_tag: bytes, delivery_tag: int, redelivered: bool, routing_key: bytes,
                  header_payload: bytes, body: bytes) -> None:
        view = view_of(header_payload)
        from_qos1 = qos_of_consumer(consumer_tag) == 1
        shared = consumer_tag.startswith(SHARED_TAG_PREFIX)  # (a shared subscription's: no_local is none of its)
        qos = min(view.qos, 1) if from_qos1 else 0
        topic = topics.topic(routing_key.decode())
        if topic.startswith("$") and not self.subscriptions.reaches(topic):
            if from_qos1:  # (matched by a filter that begins with a wildcard alone: not for this client)
                self.to_ack.append(delivery_tag)
            return
        properties = b""
        retain = False
        topic_bytes = topic.encode()
        alias = 0  # 5.0: the topic alias it goes with (0: none)
        if self.level == mqtt.MQTT_5:
            subscriptions = self.subscriptions
            if view.publisher == self.token and not shared and subscriptions.only_no_local(topic):
                if from_qos1:  # (its own message, which its subscriptions take no_local)
                    self.to_ack.append(delivery_tag)
                return
            retain = view.retain and bool(subscriptions.as_published) and subscriptions.keeps_retain_flag(topic)
            extra: dict = {}
            if subscriptions.identifiers and (identifiers := subscriptions.identifiers_for(topic)):
                extra["subscription_identifier"] = identifiers
            if view.expires_at:  # (what is left of its expiry interval)
                extra["message_expiry_interval"] = _seconds_left(view.expires_at)
            if self.client_alias_maximum:
                alias = self.server_aliases.get(topic) or (len(self.server_aliases) + 1 if len(
                    self.server_aliases) < self.client_alias_maximum else 0)
                if alias:
                    extra["topic_alias"] = alias
            properties = encoded_properties(view, extra)
        if self.client_max_packet < mqtt.MAX_REMAINING_LENGTH and mqtt.publish_size(
                topic_bytes, body, qos, properties) > self.client_max_packet:
            peer_log.warning(self.peer_address, "MQTT connection %s: a message is dropped: the client takes "
                             "packets of %d bytes at most", self.described(), self.client_max_packet)
            if from_qos1:
                self.to_ack.append(delivery_tag)  # (5.0: as if sent, the spec says)
            return
        if alias:  # (the topic goes with its alias the first time, then the alias alone)
            if topic in self.server_aliases:
                topic_bytes = b""
            else:
                self.server_aliases[topic] = alias
        if qos:
            packet_id = self._packet_id(delivery_tag)
            self.send(mqtt.publish(topic_bytes, body, 1, retain, redelivered or view.dup, packet_id, properties))
        else:
            if from_qos1:
                self.to_ack.append(delivery_tag)
            self.send(mqtt.publish(topic_bytes, body, 0, retain, False, 0, properties))

    def _packet_id(self, delivery_tag: int) -> int:
        inflight = self.inflight
        assert len(inflight) < 0xFFFF, "bounded by the prefetch (deliveries) and mqtt_prefetch (retained)"
        packet_id = self.next_packet_id
        while packet_id in inflight:
            packet_id = packet_id % 0xFFFF + 1
        self.next_packet_id = packet_id % 0xFFFF + 1
        inflight[packet_id] = delivery_tag
        return packet_id

    def confirmed(self, seq: int, multiple: bool, ack: bool) -> None:
        waiting = self.awaiting_confirm
        if multiple:
            settled = []
            for number in waiting:  # (in the order they were published)
                if number > seq:
                    break
                settled.append(number)
        else:
            settled = [seq] if seq in waiting else []
        for number in settled:
            packet_id, answer = waiting.pop(number)
            if answer == mqtt.PUBREC:
                if not ack:  # (refused: the client may send it again, under the same packet id)
                    self.received_qos2.pop(packet_id, None)
                elif packet_id in self.received_qos2:  # (unless a PUBREL came first)
                    self.received_qos2[packet_id] = True
            if ack:
                self.send(mqtt.acknowledgement(answer, packet_id, self.level))
            elif self.level == mqtt.MQTT_5:
                self.send(mqtt.acknowledgement(answer, packet_id, self.level, mqtt.IMPLEMENTATION_SPECIFIC_ERROR))
        if settled and not ack and self.level != mqtt.MQTT_5:  # (3.1.1 has no way to say a publish failed)
            peer_log.warning(self.peer_address, "closing MQTT connection %s: a publish could not be stored",
                             self.described())
            self._terminate()

    def replied(self, method_index: int) -> None:
        if method_index == CHANNEL_CLOSE_OK or not self.waiting:
            return
        self.waiting.popleft().ok()

    def cancelled(self) -> None:
        peer_log.warning(self.peer_address, "closing MQTT connection %s: its queue was deleted", self.described())
        self._terminate()

    def channel_closed(self, reply_code: int, reply_text: str) -> None:
        self._refused_by_channel(AMQPError(reply_code, reply_text))

    # (ChannelHost) the rest of what a channel asks of its connection
    def block(self, reason: str) -> None:
        if not self.blocked:
            self.blocked = True
            self._update_reading()

    def unblock(self) -> None:
        if self.blocked:
            self.blocked = False
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

    def hold_reading_for(self, channel: Channel) -> None:
        self.held_by_channel = True
        self._update_reading()

    def replay(self, channel: Channel, frames: list) -> None:
        """The frames the channel held while a reply waited for the disk, handled now; then the packets that came
        meanwhile, and reading goes on."""
        self.held_by_channel = False
        for frame_type, _, payload in frames:
            if not channel.open or self.state is CLOSED:
                break
            try:
                channel.handle_frame(frame_type, payload)
            except AMQPError as error:
                pending = next((pending for pending in self.waiting if pending.payload is payload), None)
                if pending is None:  # (a publish, or the channel's own failure)
                    self._refused_by_channel(error)
                    break
                self._method_refused(pending, error)
            except Exception:
                peer_log.internal_error(self.peer_address, "internal error on MQTT connection %s",
                                        self.described())
                self._terminate()
                break
        if channel.open and frames:
            channel.read_processed()
        self._drain_channel()
        if self.state is OPEN:
            self._go_on()

    def failed(self, error: AMQPError, channel: Channel | None) -> None:
        self._refused_by_channel(error)

    def close_channel(self, number: int, send_close_ok: bool) -> None:
        channel = self.channel
        if channel is not None and channel.open:
            channel.shutdown()

    def _refused_by_channel(self, error: AMQPError) -> None:
        """The channel refused a publish, or failed: the connection closes, as RabbitMQ's does."""
        if self.state is CLOSED:
            return
        peer_log.warning(self.peer_address, "MQTT connection %s is closing: %d %s", self.described(),
                         error.reply_code, error.reply_text)
        if self.level == mqtt.MQTT_5 and self.state is OPEN:
            self.send(mqtt.disconnect(mqtt.NOT_AUTHORIZED if error.reply_code == 403
                                      else mqtt.IMPLEMENTATION_SPECIFIC_ERROR))
            self.flush()
        self._terminate()

    # --- ends --------------------------------------------------------------------------------------------------
    def _refuse_packet(self, error: mqtt.MqttError) -> None:
        """A malformed packet, or one out of place: the connection closes (5.0: after DISCONNECT with the reason;
        before CONNACK, a CONNACK with it), without the will."""
        peer_log.warning(self.peer_address, "MQTT protocol error on connection %s: %s", self.described(),
                         error.text)
        if self.level == mqtt.MQTT_5:
            if self.state is OPEN:
                self.send(mqtt.disconnect(error.reason))
            elif self.state is AWAIT_CONNECT:
                self.send(mqtt.connack(False, error.reason, self.level))
            self.flush()
        self._terminate()

    def _connect_timeout(self) -> None:
        if self.state is AWAIT_CONNECT:
            peer_log.warning(self.peer_address, "closing MQTT connection %s (login timeout)", self.name)
            self._terminate()

    def _keepalive_check(self) -> None:
        """The spec's rule: a client silent for one and a half keepalive intervals is gone, and its will goes."""
        self.timer = None
        if self.state is not OPEN:
            return
        silent = self.loop.time() - self.last_received
        limit = self.keepalive * 1.5
        paused = self.turn_paused or self.throttled_by or self.blocked or self.held_by_channel or self.early
        if silent < limit or paused:
            self.timer = self.loop.call_later(max(limit - silent, 0.05) if not paused else limit, self._keepalive_check)
            return
        peer_log.warning(self.peer_address, "closing MQTT connection %s (keepalive timeout)", self.described())
        if self.level == mqtt.MQTT_5:
            self.send(mqtt.disconnect(mqtt.KEEP_ALIVE_TIMEOUT))
            self.flush()
        self._publish_will()
        self._terminate()

    def _publish_will(self) -> None:
        """The will, now or after its delay (5.0: the will delay interval, or the session's end if sooner)."""
        will, self.will = self.will, None
        if will is None or self.vhost is None:
            return
        delay = min(will.properties.get("will_delay_interval", 0), self.session_expiry)
        self.server.mqtt_wills.publish((self.vhost.name, self.client_id), self.user, will, delay, self.peer_address)

    def _end_session(self, channel: Channel) -> None:
        """The session ends with its connection (a clean one; 5.0's session expiry 0, where it resumed one too):
        its queues go, also those whose declare or consume the channel held back for the disk when it closed."""
        assert self.vhost is not None, "logged in"
        actor = Actor(self.vhost, channel.access, self)
        for qos in (0, 1):
            name = self.subscriptions.queue_name(qos)
            if name in self.vhost.queues:
                try:
                    delete_queue(actor, name, False, False)
                except AMQPError as error:
                    peer_log.warning(self.peer_address, "MQTT connection %s: its session's queue %r stays: %s",
                                     self.described(), name, error.reply_text)

    def close_for_shutdown(self) -> None:
        if self.level == mqtt.MQTT_5 and self.state is OPEN:
            self.send(mqtt.disconnect(mqtt.SERVER_SHUTTING_DOWN))
            self.flush()
        self.taken_over = True  # (no will: the broker goes, not the client)
        self._terminate()

    def close_by_operator(self, reason: str) -> None:
        peer_log.warning(self.peer_address, "closing MQTT connection %s: %s", self.described(), reason)
        if self.level == mqtt.MQTT_5 and self.state is OPEN:
            self.send(mqtt.disconnect(mqtt.ADMINISTRATIVE_ACTION))
            self.flush()
        self._terminate()

    @property
    def protocol(self) -> str:
        """As the management API names it: "MQTT 3.1.1", or "Web MQTT 3.1.1" over a WebSocket (RabbitMQ's
        web_mqtt names its connections' protocol family so)."""
        return f"{'Web MQTT' if self.web else 'MQTT'} {mqtt.VERSION_NAMES[self.level]}"

    @property
    def protocol_label(self) -> str:
        """RabbitMQ's label of its protocol in the metrics: mqtt310, mqtt311 or mqtt50."""
        return METRIC_LABELS[self.level]

    @property
    def heartbeat(self) -> int:
        """(The API's timeout) the keepalive."""
        return self.keepalive

    def described(self) -> str:
        if self.vhost is None:
            return self.name
        return f"{self.name} (vhost '{self.vhost.name}', user '{self.user}', client id {self.client_id[:200]!r})"

    def _terminate(self) -> None:
        if self.state is not CLOSED:
            self.state = CLOSED
        if self.transport is not None:
            self.transport.close()

    def _release(self) -> None:
        """The socket is gone: the channel with it (its unacked deliveries back in their queues, its consumers
        cancelled, a clean session's queues deleted as they auto-delete), and the client id."""
        self.state = CLOSED
        for timer in (self.timer, self.flow_timer):
            if timer is not None:
                timer.cancel()
        for queue in self.throttled_by:
            queue.throttled.discard(self)
        if self.retained_out is not None:
            self.retained_out.stop()
        channel = self.channel
        if channel is not None and channel.open:
            channel.shutdown()
            if not self.taken_over:
                if not self.session_expiry:
                    self._end_session(channel)
                elif self.vhost is not None:
                    self.server.mqtt_sessions.start((self.vhost.name, self.client_id), self.user, self.session_expiry,
                                                    [self.subscriptions.queue_name(qos) for qos in (0, 1)],
                                                    list(self.received_qos2))
        self.channel = None
        self.channels = {}
        if self.vhost is not None:
            self.server.node.counters_of(self.protocol_label).connections_closed += 1
            key = (self.vhost.name, self.client_id)
            if self.server.mqtt_clients.get(key) is self:
                del self.server.mqtt_clients[key]
        self.server.connections.discard(self)


def _seconds_left(expires_at: int) -> int:
    """A message expiry interval: what is left until expires_at (ms since the epoch), as MQTT can carry it."""
    return min(max(1, -(-(expires_at - int(time.time() * 1000)) // 1000)), 0xFFFFFFFF)


def vhost_and_user(username: str, default_vhost: str) -> tuple[str, str]:
    """The vhost and user a CONNECT's user name names: RabbitMQ's "vhost:user" (split at the last colon), else the
    default vhost."""
    if ":" in username:
        vhost, user = username.rsplit(":", 1)
        return vhost, user
    return default_vhost, username


def _retained_properties(properties: dict) -> dict:
    """The 5.0 properties a message keeps (its topic alias is the publisher's own)."""
    return {name: value for name, value in properties.items() if name != "topic_alias"}


def _generated_id() -> str:
    """A client id for a client that gave none (as RabbitMQ: 22 characters of base64url)."""
    return base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
