"""The front door of a clustered node's workers (broker.connection.front_door): the handshake up to connection.open
(the login checked where the process holds the node's users, else not), then the client sent where its vhost is
led with every byte it sent."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from types import SimpleNamespace

import pytest
import uvloop
from pamqp import commands as spec

from broker.config import Config
from broker.connection.front_door import TURNED_AWAY, FrontDoor, FrontDoors, refused
from broker.connection.handoff import handoff_pair, receive_all
from broker.connection.login_throttle import LoginThrottle
from broker.model.node import Node
from protocol import node_proof, proxy_header
from protocol.stream_start import Forwarding, NotProven, StartReader
from protocol.codec import decode_method, encode_method
from protocol.constants import PROTOCOL_HEADER

from tests.conftest import free_port
from tests.waiting import TIMER_GRAIN

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


SECRET = "the cluster's secret"


class Door:
    """A front door on a loopback port whose routes the test sets, of a node that knows secret."""

    def __init__(self, route, secret: str = SECRET, users=None):
        self.asked: list[tuple[str | None, bool]] = []

        def asked(vhost, forwarded, copies=True, mqtt=False):  # (FrontDoors.route: a Router)
            self.asked.append((vhost, forwarded))
            return route

        self.doors = FrontDoors(Config(), "1.2.3", "Python 3", asked, lambda: secret, users=lambda: users)
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


def test_a_client_of_a_vhost_with_no_leader_is_told_it_is_down_after_open():
    async def test():
        async with Door("vhost 'orders' is unavailable: no leader") as door:
            reader, writer = await door.client()
            await handshake(reader, writer)
            close = await read_frame(reader)
            assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
                541, "INTERNAL_ERROR - access to vhost 'orders' refused for user 'guest': vhost 'orders' is down",
                10, 40)  # (RabbitMQ's answer, naming connection.open)
            assert door.asked == [("orders", False)]
            assert await reader.read() == b""
    run(test)


def test_where_the_process_holds_the_users_a_down_vhost_is_refused_after_the_access_check():
    async def test():
        users = holding_users()
        users.node.add_vhost("orders")
        async with Door("vhost 'orders' is unavailable: no leader", users=users) as door:
            reader, writer = await door.client()
            await handshake(reader, writer)
            close = await read_frame(reader)
            assert (close.reply_code, close.reply_text) == (
                530, "NOT_ALLOWED - access to vhost 'orders' refused for user 'guest'")  # (no permission there)
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


def leading_node(secret: str, sent_back: bytes, received: bytearray, starts: list):
    """Another node's AMQP port, as its front door reads a forwarded client: the PROXY header and the proofs (a
    node that knows secret), then what the client sent, kept in received; it answers with sent_back, in pieces."""
    async def serve(reader, writer):
        start = StartReader(secret)
        while True:
            data = await reader.read(65536)
            if not data:
                return
            try:
                challenge, started = start.feed(data)
            except NotProven:
                writer.close()
                return
            writer.write(challenge)
            if started is not None:
                break
        starts.append(started)
        received.extend(started.rest)
        writer.write(sent_back[:5])  # the answers come in pieces, cut inside a frame
        await asyncio.sleep(0.01)
        writer.write(sent_back[5:])
        while data := await reader.read(65536):
            received.extend(data)
    return serve


def test_a_client_goes_to_another_node_whose_first_answers_are_dropped():
    async def test():
        received, starts = bytearray(), []
        sent_back = (encode_method(0, spec.Connection.Start()) + encode_method(0, spec.Connection.Tune())
                     + encode_method(0, spec.Connection.OpenOk()))
        node = await asyncio.start_server(leading_node(SECRET, sent_back, received, starts), "127.0.0.1", 0)
        try:
            async with Door(("127.0.0.1", node.sockets[0].getsockname()[1])) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                assert isinstance(await read_frame(reader), spec.Connection.OpenOk)
                [start] = starts
                assert start.forwarded == (writer.get_extra_info("sockname"), writer.get_extra_info("peername"))
                assert bytes(received) == HANDSHAKE
                writer.close()
        finally:
            node.close()
    run(test)


def test_a_client_forwarded_to_a_node_that_no_longer_leads_its_vhost_is_dropped():
    """The leader changed (or none is known now): the client connects again rather than wait on the old one, which
    may be out of reach; a client whose vhost is still led where it went stays."""
    async def test():
        received, starts = bytearray(), []
        sent_back = (encode_method(0, spec.Connection.Start()) + encode_method(0, spec.Connection.Tune())
                     + encode_method(0, spec.Connection.OpenOk()))
        node = await asyncio.start_server(leading_node(SECRET, sent_back, received, starts), "127.0.0.1", 0)
        leader = ("127.0.0.1", node.sockets[0].getsockname()[1])
        try:
            async with Door(leader) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                assert isinstance(await read_frame(reader), spec.Connection.OpenOk)
                door.doors.reroute()  # the same leader: the client stays
                assert len(door.doors.joined) == 1
                door.doors.route = lambda vhost, forwarded, **options: refused(vhost, "no leader now")
                door.doors.reroute()
                assert await reader.read() == b""  # closed
                assert not door.doors.joined
                writer.close()
        finally:
            node.close()
    run(test)


def test_a_client_whose_vhosts_leader_cannot_be_reached_is_told_to_come_again_however_long_its_vhosts_name():
    """The close names the vhost, its text cut to a short string's 255 bytes (a name of 85 two-byte characters, 170
    bytes, makes the text longer than that)."""
    async def test():
        vhost = "é" * 85
        async with Door(("127.0.0.1", free_port())) as door:  # (nothing listens there)
            reader, writer = await door.client()
            assert isinstance(await read_frame(reader), spec.Connection.Start)
            writer.write(START_OK)
            assert isinstance(await read_frame(reader), spec.Connection.Tune)
            writer.write(TUNE_OK + encode_method(0, spec.Connection.Open(virtual_host=vhost)))
            close = await read_frame(reader)
            assert close.reply_code == 320 and close.reply_text.startswith(
                f"CONNECTION_FORCED - broker forced connection closure with reason 'vhost '{vhost[:40]}")
            assert close.reply_text.endswith("...") and len(close.reply_text.encode()) <= 255
            assert await reader.read() == b""  # closed
            writer.close()
    run(test)


def test_a_node_that_cannot_prove_the_secret_gets_no_client():
    async def test():
        received, starts = bytearray(), []
        node = await asyncio.start_server(leading_node("another secret", b"", received, starts), "127.0.0.1", 0)
        try:
            async with Door(("127.0.0.1", node.sockets[0].getsockname()[1])) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                close = await read_frame(reader)
                assert (close.reply_code, close.reply_text) == (320, TURNED_AWAY)
                assert starts == [] and bytes(received) == b""  # nothing of the client's went there
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


def test_a_proven_proxy_header_names_the_client_whatever_address_it_comes_from():
    async def test():
        async with Door("no leader") as door:
            forwarding = Forwarding(SECRET, ("10.1.2.3", 4000), ("10.0.0.1", 5672), tls=False)
            reader, writer = await door.client(forwarding.header)
            proof, _ = forwarding.feed(await reader.readexactly(node_proof.CHALLENGE_SIZE))
            writer.write(proof + PROTOCOL_HEADER)
            await handshake(reader, writer)
            await read_frame(reader)
            assert door.asked == [("orders", True)]  # forwarded: a worker of this node takes it, or nobody
    run(test)


@pytest.mark.parametrize("secret, header", [
    (SECRET, proxy_header.encode(("10.1.2.3", 4000), ("10.0.0.1", 5672))),  # no nonce: not another node's
    (SECRET, Forwarding("another secret", ("10.1.2.3", 4000), ("10.0.0.1", 5672), tls=False).header),
    ("", Forwarding(SECRET, ("10.1.2.3", 4000), ("10.0.0.1", 5672), tls=False).header),  # no secret learnt yet
], ids=["no-nonce", "wrong-secret", "not-learnt"])
def test_an_unproven_proxy_header_is_refused(secret, header):
    async def test():
        async with Door("no leader", secret) as door:
            reader, writer = await door.client(header)
            data = await reader.read(node_proof.CHALLENGE_SIZE)
            writer.write(bytes(node_proof.PROOF_SIZE) + PROTOCOL_HEADER)  # a guessed proof, where one is asked
            with contextlib.suppress(ConnectionResetError):
                while data:
                    data = await reader.read(65536)
            assert door.asked == []
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
    """A node that does not read PROXY headers (it is outside the cluster) answers with its protocol header and
    closes."""
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


def holding_users(delay: float = 0.0) -> SimpleNamespace:
    """The part of a broker a front door checks logins with: the node's users (guest/guest), the throttle."""
    node = Node()
    node.put_user("guest", "guest")
    return SimpleNamespace(node=node, config=Config(failed_login_delay=delay), failed_logins=LoginThrottle())


