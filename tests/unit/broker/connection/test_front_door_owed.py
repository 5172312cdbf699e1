"""A connection a front door hands to a worker process after a pipelined handshake (broker.connection.front_door):
what the front door owed the client (connection.start and connection.tune) reaches it before anything the worker
it was handed to writes, also when the socket could not take it at once (the client's window full), whose bytes a
transport's buffer would otherwise keep in a process that no longer has the connection.

The front door and the worker are in one process here: the door accepting the socket, and the connection that the
socket's hand-off datagram makes on the other side, as cluster.worker makes it. On uvloop's transports, as the
broker's plain connections run, and asyncio's."""

from __future__ import annotations

import asyncio
import socket
import time
import struct
from types import SimpleNamespace

import pytest
import uvloop
from pamqp import commands, frame

from broker.config import Config
from broker.connection import greeting
from broker.connection.connection import Connection
from broker.connection.front_door import FrontDoor, FrontDoors
from broker.connection.handoff import handoff_pair, receive_all
from broker.connection.login_throttle import LoginThrottle
from broker.model.node import Node
from broker.session.limits import ChannelLimits
from protocol.codec import encode_method
from protocol.constants import PROTOCOL_HEADER

LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


def a_server() -> SimpleNamespace:
    """What a connection asks of its broker: guest may open "/" and "v1"."""
    config = Config()
    node = Node()
    node.bootstrap("/", "guest", "guest")
    node.add_vhost("v1")
    node.set_permissions("guest", "v1", ".*", ".*", ".*")
    return SimpleNamespace(
        config=config, node=node, failed_logins=LoginThrottle(), connections=set(),
        version="test", platform="test",
        channel_limits=ChannelLimits(node, config.max_message_size, 0, 0, 1 << 30))


def pipelined_handshake(vhost: str) -> bytes:
    return PROTOCOL_HEADER + b"".join(frame.marshal(method, 0) for method in (
        commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0guest",
                                    locale="en_US"),
        commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
        commands.Connection.Open(virtual_host=vhost)))


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A client's socket and the one a listener accepted for it, on loopback (a broker's plain connection)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    return client, accepted


def fill(sock: socket.socket) -> bytes:
    """Write to sock until it takes no more, its peer reading nothing meanwhile; what went. Loopback moves what waits
    in the send buffer to the peer's receive buffer as it gets to it, freeing room after a write was refused: the
    writes go on, after a pause, until a round takes nothing (both buffers full, and the peer's cannot grow unread)."""
    sent = bytearray()
    while True:
        before = len(sent)
        for size in (65536, 1):
            while True:
                try:
                    sent += b"x" * sock.send(b"x" * size)
                except BlockingIOError:
                    break
        if len(sent) == before:
            return bytes(sent)
        time.sleep(0.05)


async def read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await loop.sock_recv(sock, size - len(data))
        assert chunk, f"closed after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


async def frames_through(loop: asyncio.AbstractEventLoop, sock: socket.socket, last: bytes) -> bytes:
    """The frames the client reads, up to and including the frame ``last``."""
    data = b""
    while not data.endswith(last):
        header = await read_exactly(loop, sock, 7)
        (size,) = struct.unpack_from(">I", header, 3)
        data += header + await read_exactly(loop, sock, size + 1)
    return data


async def handed_over(loop: asyncio.AbstractEventLoop, receiving: socket.socket) -> tuple[socket.socket, object]:
    """The next hand-off datagram, once it arrives."""
    arrived: asyncio.Future = loop.create_future()

    def take(sock, handed) -> None:
        if not arrived.done():
            arrived.set_result((sock, handed))

    loop.add_reader(receiving.fileno(), receive_all, receiving, take)
    try:
        return await arrived
    finally:
        loop.remove_reader(receiving.fileno())


async def pipelined_and_handed(window_full: bool) -> None:
    loop = asyncio.get_running_loop()
    server = a_server()
    receiving, sending = handoff_pair()
    doors = FrontDoors(server.config, "test", "test", lambda vhost, forwarded: sending, lambda: "")
    client, accepted = tcp_pair()
    client.setblocking(False)
    accepted.setblocking(False)
    earlier = fill(accepted) if window_full else b""  # output the client has not read yet
    transport, door = await loop.connect_accepted_socket(lambda: FrontDoor(doors), accepted)
    try:
        door.data_received(pipelined_handshake("v1"))  # the whole handshake in one read
        if window_full:  # the socket waits here until its transport has written start and tune
            assert transport.get_write_buffer_size() > 0
            assert door.owing is sending
            with pytest.raises(BlockingIOError):
                receiving.recv(1)
        # the client reads what it had not: there is room again, start and tune go, and then the socket
        assert await read_exactly(loop, client, len(earlier)) == earlier
        sock, handed = await handed_over(loop, receiving)
        assert transport.is_closing() and door not in doors.open
        # the worker that leads "v1" answers the rest of the handshake: the client reads it after what it was owed
        other_transport, _ = await loop.connect_accepted_socket(lambda: Connection(server, handed), sock)
        try:
            owed = (encode_method(0, greeting.start(server.config, "test", "test"))
                    + encode_method(0, greeting.tune(server.config)))
            open_ok = encode_method(0, commands.Connection.OpenOk())
            assert await frames_through(loop, client, open_ok) == owed + open_ok
            assert handed.sent_bytes == len(owed)
        finally:
            other_transport.close()
    finally:
        transport.close()
        for each in (client, receiving, sending):
            each.close()


@pytest.mark.parametrize("loop_factory", LOOPS.values(), ids=LOOPS.keys())
@pytest.mark.parametrize("window_full", [False, True], ids=["room", "window full"])
def test_a_pipelined_handshake_handed_over_gets_start_and_tune_first(loop_factory, window_full):
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(pipelined_and_handed(window_full), 10))
