"""Client forwarding between nodes: a follower's front doors (broker.connection.front_door) carry each client's
connection to the leader's behind a PROXY v2 header, and the leader's front doors take the client's address from
that header only when the forwarder proves it knows the cluster's secret, whatever address it comes from; they hand
the client to the leading broker, which checks its login there. Both nodes run in this process, on an event loop of
its own thread, as a node's worker runs them (cluster.worker): the leader's front doors hand clients over to its
broker through a hand-off socket; the follower's route every client to the leader the test names. The clients
(pika, or raw sockets) block in the test's thread."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest
import uvloop
from pamqp import commands

from broker.config import Config
from broker.connection.server import Server
from broker.connection.tls import server_context
from broker.management.server import start_management
from cluster.worker import Adoption
from broker.connection.front_door import FrontDoors, Route, open_doors, refused
from broker.connection.handoff import handoff_pair, receive_all
from protocol import node_proof, proxy_header
from protocol.stream_start import Forwarding
from tests.conftest import free_port
from tests.integration.helpers import (
    EVENT_TIMEOUT, beyond_rabbitmq, connect, consume, declare_queue, publish, wait_for_message_count,
)
from tests.integration.management import add_user, delete_user, request, set_permissions
from tests.integration.rawclient import AMQP_0_9_1_HEADER, RawClient, describe, plain_response
from tests.tls_certs import make_certificates
from tests.waiting import wait_for

pytestmark = beyond_rabbitmq

SECRET = "the cluster's secret"
FORWARDER = "127.0.0.1"  # the forwarder's address as the leader sees it
ELSEWHERE = "127.0.0.3"  # another loopback address, from which a client can send a header of its own


class LoopThread:
    """An event loop running on a thread of its own while the test's clients block."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(EVENT_TIMEOUT * 3)

    def call(self, function: Callable[[], Any]) -> Any:
        """function() run on the loop, for a look at what the loop's objects hold."""
        async def called() -> Any:
            return function()
        return self.run(called())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass
class Endpoint:
    """Where a client connects, in the shape the helpers take: the leader, or a forwarder."""

    host: str
    port: int
    management_port: int  # the leader's management API

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"


@dataclass
class Leader:
    """The leading node: its front doors, and the broker they hand every client to."""

    server: Server
    endpoint: Endpoint  # its front doors' AMQP port, and its broker's management API


class Leadership:
    """What the follower knows of the leader, as its front doors ask it: None while no leader is known."""

    def __init__(self, address: tuple[str, int] | None) -> None:
        self.address = address

    def route(self, vhost: str | None, forwarded: bool) -> Route:
        return self.address or refused(vhost, "no leader now")


@dataclass
class Forwarder:
    """A follower's front doors on one listener."""

    doors: FrontDoors
    listener: asyncio.Server

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """As a follower stops following: no listener, no client left."""
        self.listener.close()
        self.doors.close()
        await self.listener.wait_closed()


@pytest.fixture(scope="module")
def loop_thread():
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def leader(loop_thread, tmp_path_factory):
    config = Config(port=0, data_dir=str(tmp_path_factory.mktemp("leader")), management_port=free_port(),
                    prometheus_port=0, failed_login_delay=0)
    server = Server(config, accepting=False)
    receiving, sending = handoff_pair()
    doors = FrontDoors(config, "test", "test", lambda vhost, forwarded: sending, lambda: SECRET)

    async def start():
        await server.start()
        asyncio.get_running_loop().add_reader(receiving.fileno(), receive_all, receiving,
                                              Adoption(lambda: server).take)
        return await open_doors(doors, host="127.0.0.1", port=0), await start_management(server)

    listener, management = loop_thread.run(start())
    yield Leader(server, Endpoint("127.0.0.1", listener.sockets[0].getsockname()[1], config.management_port))

    async def stop():
        listener.close()
        doors.close()
        asyncio.get_running_loop().remove_reader(receiving.fileno())
        await management.stop()
        await server.stop()

    loop_thread.run(stop())
    receiving.close()
    sending.close()


