"""The front door of a clustered node's workers (broker.connection.front_door): the handshake up to connection.open
answered without a login, then the client sent where its vhost is led with every byte it sent."""

from __future__ import annotations

import asyncio
import struct

import pytest
import uvloop
from pamqp import commands as spec

from broker.config import Config
from broker.connection.front_door import TURNED_AWAY, FrontDoor, FrontDoors
from broker.connection.handoff import handoff_pair, receive_all
from protocol import proxy_header
from protocol.codec import decode_method, encode_method
from protocol.constants import PROTOCOL_HEADER

START_OK = encode_method(0, spec.Connection.StartOk(client_properties={"product": "test"}, mechanism="PLAIN",
                                                     response="\0guest\0guest", locale="en_US"))
TUNE_OK = encode_method(0, spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60))
OPEN = encode_method(0, spec.Connection.Open(virtual_host="orders"))
CHANNEL_OPEN = encode_method(1, spec.Channel.Open())
HANDSHAKE = START_OK + TUNE_OK + OPEN


async def read_frame(reader: asyncio.StreamReader):
    frame_type, channel, size = struct.unpack(">BHI", await reader.readexactly(7))
    payload = await reader.readexactly(size + 1)
    assert frame_type == 1 and channel == 0 and payload[-1] == 0xCE
    return decode_method(payload[:-1])


