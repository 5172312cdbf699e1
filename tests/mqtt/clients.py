"""MQTT clients for the tests: paho-mqtt's, with what they receive kept in a queue and every step awaited on an
event, and a raw socket client for what no well-behaved library sends."""

from __future__ import annotations

import queue
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

from tests.integration.management import request
from tests.waiting import wait_for

TIMEOUT = 10.0  # seconds any one step may take


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: object | None
    mid: int = 0  # its packet id (what a client acknowledges it by, with auto_ack off)


class Client:
    """A paho client, connected by connect(); its messages in .messages, its CONNACK in .connack."""

    def __init__(self, broker, client_id: str = "", clean: bool = True, version: int = 4,
                 username: str | None = "guest", password: str | None = "guest", will: tuple | None = None,
                 keepalive: int = 60, auto_ack: bool = True, port: int | None = None, tls=None,
                 transport: str = "tcp"):
        protocol = {4: MQTTProtocolVersion.MQTTv311, 5: MQTTProtocolVersion.MQTTv5,
                    3: MQTTProtocolVersion.MQTTv31}[version]
        self.broker = broker
        self.version = version
        self.clean = clean
        self.keepalive = keepalive
        self.port = port or broker.mqtt_port
        self.paho = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                                clean_session=clean if version != 5 else None, transport=transport)
        if transport == "websockets":
            self.paho.ws_set_options(path="/ws")
        if tls is not None:
            self.paho.tls_set_context(tls)
        self.paho.enable_logger(None)
        self.paho.manual_ack_set(not auto_ack)
        if username is not None:
            self.paho.username_pw_set(username, password)
        if will is not None:
            topic, payload, qos, retain = will
            self.paho.will_set(topic, payload, qos, retain)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: tuple | None = None  # (session present, reason code, properties)
        self.disconnect_reason = None
        self.subacks: queue.Queue = queue.Queue()
        self.unsubacks: queue.Queue = queue.Queue()
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = lambda client, userdata, mid, codes, properties: self.subacks.put((mid, codes))
        self.paho.on_unsubscribe = lambda client, userdata, mid, codes, properties: self.unsubacks.put((mid, codes))

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        self.connack = (flags.session_present, reason, properties)
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason, properties) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    def _on_message(self, client, userdata, message) -> None:
        self.messages.put(Received(message.topic, message.payload, message.qos, message.retain, message.dup,
                                   getattr(message, "properties", None), message.mid))
        self.last_message = message

    def connect(self, properties: Properties | None = None, expect_success: bool = True) -> Client:
        kwargs = {"clean_start": self.clean, "properties": properties} if self.version == 5 else {}
        self.paho.connect("localhost" if self.paho._ssl else "127.0.0.1", self.port, keepalive=self.keepalive,
                          **kwargs)
        self.paho.loop_start()
        assert self.connected.wait(TIMEOUT) or self.disconnected.wait(0), "no CONNACK"
        if expect_success:
            assert self.connack is not None and not self.connack[1].is_failure, f"CONNACK {self.connack}"
        return self

    def subscribe(self, topic_filter: str, qos: int = 0, properties: Properties | None = None) -> list:
        """Subscribe and wait for SUBACK: its reason codes."""
        result, mid = self.paho.subscribe(topic_filter, qos, properties=properties)
        assert result == paho.MQTT_ERR_SUCCESS
        got_mid, codes = self.subacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        return codes

    def unsubscribe(self, topic_filter: str) -> list:
        result, mid = self.paho.unsubscribe(topic_filter)
        assert result == paho.MQTT_ERR_SUCCESS
        got_mid, codes = self.unsubacks.get(timeout=TIMEOUT)
        assert got_mid == mid
        return codes

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> None:
        """Publish, waiting for PUBACK at QoS 1 (PUBCOMP at 2)."""
        info = self.paho.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"{topic}: not acknowledged"

    def receive(self, timeout: float = TIMEOUT) -> Received:
        return self.messages.get(timeout=timeout)

    def nothing_more(self, wait: float = 0.3) -> None:
        """No message arrives within wait seconds (after a marker proved the ones sent before it arrived)."""
        try:
            extra = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {extra}")

    def disconnect(self) -> None:
        self.paho.disconnect()
        self.disconnected.wait(TIMEOUT)
        self.paho.loop_stop()

    def drop(self) -> None:
        """Close the socket without DISCONNECT, as a client that crashed."""
        self.paho.loop_stop()
        sock = self.paho.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextmanager
def connected(broker, client_id: str = "", **options):
    client = Client(broker, client_id, **options).connect()
    try:
        yield client
    finally:
        if not client.disconnected.is_set():
            client.disconnect()
        client.paho.loop_stop()


def user_properties(*pairs: tuple[str, str], **values) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    if pairs:
        properties.UserProperty = list(pairs)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


class RawClient:
    """A socket that speaks bytes: for packets a library would not send."""

    def __init__(self, broker):
        self.sock = socket.create_connection(("127.0.0.1", broker.mqtt_port), timeout=TIMEOUT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def closed(self) -> bool:
        """Whether the broker closes the connection within TIMEOUT (what it sends first is read and dropped)."""
        try:
            while self.sock.recv(4096):
                pass
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def connect_packet(client_id: str, username: str = "guest", password: str = "guest", keepalive: int = 60,
                   clean: bool = True, level: int = 4, will: tuple[str, bytes] | None = None) -> bytes:
    """A CONNECT, written out by hand."""
    def string(value: bytes) -> bytes:
        return len(value).to_bytes(2, "big") + value
    flags = 0x02 * clean | 0x80 | 0x40
    payload = string(client_id.encode())
    if will is not None:
        flags |= 0x04
        payload += string(will[0].encode()) + string(will[1])
    payload += string(username.encode()) + string(password.encode())
    body = string(b"MQTT") + bytes((level, flags)) + keepalive.to_bytes(2, "big") + (b"\x00" if level == 5 else b"")
    body += payload
    return bytes((0x10, len(body))) + body if len(body) < 128 else bytes((0x10,)) + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def wait_until_gone(broker, client_id: str) -> None:
    """Wait until the broker no longer lists a connection of the client id (it noticed the client went)."""
    wait_for(lambda: not [connection for connection in request(broker, "GET", "/api/connections").body
                          if connection["client_properties"].get("client_id") == client_id], 10,
             f"the connection of {client_id} gone")