@pytest.fixture(scope="module")
def single(loop_thread, tmp_path_factory):
    """A broker outside any cluster, listening itself."""
    server = Server(Config(port=0, data_dir=str(tmp_path_factory.mktemp("single")), management_port=0,
                           prometheus_port=0, mqtt_port=0))
    loop_thread.run(server.start())
    yield Endpoint("127.0.0.1", server.port, 0)
    loop_thread.run(server.stop())


@pytest.fixture
def leadership(leader):
    return Leadership((leader.endpoint.host, leader.endpoint.port))


@pytest.fixture
def start_forwarder(loop_thread, leader, leadership):
    """start(host, tls) -> the endpoint of a forwarder listening on host (an amqps port with a TLS context), stopped
    at the end of the test."""
    started: list[Forwarder] = []

    def start(host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> tuple[Forwarder, Endpoint]:
        doors = FrontDoors(leader.server.config, "test", "test", leadership.route, lambda: SECRET)
        forwarder = Forwarder(doors, loop_thread.run(open_doors(doors, tls, host=host, port=0)))
        started.append(forwarder)
        return forwarder, Endpoint(host, forwarder.port, leader.endpoint.management_port)

    yield start
    for forwarder in started:
        loop_thread.run(forwarder.stop())


@pytest.fixture
def forwarded(start_forwarder):
    return start_forwarder()


@pytest.fixture
def broker_log(caplog):
    caplog.set_level(logging.INFO, logger="broker")
    caplog.set_level(logging.INFO, logger="cluster")
    return caplog


def forwarded_pairs(loop_thread: LoopThread, forwarder: Forwarder) -> list[tuple[tuple, tuple]]:
    """(the client's address, the forwarder's address towards the leader) of each forwarded connection."""
    return loop_thread.call(lambda: [
        (client.transport.get_extra_info("peername")[:2], client.other.transport.get_extra_info("sockname")[:2])
        for client in forwarder.doors.joined if client.other is not None])


def leader_connections(loop_thread: LoopThread, leader: Leader, port: int) -> list:
    """The leader's connections whose client connected to port (the forwarder's, when it forwards them)."""
    return loop_thread.call(lambda: [connection for connection in leader.server.connections
                                     if connection.local is not None and connection.local[1] == port])


def connect_from(endpoint: Endpoint, address: str) -> RawClient:
    """A raw client whose socket comes from the given loopback address."""
    return RawClient(socket.create_connection((endpoint.host, endpoint.port), timeout=5, source_address=(address, 0)))


def proven(client: RawClient, source: tuple[str, int], secret: str = SECRET) -> None:
    """The PROXY header of a node that forwards a client from source, and its proof: what a forwarder sends."""
    forwarding = Forwarding(secret, source, ("127.0.0.1", 5672), tls=False)
    client.send_raw(forwarding.header)
    proof, _ = forwarding.feed(client.recv_raw(node_proof.CHALLENGE_SIZE))
    client.send_raw(proof)


def login(client: RawClient, username: str = "guest", password: str = "guest") -> str:
    """The handshake up to connection.open (the front door answers start and tune; the broker it hands the client
    to checks the login); what the broker answers: 'open', or 'refused' (403)."""
    client.send_protocol_header()
    client.expect(commands.Connection.Start)
    client.send(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}}, mechanism="PLAIN",
        response=plain_response(username, password)))
    tune = client.expect(commands.Connection.Tune)
    client.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
    client.send(0, commands.Connection.Open(virtual_host="/"))
    _, answer = client.read_frame()
    if isinstance(answer, commands.Connection.OpenOk):
        return "open"
    assert isinstance(answer, commands.Connection.Close) and answer.reply_code == 403, describe(answer)
    return "refused"


def opened(client: RawClient) -> tuple[int, str]:
    """The handshake up to connection.open, which the broker is expected to answer with connection.close: its reply
    code and text (the socket is closed after it)."""
    client.handshake(open_connection=False)
    client.send(0, commands.Connection.Open(virtual_host="/"))
    _, closed = client.read_frame()
    assert isinstance(closed, commands.Connection.Close), describe(closed)
    client.expect_closed()
    return closed.reply_code, closed.reply_text


