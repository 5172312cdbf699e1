"""What an attacker on the network between the nodes sees, and what it can do with it: the three nodes and etcd run
in network namespaces of their own (tests/cluster/netns.py); the test process, on the bridge with an address that
is not loopback, captures every byte that crosses it (tests/cluster/sniff.py) while clients publish through a
follower, ask a follower's API and list the nodes. guest is a loopback user, as by default.

- the cluster's secret crosses no link between nodes (replication, forwarded clients, forwarded API requests); with
  [cluster] secret_file it crosses no link at all, etcd's included;
- with the secret, a client elsewhere passes for a local one (guest as administrator): the test's attacker does
  exactly that with the real secret, as a check that its attack works, and fails with every token the capture holds;
- a forwarded API request seen on the wire and sent again is refused, also once the node it went to has started
  again and leads again;
- the leader's asks for the other nodes' entries in /api/nodes carry no credentials;
- what the links carry (messages, credentials) is read in clear without TLS, and not with [cluster] tls.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import ssl
import uuid
from pathlib import Path

import pika
import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management.forwarding import ApiClient
from tests.cluster.nodes import Cluster
from tests.cluster.sniff import Sniffer
from tests.tls_certs import make_certificates
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ADMIN = ("admin", "admin-password")  # an administrator who may log in from anywhere, for the test's clients
TABLES = "".join(f"""
[[users]]
name = "{name}"
password = "{password}"
tags = ["administrator"]
[[permissions]]
user = "{name}"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"
""" for name, password in (ADMIN, ("guest", "guest")))  # (guest as on a new data dir: a loopback user)
HEX_TOKEN = re.compile(rb"[0-9a-f]{64}")  # what the cluster's secret looks like when etcd makes it
MESSAGE = b"a message published through a follower"  # what the replication stream carries to every follower


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Ways:
    """How the test's clients reach the nodes' APIs: over HTTPS with the cluster's CA, or plain HTTP."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.tls = tls

    def connect(self, host: str, port: int) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=10)
        return self.tls.wrap_socket(sock) if self.tls is not None else sock

    def api(self, host: str, port: int, method: str, path: str, user: tuple[str, str] = ADMIN,
            body: dict | None = None) -> tuple[int, bytes]:
        """(status, body) of a request from the test process (an address that is not loopback); (0, b"") while
        the node does not listen."""
        data = json.dumps(body).encode() if body is not None else b""
        try:
            sock = self.connect(host, port)
        except OSError:
            return 0, b""
        with sock:
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {basic(*user)}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                         "Connection: close\r\n\r\n".encode() + data)
            answer = read_all(sock)
        head, _, body_text = answer.partition(b"\r\n\r\n")
        return (int(head.split()[1]), body_text) if head else (0, b"")

    def replayed(self, host: str, port: int, stream: bytes) -> bytes:
        """What a node answers to bytes sent again, word for word, on a connection of the attacker's (plain TCP:
        the attacker has no TLS session to send them in)."""
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(stream)  # (its request asks for Connection: close: the node closes once it has answered)
            return read_all(sock)

    def as_another_node(self, secret: str, host: str, port: int) -> tuple[int, dict | None]:
        """The attack: a request for the leader's API, proven with ``secret``, that names 127.0.0.1 as its client
        and guest's credentials; (status, body) of GET /api/whoami."""
        request = make_mocked_request("GET", "/api/whoami",
                                      headers=CIMultiDict({"Authorization": basic("guest", "guest")}))

        async def ask():
            return await ApiClient(lambda: secret, self.tls).ask_at((host, port), 0, request,  # (group 0: the only)
                                                                   client="127.0.0.1")
        answer = asyncio.run(ask())
        return answer.status, answer.json() if answer.status == 200 else None


def read_all(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while data := sock.recv(65536):
            answer += data
    except (ConnectionResetError, ssl.SSLError):
        pass  # (a node that closes on garbage)
    return answer


def cluster_of(tmp_path: Path, network, etcd, way: str) -> tuple[Cluster, Ways]:
    """Three nodes with the secret in etcd, in a secret_file, or with TLS between nodes (and the API over HTTPS)."""
    settings: dict[str, object] = {}
    if way == "secret-file":
        (tmp_path / "secret").write_text("a secret the operator put on every node\n")
        (tmp_path / "secret").chmod(0o600)
        settings["secret_file"] = str(tmp_path / "secret")
    if way == "tls":
        settings["tls"] = True
    cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd.endpoint, loopback_users=["guest"],
                      tables=TABLES, places={name: network.place(name) for name in ("a", "b", "c")}, **settings)
    if way != "tls":
        return cluster, Ways(None)
    certificates = make_certificates(tmp_path / "certs")
    for node in cluster.nodes.values():
        node.config_path.write_text(node.config_path.read_text().replace("[management]\n", "[management]\ntls = true\n")
                                    + f'[tls]\ncertfile = "{certificates.path("node.pem")}"\n'
                                    f'keyfile = "{certificates.path("node.key")}"\n'
                                    f'cacertfile = "{certificates.path("ca.pem")}"\n')
    context = ssl.create_default_context(cafile=certificates.path("ca.pem"))
    context.check_hostname = False
    return cluster, Ways(context)


