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

from broker.connection import handoff
from broker.connection.front_door import Door, FrontDoors, forward
from broker.connection.mqtt.connection import CONNECT_TIMEOUT, UNAUTHENTICATED_PACKET_SIZE, vhost_and_user
from broker.connection.mqtt.websocket import OVER_A_WEBSOCKET
from broker.connection.peer_log import PeerLog
from protocol import mqtt
from protocol.stream_start import MQTT_LINK, StartReader

log = logging.getLogger(__name__)
peer_log = PeerLog(log)

PROTOCOL: str = "mqtt"  # a hand-off's protocol (handoff.HandedOver.protocol)


def mqtt_unavailable(level: int = mqtt.MQTT_3_1_1) -> bytes:
    """CONNACK 3, server unavailable (5.0: 0x88): the client connects again."""
    return mqtt.connack(False, mqtt.SERVER_UNAVAILABLE if level == mqtt.MQTT_5 else mqtt.REFUSED_SERVER_UNAVAILABLE,
                        level)


class MqttFrontDoor(Door):
    """One MQTT client, until its CONNECT is read."""

    what = "MQTT connection from %s:%s (login timeout)"
    timeout = CONNECT_TIMEOUT

    def __init__(self, doors: FrontDoors, forwards: bool = True) -> None:
        super().__init__(doors)
        self.forwards = forwards  # whether another node may forward its clients through it (not over a WebSocket)
        self.reader = mqtt.PacketReader(UNAUTHENTICATED_PACKET_SIZE)
        self.level = mqtt.MQTT_3_1_1  # the protocol level CONNECT asked for (a refusal's CONNACK is of that level)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.web = transport.get_extra_info(OVER_A_WEBSOCKET) is True
        if self.forwards:
            self.start = StartReader(self.doors.secret(), MQTT_LINK, protocol_header=b"")
        elif self.doors.suspended:  # (the node is in maintenance: its own clients go, as at a closed port)
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.start is not None:
            start = self._read_start(data)
            if start is None or not start.rest:
                return
            data = start.rest
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

    def _go(self, vhost: str | None) -> None:
        self.transport.pause_reading()
        self._done()
        # (with [server] spread_vhosts too, the vhost's home serves its MQTT clients: its retained messages and client
        # ids are kept there)
        route = self.doors.route(vhost, self.forwarded, copies=False, mqtt=True)
        if isinstance(route, tuple):
            unavailable = mqtt_unavailable(self.level)  # (told whether that node cannot be reached or turns it away)
            self.doors.keep(forward(self, route, vhost, bytes(self.kept), 0, unavailable, unavailable, MQTT_LINK))
            return
        if not isinstance(route, socket.socket):
            peer_log.warning(self.peer[0], "closing MQTT connection from %s:%s: %s", *self.peer, route)
            self._refuse()
            return
        handed = self._handed(user="", received_bytes=0, sent_bytes=0, answered=0, protocol=PROTOCOL)
        try:
            handoff.hand_over(self.transport, route, handed, self.doors.keep)
        except OSError as error:
            peer_log.warning(self.peer[0], "closing MQTT connection from %s:%s: cannot hand it to the worker that "
                             "serves its vhost: %s", *self.peer, error)
            self._refuse()

    def _refuse(self) -> None:
        """CONNACK 3, server unavailable (5.0: 0x88), then close."""
        if not self.transport.is_closing():
            self.transport.write(mqtt_unavailable(self.level))
            self.transport.close()