def start_ok(password: str, failure_close: bool = True) -> bytes:
    capabilities = {"authentication_failure_close": True} if failure_close else {}
    return encode_method(0, spec.Connection.StartOk(
        client_properties={"product": "test", "capabilities": capabilities}, mechanism="PLAIN",
        response=f"\0guest\0{password}", locale="en_US"))


def test_where_the_process_holds_the_users_a_wrong_login_is_refused_at_start_ok_as_a_broker_refuses_it():
    async def test():
        users = holding_users()
        async with Door("unused", users=users) as door:
            for failure_close in (True, False):
                reader, writer = await door.client()
                assert isinstance(await read_frame(reader), spec.Connection.Start)
                writer.write(start_ok("wrong", failure_close))
                if failure_close:  # 403, where a broker that did not check would have sent connection.tune
                    close = await read_frame(reader)
                    assert (close.reply_code, close.reply_text) == (
                        403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details "
                             "see the broker logfile.")
                assert await reader.read() == b""  # (a client that expects no close: the socket closes)
            assert door.asked == []
            assert (users.node.counters.auth_attempts, users.node.counters.auth_failed) == (2, 2)
    run(test)


def test_a_refused_login_at_the_front_door_waits_as_long_as_the_throttle_asks():
    async def test():
        delay = 0.2
        async with Door("unused", users=holding_users(delay)) as door:
            waits = []
            for _ in range(2):
                reader, writer = await door.client()
                await read_frame(reader)
                sent = time.monotonic()
                writer.write(start_ok("wrong"))
                assert (await read_frame(reader)).reply_code == 403
                waits.append(time.monotonic() - sent)
            assert waits[0] < delay <= waits[1] + TIMER_GRAIN, waits  # the second refusal from the address waits
    run(test)


def test_a_right_login_goes_on_to_its_worker_with_the_user_it_logged_in():
    async def test():
        receiving, sending = handoff_pair()
        users = holding_users()
        try:
            async with Door(sending, users=users) as door:
                reader, writer = await door.client()
                await handshake(reader, writer)
                _, handed = await handed_over(receiving)
                assert (handed.answered, handed.user, handed.data) == (2, "guest", HANDSHAKE)
                assert users.node.counters.auth_attempts == 1  # (the worker takes the user, and counts nothing)
        finally:
            receiving.close()
            sending.close()
    run(test)