@pytest.mark.parametrize("way", ["secret-in-etcd", "secret-file", "tls"])
def test_what_crosses_the_network_neither_proves_the_secret_nor_makes_a_remote_client_local(tmp_path, network,
                                                                                           etcd, way):
    cluster, ways = cluster_of(tmp_path, network, etcd, way)
    hosts = {node.host for node in cluster.nodes.values()}
    with Sniffer(network, ["etcd", *cluster.nodes]) as sniffer, cluster.running():
        leader = cluster.ready()
        follower = cluster.followers()[0]
        wait_for(lambda: ways.api(follower.host, follower.management_port, "GET", "/api/overview")[0] == 200, 30,
                 "the follower's API forwarding to the leader")
        credentials = pika.PlainCredentials(*ADMIN)
        with pika.BlockingConnection(pika.ConnectionParameters(follower.host, follower.port,
                                                               credentials=credentials)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("through-a-follower", durable=True)
            channel.basic_publish("", "through-a-follower", MESSAGE, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: len(json.loads(ways.api(leader.host, leader.management_port, "GET", "/api/nodes")[1] or b"[]"))
                 == 3, 30, "every node listed by the leader, each asked for its entry")
        secret = (tmp_path / "secret").read_text().strip() if way == "secret-file" else cluster.observer.secret()
        # the attack works with the secret: the test's attacker is as strong as the one who found the leak
        assert ways.as_another_node(secret, leader.host, leader.management_port) == (
            200, {"name": "guest", "tags": ["administrator"]})
        streams = sniffer.streams()
        between_nodes = {flow: data for flow, data in streams.items()
                         if flow[0][0] in hosts and flow[1][0] in hosts}
        seen = streams if way == "secret-file" else between_nodes  # (etcd's link carries the secret etcd keeps)
        assert between_nodes, "no traffic captured between the nodes"
        for flow, data in seen.items():
            assert secret.encode() not in data, f"the secret crossed {flow}"
        tokens = {token.decode() for data in seen.values() for token in HEX_TOKEN.findall(data)}
        for token in tokens - {secret}:
            assert ways.as_another_node(token, leader.host, leader.management_port)[0] != 200
        # what the links carry: in clear without TLS (the capture sees it), unreadable with it
        carried = any(MESSAGE in data for data in between_nodes.values())
        assert carried is (way != "tls")
        # a forwarded request seen on the wire, sent again as it was: refused, whatever it asked
        forwarded = [data for (source, destination), data in between_nodes.items()
                     if source[0] == follower.host and destination == (leader.host, leader.management_port)]
        assert forwarded, "no forwarded API request captured"
        def refused_all() -> None:
            for stream in forwarded:
                answer = ways.replayed(leader.host, leader.management_port, stream)
                assert b" 200 " not in answer.split(b"\r\n\r\n", 1)[-1], answer[:300]
                assert way == "tls" or b" 403 " in answer, answer[:300]
        refused_all()
        # the leader's asks for the other nodes' entries need no credentials, and carry none
        others = {(node.host, node.management_port) for node in cluster.nodes.values() if node is not leader}
        asks = [data for (source, destination), data in between_nodes.items()
                if source[0] == leader.host and destination in others]
        assert asks, "no ask for another node's entries captured"
        if way != "tls":
            for stream in asks:
                assert b"/api/nodes" in stream and b"authorization" not in stream.lower()
        # ... and after the node that took it has started again, leading again: it remembers nothing, and needs not
        leader.kill()
        leader.start()
        cluster.ready()
        wait_for(lambda: ways.api(follower.host, follower.management_port, "PUT", "/api/vhosts/%2F/leader",
                                  body={"node": leader.name})[0] == 204, 30, "the restarted node named to lead")
        wait_for(lambda: cluster.leader() is leader and ways.api(leader.host, leader.management_port, "GET",
                                                                 "/api/overview")[0] == 200, 30,
                 "the restarted node leads")
        refused_all()
