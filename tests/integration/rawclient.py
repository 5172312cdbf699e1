"""A small synchronous AMQP 0-9-1 client on raw sockets, for tests that need to see or send exact frames.

Real clients hide the frame level (they answer heartbeats, refuse to send malformed frames, pick their own tune
values). This one does only what the test asks: send a protocol header or any frame, read frames one at a time
with a deadline, and run the handshake with the values the test chooses.

    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Basic.Ack(delivery_tag=5))
        close = client.expect(commands.Channel.Close, channel=1)
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from pamqp import body, commands, encode, frame, header, heartbeat

FRAME_HEADER_SIZE = 7  # type (1) + channel (2) + payload size (4)
FRAME_END = b"\xce"
AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"

FrameT = TypeVar("FrameT")


class PeerClosed(ConnectionError):
    """The broker closed the TCP connection (EOF or reset) while we were waiting for data."""


@dataclass
class Handshake:
    """What the broker said while a connection was being opened."""

    start: commands.Connection.Start  # the broker's connection.start (properties, mechanisms, locales)
    tune: commands.Connection.Tune  # the broker's offered limits
    frame_max: int  # the values the client answered in tune-ok
    channel_max: int
    heartbeat: int


def plain_response(username: str, password: str) -> str:
    """SASL PLAIN: authzid NUL authcid NUL password."""
    return f"\0{username}\0{password}"


def amqplain_response(username: str, password: str) -> str:
    """RabbitMQ's AMQPLAIN: a field table of LOGIN and PASSWORD without the table's own length prefix."""
    return encode.field_table({"LOGIN": username, "PASSWORD": password})[4:].decode("utf-8")


def describe(value: Any) -> str:
    """A readable form of a pamqp frame for assertion messages (pamqp's own repr shows only the class)."""
    fields = getattr(value, "__slots__", None) or []
    args = ", ".join(f"{name}={getattr(value, name, None)!r}" for name in fields)
    return f"{getattr(value, 'name', type(value).__name__)}({args})"


def raw_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """Any frame, well-formed or not, exactly as the caller describes it."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + FRAME_END


class RawClient:
    """One TCP connection to a broker; every call is blocking and bounded by a timeout."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.timeout = timeout  # default deadline for every read, in seconds
        self._buffer = bytearray()  # bytes received but not yet split into frames
        self._offset = 0  # where the next unread frame starts in _buffer

    @classmethod
    def connect(cls, broker: Any, timeout: float = 5.0) -> RawClient:
        """Open a TCP connection to `broker` (anything with .host and .port); nothing is sent yet."""
        sock = socket.create_connection((broker.host, broker.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, timeout)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # ---- sending

    def send_raw(self, data: bytes, timeout: float | None = None) -> None:
        """Write all of `data`; raises TimeoutError if the peer has not taken it by the deadline."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)  # a read leaves its own remainder there
        self.sock.sendall(data)

    def send_protocol_header(self, data: bytes = AMQP_0_9_1_HEADER) -> None:
        self.send_raw(data)

    def send(self, channel: int, *frames: Any) -> None:
        """Send pamqp frames (methods, content headers, bodies, heartbeats) on `channel` in one write."""
        self.send_raw(b"".join(frame.marshal(value, channel) for value in frames))

    def send_heartbeat(self) -> None:
        self.send(0, heartbeat.Heartbeat())

    def publish(self, channel: int, exchange: str, routing_key: str, payload: bytes = b"",
                properties: commands.Basic.Properties | None = None, frame_max: int = 131072,
                **publish_args: Any) -> None:
        """basic.publish + content header + body frames split at frame_max - 8, in one write."""
        frames: list[Any] = [
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key, **publish_args),
            header.ContentHeader(0, len(payload), properties or commands.Basic.Properties()),
        ]
        chunk = frame_max - 8
        frames += [body.ContentBody(payload[i:i + chunk]) for i in range(0, len(payload), chunk)]
        self.send(channel, *frames)

    # ---- receiving

    def recv_raw(self, size: int, timeout: float | None = None) -> bytes:
        """Exactly `size` bytes (fewer only if the peer closes first); raises TimeoutError at the deadline."""
        self._fill(size, timeout)
        data = bytes(self._buffer[self._offset:self._offset + size])
        self._offset += len(data)
        return data

    def read_frame(self, timeout: float | None = None, skip_heartbeats: bool = True) -> tuple[int, Any]:
        """The next frame as (channel, pamqp object); raises TimeoutError or PeerClosed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            self._fill(FRAME_HEADER_SIZE, deadline - time.monotonic())
            size = struct.unpack_from(">I", self._buffer, self._offset + 3)[0]
            self._fill(FRAME_HEADER_SIZE + size + 1, deadline - time.monotonic())
            end = self._offset + FRAME_HEADER_SIZE + size + 1
            consumed, channel, value = frame.unmarshal(bytes(self._buffer[self._offset:end]))
            self._offset += consumed
            if skip_heartbeats and isinstance(value, heartbeat.Heartbeat):
                continue
            return channel, value

    def expect(self, kind: type[FrameT], channel: int | None = None, timeout: float | None = None) -> FrameT:
        """The next non-heartbeat frame, asserted to be of `kind` (and on `channel` when given)."""
        got_channel, value = self.read_frame(timeout)
        assert isinstance(value, kind), f"expected {kind.__name__}, got {describe(value)} on channel {got_channel}"
        if channel is not None:
            assert got_channel == channel, f"expected {kind.__name__} on channel {channel}, got {got_channel}"
        return value

    def expect_closed(self, timeout: float | None = None) -> None:
        """Assert the broker closes the socket without sending anything more before the deadline."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            self._fill(self._available() + 1, deadline - time.monotonic())
        except PeerClosed:
            return
        raise AssertionError(f"expected the socket to close, received {bytes(self._buffer[self._offset:])!r}")

    def assert_silent(self, duration: float) -> None:
        """Assert nothing but heartbeats arrives for `duration` seconds (the connection stays open)."""
        try:
            channel, value = self.read_frame(timeout=duration)
        except TimeoutError:
            return
        raise AssertionError(f"expected silence, got {describe(value)} on channel {channel}")

    def _available(self) -> int:
        return len(self._buffer) - self._offset

    def _fill(self, size: int, timeout: float | None) -> None:
        """Receive until `size` unread bytes are buffered; raise PeerClosed on EOF, TimeoutError at the deadline."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if self._offset and self._offset == len(self._buffer):
            self._buffer.clear()
            self._offset = 0
        while self._available() < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waited for {size} bytes, have {self._available()}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError as error:
                raise PeerClosed("connection reset by the broker") from error
            if not data:
                raise PeerClosed(f"the broker closed the connection; unread {bytes(self._buffer[self._offset:])!r}")
            self._buffer += data

    # ---- conversations

    def handshake(self, username: str = "guest", password: str = "guest", vhost: str = "/",
                  mechanism: str = "PLAIN", frame_max: int | None = None, channel_max: int | None = None,
                  heartbeat: int | None = 0, client_properties: dict | None = None,
                  open_connection: bool = True) -> Handshake:
        """Protocol header, start/start-ok, tune/tune-ok and (unless told not to) connection.open/open-ok.

        frame_max/channel_max/heartbeat default to what the broker offers, except heartbeat, which defaults to 0
        (off) so that a test is not disturbed by heartbeats it did not ask for.
        """
        self.send_protocol_header()
        start = self.expect(commands.Connection.Start, channel=0)
        response = (plain_response if mechanism == "PLAIN" else amqplain_response)(username, password)
        properties = client_properties if client_properties is not None else {
            "product": "rawclient", "capabilities": {"authentication_failure_close": True}}
        self.send(0, commands.Connection.StartOk(client_properties=properties, mechanism=mechanism,
                                                 response=response, locale="en_US"))
        tune = self.expect(commands.Connection.Tune, channel=0)
        agreed = Handshake(start=start, tune=tune,
                           frame_max=tune.frame_max if frame_max is None else frame_max,
                           channel_max=tune.channel_max if channel_max is None else channel_max,
                           heartbeat=tune.heartbeat if heartbeat is None else heartbeat)
        self.send(0, commands.Connection.TuneOk(channel_max=agreed.channel_max, frame_max=agreed.frame_max,
                                                heartbeat=agreed.heartbeat))
        if open_connection:
            self.send(0, commands.Connection.Open(virtual_host=vhost))
            self.expect(commands.Connection.OpenOk, channel=0)
        return agreed

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, channel=channel)

    def expect_connection_close(self, timeout: float | None = None) -> commands.Connection.Close:
        """Read up to the broker's connection.close, answer close-ok, and return the close.

        Frames the broker sent before the close (deliveries still in flight, say) are skipped.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            channel, value = self.read_frame(timeout=deadline - time.monotonic())
            if isinstance(value, commands.Connection.Close):
                assert channel == 0, f"connection.close on channel {channel}"
                self.send(0, commands.Connection.CloseOk())
                return value

    def expect_connection_error(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """connection.close with exactly this reply and culprit method; after our close-ok the socket closes."""
        close = self.expect_connection_close()
        expected = (code, text, class_id, method_id)
        got = (close.reply_code, close.reply_text, close.class_id, close.method_id)
        assert got == expected, f"connection.close {got} != expected {expected}"
        self.expect_closed()

    def expect_channel_error(self, channel: int, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """channel.close with exactly this reply on `channel`, answered with close-ok."""
        close = self.expect(commands.Channel.Close, channel=channel)
        expected = (code, text, class_id, method_id)
        got = (close.reply_code, close.reply_text, close.class_id, close.method_id)
        assert got == expected, f"channel.close {got} != expected {expected}"
        self.send(channel, commands.Channel.CloseOk())

    def close_connection(self, timeout: float | None = None) -> None:
        """A polite connection.close, waiting for close-ok (each frame until it for ``timeout``, else the client's)."""
        self.send(0, commands.Connection.Close(reply_code=200, reply_text="Goodbye", class_id=0, method_id=0))
        while True:
            _, value = self.read_frame(timeout)
            if isinstance(value, commands.Connection.CloseOk):
                return


def method_frame_payload(method: Any) -> bytes:
    """The payload of a method frame (class id, method id, arguments), for hand-made frames."""
    return struct.pack(">I", method.index) + method.marshal()


__all__ = [
    "AMQP_0_9_1_HEADER", "Handshake", "describe", "PeerClosed", "RawClient", "amqplain_response", "method_frame_payload",
    "plain_response", "raw_frame",
]
