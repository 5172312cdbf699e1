"""MQTT over WebSockets (RabbitMQ's web_mqtt: the path /ws, subprotocol "mqtt"): each binary message of a WebSocket
carries bytes of the MQTT stream, which an ordinary MQTT connection reads, writing its own through the transport
this module makes of the WebSocket. With workers or in a cluster an MQTT front door reads them first, as on the MQTT
port, and sends the client where its vhost is served: the WebSocket's framing stays here, its MQTT stream goes on
(broker.connection.handoff, broker.connection.front_door.forward)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Final

from aiohttp import WSMsgType, web

PATH: Final = "/ws"
SUBPROTOCOLS: Final = ("mqtt",)
# Bytes a WebSocket message may hold (a whole one is read before any of it is handed on, before the login too):
# an MQTT packet over WebSockets is this large at most
MESSAGE_LIMIT: Final = 1024 * 1024
HIGH_WATER: Final = 64 * 1024  # bytes waiting to be sent above which the connection delivers nothing more
OVER_A_WEBSOCKET: Final = "web_mqtt"  # the transport's extra info that is True: its client speaks MQTT over a WebSocket


class WebSocketTransport:
    """What an MQTT connection (or a front door, or the end of a splice) asks of its transport, over a WebSocket: its
    writes sent in order as binary messages, reading paused and resumed, the request's addresses, and no socket of
    its own to hand to another process."""

    def __init__(self, socket: web.WebSocketResponse, request: web.Request, protocol: asyncio.Protocol):
        self.socket = socket
        self.request = request
        self.protocol: Any = protocol  # what reads the WebSocket's bytes (set_protocol: the next one)
        self.waiting: deque[bytes] = deque()  # written, not yet sent
        self.size = 0  # bytes in waiting and being sent
        self.sending: asyncio.Task | None = None
        self.closing = False
        self.readable = asyncio.Event()  # set while reading is not paused
        self.readable.set()
        self.paused_writing = False

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        self.waiting.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER and not self.paused_writing:
            self.paused_writing = True
            self.protocol.pause_writing()
        if self.sending is None:
            self.sending = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self.waiting:
                data = b"".join(self.waiting)
                self.waiting.clear()
                await self.socket.send_bytes(data)
                self.size -= len(data)
                if self.paused_writing and self.size <= HIGH_WATER // 4:
                    self.paused_writing = False
                    self.protocol.resume_writing()
        except ConnectionError:
            self.waiting.clear()
        finally:
            self.sending = None
        if self.closing:
            await self.socket.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.readable.set()
            if self.sending is None:
                asyncio.get_running_loop().create_task(self.socket.close())

    abort = close

    def is_closing(self) -> bool:
        return self.closing or self.socket.closed

    def pause_reading(self) -> None:
        self.readable.clear()

    def resume_reading(self) -> None:
        self.readable.set()

    def get_write_buffer_size(self) -> int:
        return self.size

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in ("peername", "sockname", "sslcontext"):
            transport = self.request.transport
            return transport.get_extra_info(name, default) if transport is not None else default
        if name == OVER_A_WEBSOCKET:
            return True
        return default  # (no "socket": the WebSocket's framing stays in this process)

    def set_protocol(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.Protocol:
        return self.protocol


def make_web_mqtt_app(accept: Callable[[], asyncio.Protocol], max_packet_size: int) -> web.Application:
    """The application of [mqtt] web_port: MQTT over WebSockets on /ws, each WebSocket's MQTT stream read by what
    accept() makes (an MQTT connection, or an MQTT front door)."""
    async def serve(request: web.Request) -> web.StreamResponse:
        socket = web.WebSocketResponse(protocols=SUBPROTOCOLS, autoping=True,
                                       max_msg_size=min(max_packet_size, MESSAGE_LIMIT))
        await socket.prepare(request)
        transport = WebSocketTransport(socket, request, accept())
        transport.protocol.connection_made(transport)
        try:
            async for message in socket:
                if message.type != WSMsgType.BINARY:  # (MQTT over WebSockets is binary messages alone)
                    break
                await transport.readable.wait()
                if transport.closing:
                    break
                transport.protocol.data_received(message.data)
        finally:
            transport.close()
            transport.protocol.connection_lost(None)
        return socket

    app = web.Application()
    app.router.add_get(PATH, serve)
    return app