def machine_address() -> str | None:
    """An IPv4 address of this machine other than loopback (the one its default route leaves from), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # a documentation address: nothing is sent
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


# ---- forwarding


def test_publish_and_consume_through_the_forwarder(forwarded, unique):
    _, endpoint = forwarded
    messages = [b"small", bytes(range(256)) * 4096, b""]  # a 1 MiB one among them
    with connect(endpoint) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique)
        publish(ch, queue, messages)
        _, inbox = consume(ch, queue)
        inbox.wait_for(conn, len(messages))
        assert inbox.bodies == messages


def test_the_leader_names_the_client_not_the_forwarder(loop_thread, forwarded, broker_log):
    forwarder, endpoint = forwarded
    with connect(endpoint):
        [(client, outgoing)] = forwarded_pairs(loop_thread, forwarder)
        assert client != outgoing  # two sockets: the client's to the forwarder, the forwarder's to the leader
        reply = request(endpoint, "GET", "/api/connections")
        [shown] = [view for view in reply.body if view["port"] == forwarder.port]
    # As RabbitMQ names a connection that came through a proxy: the client, and the address it connected to
    assert shown["name"] == f"{client[0]}:{client[1]} -> 127.0.0.1:{forwarder.port}"
    assert (shown["peer_host"], shown["peer_port"]) == client
    assert (shown["host"], shown["port"]) == ("127.0.0.1", forwarder.port)
    assert f"accepting AMQP connection {shown['name']}" in broker_log.text


def test_a_direct_client_of_the_forwarders_address_is_served_as_before(leader, unique):
    with connect(leader.endpoint) as conn:
        ch = conn.channel()
        publish(ch, declare_queue(ch, unique), [b"direct"])
        wait_for_message_count(ch, unique, 1)


def test_an_amqps_client_of_a_follower_is_shown_by_the_leader_as_tls(start_forwarder, tmp_path, unique):
    """The follower ends the client's TLS session and forwards it in plain TCP; its PROXY v2 header says the client
    speaks TLS, so the leader shows the connection as RabbitMQ shows an amqps one."""
    certificates = make_certificates(tmp_path / "certs")
    tls = server_context(Config(tls_certfile=certificates.path("server.pem"),
                                tls_keyfile=certificates.path("server.key")))
    tls_forwarder, tls_endpoint = start_forwarder(tls=tls)
    plain_forwarder, plain_endpoint = start_forwarder()
    client_tls = pika.SSLOptions(ssl.create_default_context(cafile=certificates.path("ca.pem")), "localhost")
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_endpoint.port, ssl_options=client_tls)) \
            as over_tls, connect(plain_endpoint) as plain:
        for conn in (over_tls, plain):
            ch = conn.channel()
            publish(ch, declare_queue(ch, f"{unique}-{conn is plain}"), [b"both ways"])
            assert ch.basic_get(f"{unique}-{conn is plain}", auto_ack=True)[2] == b"both ways"
        shown = {view["port"]: view["ssl"] for view in request(tls_endpoint, "GET", "/api/connections").body}
    assert shown[tls_forwarder.port] is True
    assert shown[plain_forwarder.port] is False


# ---- the trust rule


@pytest.mark.parametrize("source, answer", [
    ("192.0.2.77", "refused"),  # guest is a loopback user: the header's client is elsewhere
    ("127.0.0.9", "open"),
], ids=["remote-client", "loopback-client"])
def test_loopback_users_are_checked_against_the_client_the_header_names(leader, source, answer, broker_log):
    with connect_from(leader.endpoint, FORWARDER) as client:
        proven(client, (source, 40000))
        assert login(client) == answer
    if answer == "refused":
        assert f"login refused for user 'guest' from {source}:40000 (mechanism 'PLAIN'): user 'guest' can only " \
               f"connect via localhost" in broker_log.text


@pytest.fixture
def remote_user(leader):
    """A user who may log in from anywhere ("remote", its password the same), as guest may not."""
    add_user(leader.endpoint, "remote", "remote")
    set_permissions(leader.endpoint, "/", "remote")
    yield
    delete_user(leader.endpoint, "remote")


def test_a_proven_header_counts_whatever_address_it_comes_from(loop_thread, leader, remote_user):
    with connect_from(leader.endpoint, ELSEWHERE) as client:
        proven(client, ("192.0.2.77", 40000))
        assert login(client, "remote", "remote") == "open"
        [connection] = loop_thread.call(lambda: [c for c in leader.server.connections if c.peer == "192.0.2.77:40000"])
        assert connection.name == "192.0.2.77:40000 -> 127.0.0.1:5672"


def test_the_exchange_in_pieces_is_read_whole(loop_thread, leader, remote_user):
    forwarding = Forwarding(SECRET, ("192.0.2.78", 40000), ("127.0.0.1", 5672), tls=False)
    with connect_from(leader.endpoint, FORWARDER) as client:
        for piece in (forwarding.header[:5], forwarding.header[5:20], forwarding.header[20:]):
            client.send_raw(piece)
            time.sleep(0.02)
        proof, _ = forwarding.feed(client.recv_raw(node_proof.CHALLENGE_SIZE))
        for piece in (proof[:7], proof[7:] + b"AMQP", b"\x00\x00\x09\x01"):
            client.send_raw(piece)
            time.sleep(0.02)
        client.expect(commands.Connection.Start)
        client.send(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                   response=plain_response("remote", "remote")))
        tune = client.expect(commands.Connection.Tune)
        client.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        client.send(0, commands.Connection.Open(virtual_host="/"))
        client.expect(commands.Connection.OpenOk)
        assert loop_thread.call(lambda: [c for c in leader.server.connections if c.peer == "192.0.2.78:40000"])


@pytest.mark.parametrize("secret, header", [
    (SECRET, proxy_header.encode(("127.0.0.1", 40000), ("127.0.0.1", 5672))),  # no nonce: no proof can follow
    ("another secret", None),
], ids=["no-nonce", "wrong-secret"])
def test_a_header_whose_sender_proves_nothing_closes_the_socket_with_one_log_line(leader, secret, header,
                                                                                broker_log):
    """A client on this very machine (as a forwarder of the cluster would be) cannot pass for another node, nor can
    a node of another cluster: guest stays a loopback user."""
    with connect_from(leader.endpoint, FORWARDER) as client:
        if header is not None:
            client.send_raw(header + AMQP_0_9_1_HEADER)
        else:
            forwarding = Forwarding(secret, ("127.0.0.1", 40000), ("127.0.0.1", 5672), tls=False)
            client.send_raw(forwarding.header)
            client.recv_raw(node_proof.CHALLENGE_SIZE)  # a challenge it cannot answer
            client.send_raw(bytes(node_proof.PROOF_SIZE) + AMQP_0_9_1_HEADER)
        client.expect_closed()
    lines = [record.getMessage() for record in broker_log.records if "PROXY" in record.getMessage()]
    assert len(lines) == 1 and "refused PROXY header" in lines[0], lines


def test_a_broker_outside_a_cluster_takes_a_proxy_header_for_a_wrong_protocol_header(single):
    with connect_from(single, FORWARDER) as client:
        client.send_raw(Forwarding(SECRET, ("127.0.0.1", 40000), ("127.0.0.1", 5672), tls=False).header)
        assert client.recv_raw(8) == AMQP_0_9_1_HEADER  # as any header that is not AMQP 0-9-1's, then closed
        client.expect_closed()


@pytest.mark.parametrize("header, reason", [
    (proxy_header.SIGNATURE_V2 + b"\x22\x11\x00\x0c" + bytes(12), "unknown command 2"),
    (proxy_header.SIGNATURE_V2 + b"\x21\x11\x00\x0b" + bytes(11), "11 bytes for TCP4 addresses of 12"),
    (proxy_header.SIGNATURE_V2 + b"\x21\x11\x00\x13" + bytes(12) + b"\xe0\x00\x04" + bytes(4),
     "a nonce of 4 bytes, not 16"),
], ids=["bad-command", "short-addresses", "short-nonce"])
def test_a_malformed_header_closes_the_socket_with_one_log_line(leader, header, reason, broker_log):
    with connect_from(leader.endpoint, FORWARDER) as client:
        client.send_raw(header + AMQP_0_9_1_HEADER)
        client.expect_closed()  # nothing answered: the peer is a proxy, not an AMQP client
    lines = [record.getMessage() for record in broker_log.records if "PROXY" in record.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(f"malformed PROXY header: {reason}"), lines


# ---- no leader, and dropping forwarded connections


def test_with_no_leader_known_the_client_is_told_why_at_once(forwarded, leadership):
    _, endpoint = forwarded
    leadership.address = None
    started = time.monotonic()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(endpoint)
    assert time.monotonic() - started < 0.5
    with RawClient.connect(endpoint) as client:
        # (RabbitMQ's answer for a vhost that is down: the follower cannot check the access, the leader would)
        assert opened(client) == (541, "INTERNAL_ERROR - access to vhost '/' refused for user 'guest': vhost '/' is "
                                       "down")


def test_an_unreachable_leader_has_the_client_told_to_come_again(forwarded, leadership, broker_log):
    _, endpoint = forwarded
    leadership.address = ("127.0.0.1", free_port())  # nothing listens there
    with RawClient.connect(endpoint) as client:
        assert opened(client) == (
            320, "CONNECTION_FORCED - broker forced connection closure with reason 'vhost '/' unavailable'")
    assert (f"cannot forward a client to the node at 127.0.0.1:{leadership.address[1]} that leads its vhost"
            in broker_log.text)


def test_stopping_the_forwarder_closes_its_clients_and_their_leader_connections(loop_thread, leader, forwarded):
    forwarder, endpoint = forwarded
    with connect(endpoint) as conn:
        wait_for(lambda: leader_connections(loop_thread, leader, endpoint.port), EVENT_TIMEOUT)
        loop_thread.run(forwarder.stop())
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            conn.process_data_events(time_limit=EVENT_TIMEOUT)
    wait_for(lambda: not leader_connections(loop_thread, leader, endpoint.port), EVENT_TIMEOUT)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((endpoint.host, endpoint.port), timeout=1)


def test_close_all_drops_the_forwarded_connections_and_goes_on_forwarding(loop_thread, leader, forwarded,
                                                                           leadership):
    forwarder, endpoint = forwarded
    with connect(endpoint) as first, connect(endpoint) as second:
        loop_thread.call(forwarder.doors.close)  # the leader changed
        for conn in (first, second):
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                conn.process_data_events(time_limit=EVENT_TIMEOUT)
    wait_for(lambda: not leader_connections(loop_thread, leader, forwarder.port), EVENT_TIMEOUT)
    with connect(endpoint) as conn:  # new clients go to the leader leader() names now
        assert conn.is_open


# ---- back-pressure


def test_a_consumer_that_does_not_read_holds_the_leader_back_through_the_forwarder(loop_thread, leader, forwarded,
                                                                                    unique):
    forwarder, endpoint = forwarded
    body, count = bytes(64 * 1024), 640  # 40 MiB: far more than the sockets on the way hold
    with connect(leader.endpoint) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique)
        publish(ch, queue, [body] * count)
        wait_for_message_count(ch, queue, count)
    with RawClient.connect(endpoint, timeout=30) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Basic.Consume(queue=queue, no_ack=True))
        client.expect(commands.Basic.ConsumeOk, channel=1)
        # The client reads nothing more: the forwarder stops reading the leader, which stops delivering.
        [pair] = loop_thread.call(lambda: list(forwarder.doors.joined))
        wait_for(lambda: loop_thread.call(lambda: not pair.other.transport.is_reading()), EVENT_TIMEOUT)
        [served] = leader_connections(loop_thread, leader, forwarder.port)
        wait_for(lambda: loop_thread.call(lambda: served.write_paused), EVENT_TIMEOUT)
        for _ in range(10):
            held = loop_thread.call(lambda: pair.transport.get_write_buffer_size()
                                    + pair.other.transport.get_write_buffer_size())
            assert held < 1024 * 1024, f"the forwarder holds {held} bytes"
            time.sleep(0.05)
        delivered = 0
        while delivered < count:  # reading again, the client gets every message
            _, frame = client.read_frame()
            delivered += isinstance(frame, commands.Basic.Deliver)
