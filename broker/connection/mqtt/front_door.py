"""The MQTT front door of a node of workers: it reads a client's CONNECT (on the MQTT ports, or over a WebSocket),
takes the vhost from it (the user name's "vhost:user", else [mqtt] vhost), and sends the client where that vhost is
served, as the AMQP front door does (broker.connection.front_door): to a worker of this node, its socket handed over
with every byte it sent (broker.connection.handoff), which reads them as its own client's, checking the login; to
another node of a cluster, through that node's MQTT port with a proven PROXY header before the client's bytes
(MQTT's link: no AMQP forward's proofs pass for it), as AMQP clients are forwarded. A vhost led by none now is refused
with CONNACK 3 (server unavailable): the client connects again."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Any

from broker.connection import handoff
from broker.connection.connection import HANDSHAKE_TIMEOUT
from broker.connection.front_door import FrontDoors, forward
from broker.connection.mqtt.connection import CONNECT_TIMEOUT, UNAUTHENTICATED_PACKET_SIZE, vhost_and_user
from broker.connection.mqtt.websocket import OVER_A_WEBSOCKET
from broker.connection.peer_log import PeerLog
from protocol import mqtt, proxy_header, stream_start
from protocol.stream_start import MQTT_LINK, StartReader

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

PROTOCOL: str = "mqtt"  # a hand-off's protocol (handoff.HandedOver.protocol)


def mqtt_unavailable(level: int = mqtt.MQTT_3_1_1) -> bytes:
    """CONNACK 3, server unavailable (5.0: 0x88): the client connects again."""
    return mqtt.connack(False, mqtt.SERVER_UNAVAILABLE if level == mqtt.MQTT_5 else mqtt.REFUSED_SERVER_UNAVAILABLE,
                        level)


async def open_mqtt_doors(doors: FrontDoors, tls: ssl.SSLContext | None = None, **where: Any) -> asyncio.Server:
    """A listener whose every client comes in through an MQTT front door; where: host and port, or sock. With tls,
    MQTT over TLS: the TLS session ends here (as amqps's, broker.connection.front_door.open_doors)."""
    return await asyncio.get_running_loop().create_server(
        lambda: MqttFrontDoor(doors), backlog=1024, ssl=tls,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls is not None else None, **where)


class MqttFrontDoor(asyncio.Protocol):
    """One MQTT client, until its CONNECT is read."""

    def __init__(self, doors: FrontDoors, forwards: bool = True) -> None:
        self.doors = doors
        self.forwards = forwards  # whether another node may forward its clients through it (not over a WebSocket)
        self.transport: Any = None
        self.reader = mqtt.PacketReader(UNAUTHENTICATED_PACKET_SIZE)
        self.start: StartReader | None = None  # reads another node's PROXY header and proofs, if one comes
        self.forwarded = False  # the client came through another node's front door (a proven PROXY header)
        self.tls = False  # it speaks TLS, here or to the node that forwarded it
        self.web = False  # it speaks MQTT over a WebSocket, here or to the node that forwarded it
        self.kept = bytearray()  # everything the client sent (after another node's PROXY header and proofs)
        self.peer: tuple = ("", 0)
        self.local: tuple = ("", 0)
        self.connected_at = 0
        self.timer: asyncio.TimerHandle | None = None
        self.level = mqtt.MQTT_3_1_1  # the protocol level CONNECT asked for (a refusal's CONNACK is of that level)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = tuple(transport.get_extra_info("peername") or ("", 0))[:2]
        self.local = tuple(transport.get_extra_info("sockname") or ("", 0))[:2]
        self.connected_at = int(time.time() * 1000)
        self.tls = transport.get_extra_info("sslcontext") is not None
        self.web = transport.get_extra_info(OVER_A_WEBSOCKET) is True
        if self.forwards:
            self.start = StartReader(self.doors.secret(), MQTT_LINK, protocol_header=b"")
        elif self.doors.suspended:  # (the node is in maintenance: its own clients go, as at a closed port)
            transport.abort()
            return
        self.timer = asyncio.get_running_loop().call_later(CONNECT_TIMEOUT, self._timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        peer_log.warning(self.peer[0], "closing MQTT connection from %s:%s (login timeout)", *self.peer)
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.start is not None:
            data = self._stream_start(data)
            if not data:
                return
        self.kept += data
        try:
            packets = self.reader.feed(data)
        except mqtt.MqttError:
            self._go(None)  # (the worker reads the same bytes, and says what is wrong with them)
            return
        if not packets:
            return
        first, body = packets[0]
        vhost = None
        if first == mqtt.CONNECT << 4:
            try:
                connect = mqtt.read_connect(body)
                self.level = connect.level
                vhost = vhost_and_user(connect.username or "", self.doors.config.mqtt_vhost)[0]
            except mqtt.MqttError:
                pass
        self._go(vhost)

    def _stream_start(self, data: bytes) -> bytes:
        """Another node's PROXY header and proofs, where one forwards the client; what follows them."""
        assert self.start is not None
        try:
            challenge, start = self.start.feed(data)
        except (proxy_header.ProxyHeaderError, stream_start.NotProven) as error:
            peer_log.warning(self.peer[0], "closing connection from %s:%s: %s PROXY header: %s", *self.peer,
                             "malformed" if isinstance(error, proxy_header.ProxyHeaderError) else "refused", error)
            self.transport.abort()
            return b""
        if challenge:
            self.transport.write(challenge)
        if start is None:
            return b""
        self.start = None
        if start.forwarded is not None:
            self.peer, self.local = start.forwarded
            self.forwarded = True
            self.tls = start.tls  # (the client's, not the link's between the nodes)
            self.web = start.web
        elif self.doors.suspended:  # (the node is in maintenance: its own clients go, as at a closed port)
            self.transport.abort()
            return b""
        return start.rest

    def _go(self, vhost: str | None) -> None:
        self.transport.pause_reading()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        # (with [server] spread_vhosts too, the vhost's home serves its MQTT clients: its retained messages and client
        # ids are kept there)
        route = self.doors.route(vhost, self.forwarded, copies=False, mqtt=True)
        if isinstance(route, tuple):
            task = asyncio.get_running_loop().create_task(forward(
                self.doors, self.transport, route, vhost, (self.peer, self.local, self.tls), bytes(self.kept), 0,
                self._refuse, mqtt_unavailable(self.level), MQTT_LINK, self.web))
            self.doors.splicing.add(task)
            task.add_done_callback(self.doors.splicing.discard)
            return
        if not isinstance(route, socket.socket):
            peer_log.warning(self.peer[0], "closing MQTT connection from %s:%s: %s", *self.peer, route)
            self._refuse()
            return
        handed = handoff.HandedOver(user="", peer=list(self.peer), local=list(self.local),
                                    connected_at=self.connected_at, received_bytes=0, sent_bytes=0,
                                    tls=self.tls, answered=0, data=bytes(self.kept), protocol=PROTOCOL,
                                    web=self.web)
        try:
            handoff.hand_over(self.transport, route, handed, self.doors.splicing)
        except OSError as error:
            peer_log.warning(self.peer[0], "closing MQTT connection from %s:%s: cannot hand it to the worker that "
                             "serves its vhost: %s", *self.peer, error)
            self._refuse()

    def _refuse(self) -> None:
        """CONNACK 3, server unavailable (5.0: 0x88), then close."""
        if not self.transport.is_closing():
            self.transport.write(mqtt_unavailable(self.level))
            self.transport.close()