class Door:
    """A front door on a loopback port whose routes the test sets."""

    def __init__(self, route, trusted: frozenset[str] = frozenset()):
        self.asked: list[tuple[str | None, bool]] = []

        def asked(vhost, forwarded):
            self.asked.append((vhost, forwarded))
            return route

        self.doors = FrontDoors(Config(), "1.2.3", "Python 3", asked, trusted)
        self.listener = None

    async def __aenter__(self):
        self.listener = await asyncio.get_running_loop().create_server(lambda: FrontDoor(self.doors), "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_):
        self.listener.close()

    async def client(self, first: bytes = PROTOCOL_HEADER):
        reader, writer = await asyncio.open_connection("127.0.0.1", self.listener.sockets[0].getsockname()[1])
        writer.write(first)
        return reader, writer


def run(test):
    uvloop.run(asyncio.wait_for(test(), 10))


async def handed_over(receiving):
    """The socket and state of the one hand-off the front door sends."""
    taken = []
    while not taken:
        await asyncio.sleep(0.01)
        receive_all(receiving, lambda sock, handed: taken.append((sock, handed)))
    (sock, handed), = taken
    return sock, handed


async def handshake(reader, writer, rest: bytes = b"") -> None:
    start = await read_frame(reader)
    assert isinstance(start, spec.Connection.Start)
    assert start.server_properties["product"] == "Warren" and start.server_properties["version"] == "1.2.3"
    writer.write(START_OK)
    tune = await read_frame(reader)
    assert isinstance(tune, spec.Connection.Tune) and tune.frame_max == Config().frame_max
    writer.write(TUNE_OK + OPEN + rest)


def test_a_client_of_a_vhost_with_no_leader_is_told_so_after_open():
    async def test():
        async with Door("vhost 'orders' is unavailable: no leader") as door:
            reader, writer = await door.client()
            await handshake(reader, writer)
            close = await read_frame(reader)
            assert (close.reply_code, close.reply_text) == (541, "INTERNAL_ERROR - vhost 'orders' is unavailable: "
                                                                 "no leader")
            assert door.asked == [("orders", False)]
            assert await reader.read() == b""
    run(test)


def test_a_wrong_protocol_header_is_answered_with_ours():
    async def test():
        async with Door("unused") as door:
            reader, _ = await door.client(b"AMQP\x00\x00\x08\x00")
            assert await reader.read() == PROTOCOL_HEADER
            assert door.asked == []
    run(test)


def test_a_client_goes_to_a_worker_of_this_node_with_every_byte_it_sent():
    async def test():
        receiving, sending = handoff_pair()
        try:
            async with Door(sending) as door:
                reader, writer = await door.client()
                await handshake(reader, writer, rest=CHANNEL_OPEN)
                sock, handed = await handed_over(receiving)
                assert handed.answered == 2 and handed.data == HANDSHAKE + CHANNEL_OPEN
                assert handed.peer == list(writer.get_extra_info("sockname"))
                sock.sendall(b"from the worker")  # the socket is the client's own
                assert await reader.readexactly(15) == b"from the worker"
                sock.close()
        finally:
            receiving.close()
            sending.close()
    run(test)


def test_a_client_goes_to_another_node_whose_first_answers_are_dropped():
    async def test():
        received = bytearray()
        sent_back = (encode_method(0, spec.Connection.Start()) + encode_method(0, spec.Connection.Tune())
                     + encode_method(0, spec.Connection.OpenOk()))

        async def leading_node(reader, writer):
            writer.write(sent_back[:5])  # the answers come in pieces, cut inside a frame
            await asyncio.sleep(0.01)
            writer.write(sent_back[5:])
            while data := await reader.read(65536):
                received.extend(data)

        node = await asyncio.start_server(leading_node, "127.0.0.1", 0)
        try:
            async with Door(("127.0.0.1", node.sockets[0].getsockname()[1])) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                assert isinstance(await read_frame(reader), spec.Connection.OpenOk)
                client = writer.get_extra_info("sockname")
                header = proxy_header.encode(client, writer.get_extra_info("peername"))
                assert bytes(received) == header + PROTOCOL_HEADER + HANDSHAKE
                writer.close()
        finally:
            node.close()
    run(test)


def test_what_is_no_handshake_goes_to_the_default_groups_leader_to_judge():
    async def test():
        receiving, sending = handoff_pair()
        try:
            async with Door(sending) as door:
                reader, writer = await door.client()
                await read_frame(reader)
                writer.write(OPEN)  # open before start-ok
                sock, handed = await handed_over(receiving)
                assert door.asked == [(None, False)]
                assert handed.answered == 1 and handed.data == OPEN
                sock.close()
        finally:
            receiving.close()
            sending.close()
    run(test)


@pytest.mark.parametrize("trusted", [True, False])
def test_a_proxy_header_counts_from_a_member_only(trusted):
    async def test():
        async with Door("no leader", frozenset({"127.0.0.1"} if trusted else ())) as door:
            header = proxy_header.encode(("10.1.2.3", 4000), ("10.0.0.1", 5672))
            reader, writer = await door.client(header + PROTOCOL_HEADER)
            if not trusted:  # not a protocol header
                assert await reader.read() == PROTOCOL_HEADER
                return
            await handshake(reader, writer)
            await read_frame(reader)
            assert door.asked == [("orders", True)]  # forwarded: a worker of this node takes it, or nobody
    run(test)



def test_frames_past_open_go_with_the_client_whatever_their_size():
    """A client may send its first channel's frames behind connection.open: a frame larger than a handshake's
    still goes, with the rest, to the leader of the vhost open named."""
    async def test():
        receiving, sending = handoff_pair()
        try:
            async with Door(sending) as door:
                reader, writer = await door.client()
                large = struct.pack(">BHI", 3, 1, 100_000)  # a body frame's start, larger than a handshake's
                await handshake(reader, writer, rest=CHANNEL_OPEN + large)
                sock, handed = await handed_over(receiving)
                assert door.asked == [("orders", False)]
                assert handed.data.startswith(HANDSHAKE + CHANNEL_OPEN)
                sock.close()
        finally:
            receiving.close()
            sending.close()
    run(test)


def test_a_client_the_other_node_turns_away_is_told_to_come_again():
    """A node that does not take this one's PROXY header yet answers with its protocol header and closes."""
    async def test():
        async def distrustful(reader, writer):
            await reader.read(1)
            writer.write(PROTOCOL_HEADER)
            writer.close()

        node = await asyncio.start_server(distrustful, "127.0.0.1", 0)
        try:
            async with Door(("127.0.0.1", node.sockets[0].getsockname()[1])) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                close = await read_frame(reader)
                assert (close.reply_code, close.reply_text) == (320, TURNED_AWAY)
                assert await reader.read() == b""
        finally:
            node.close()
    run(test)


def test_a_proxy_header_from_an_address_not_known_yet_has_the_members_read_again():
    """A node that has just joined forwards before this one has read the members since: they are read again before
    its PROXY header is judged."""
    async def test():
        async with Door("no leader") as door:
            readings = []

            async def recheck():
                readings.append(1)
                await asyncio.sleep(0.05)  # etcd answers
                door.doors.trusted_proxies = frozenset({"127.0.0.1"})

            door.doors.recheck = recheck
            header = proxy_header.encode(("10.1.2.3", 4000), ("10.0.0.1", 5672))
            reader, writer = await door.client(header)
            await asyncio.sleep(0.01)
            writer.write(PROTOCOL_HEADER)  # (sent while the members are read)
            await handshake(reader, writer)
            await read_frame(reader)
            assert door.asked == [("orders", True)] and readings == [1]
    run(test)


def test_a_proxy_header_from_no_member_is_refused_after_the_members_are_read_again():
    async def test():
        async with Door("no leader") as door:
            async def recheck():
                pass  # still not a member

            door.doors.recheck = recheck
            reader, writer = await door.client(proxy_header.encode(("10.1.2.3", 4000), ("10.0.0.1", 5672)) +
                                               PROTOCOL_HEADER)
            assert await reader.read() == PROTOCOL_HEADER
            assert door.asked == []
    run(test)
