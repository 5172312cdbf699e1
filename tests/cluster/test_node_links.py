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
- the leader's asks for the other nodes' entries in /api/nodes carry no credentials.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import uuid
from pathlib import Path

import pika
import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from broker.management.forwarding import LEADERS_GROUP, ApiClient
from tests.cluster.etcd import started_etcd
from tests.cluster.netns import network_or_skip
from tests.cluster.nodes import Cluster, wait_for
from tests.cluster.sniff import Sniffer

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


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def api(host: str, port: int, method: str, path: str, user: tuple[str, str] = ADMIN,
        body: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of a request from the test process (an address that is not loopback); (0, b"") while the node
    does not listen."""
    data = json.dumps(body).encode() if body is not None else b""
    try:
        sock = socket.create_connection((host, port), timeout=10)
    except OSError:
        return 0, b""
    with sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {basic(*user)}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     "Connection: close\r\n\r\n".encode() + data)
        answer = b""
        while data := sock.recv(65536):
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def replayed(host: str, port: int, stream: bytes) -> bytes:
    """What a node answers to bytes sent again, word for word, on a connection of the attacker's."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(stream)  # (its request asks for Connection: close: the node closes once it has answered)
        answer = b""
        while data := sock.recv(65536):
            answer += data
    return answer


def as_another_node(secret: str, host: str, port: int) -> tuple[int, dict | None]:
    """The attack: a request for the leader's API, proven with ``secret``, that names 127.0.0.1 as its client and
    guest's credentials; (status, body) of GET /api/whoami."""
    request = make_mocked_request("GET", "/api/whoami", headers=CIMultiDict({"Authorization": basic("guest", "guest")}))

    async def ask():
        return await ApiClient(lambda: secret).ask_at((host, port), LEADERS_GROUP, request, client="127.0.0.1")
    answer = asyncio.run(ask())
    return answer.status, answer.json() if answer.status == 200 else None


@pytest.fixture
def network():
    yield from network_or_skip(["etcd", "a", "b", "c"])


@pytest.fixture
def etcd(network):
    yield from started_etcd(network.place("etcd"))


@pytest.mark.parametrize("secret_file", [False, True], ids=["secret-in-etcd", "secret-file"])
def test_what_crosses_the_network_neither_proves_the_secret_nor_makes_a_remote_client_local(
        tmp_path: Path, network, etcd, secret_file):
    settings: dict[str, object] = {}
    if secret_file:
        (tmp_path / "secret").write_text("a secret the operator put on every node\n")
        settings["secret_file"] = str(tmp_path / "secret")
    nodes = ("a", "b", "c")
    cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd.endpoint, loopback_users=["guest"],
                      tables=TABLES, places={name: network.place(name) for name in nodes}, **settings)
    hosts = {cluster.nodes[name].host for name in nodes}
    with Sniffer(network, ["etcd", *nodes]) as sniffer, cluster.running():
        leader = cluster.ready()
        follower = cluster.followers()[0]
        wait_for(lambda: api(follower.host, follower.management_port, "GET", "/api/overview")[0] == 200, 30,
                 "the follower's API forwarding to the leader")
        credentials = pika.PlainCredentials(*ADMIN)
        with pika.BlockingConnection(pika.ConnectionParameters(follower.host, follower.port,
                                                               credentials=credentials)) as connection:
            channel = connection.channel()
            channel.queue_declare("through-a-follower")
            channel.basic_publish("", "through-a-follower", b"forwarded")
        wait_for(lambda: len(json.loads(api(leader.host, leader.management_port, "GET", "/api/nodes")[1])) == 3, 30,
                 "every node listed by the leader, each asked for its entry")
        secret = (tmp_path / "secret").read_text().strip() if secret_file else cluster.observer.secret()
        # the attack works with the secret: the test's attacker is as strong as the one who found the leak
        assert as_another_node(secret, leader.host, leader.management_port) == (
            200, {"name": "guest", "tags": ["administrator"]})
        streams = sniffer.streams()
        between_nodes = {flow: data for flow, data in streams.items()
                         if flow[0][0] in hosts and flow[1][0] in hosts}
        seen = streams if secret_file else between_nodes  # (etcd's link carries the secret etcd keeps)
        assert between_nodes, "no traffic captured between the nodes"
        for flow, data in seen.items():
            assert secret.encode() not in data, f"the secret crossed {flow}"
        tokens = {token.decode() for data in seen.values() for token in HEX_TOKEN.findall(data)}
        for token in tokens - {secret}:
            assert as_another_node(token, leader.host, leader.management_port)[0] != 200
        # a forwarded request seen on the wire, sent again as it was: refused, whatever it asked
        forwarded = [data for (source, destination), data in between_nodes.items()
                     if source[0] == follower.host and destination == (leader.host, leader.management_port)]
        assert forwarded, f"no forwarded API request captured: {sorted(between_nodes)} {follower.host} {leader.host} {leader.management_port}"
        for stream in forwarded:
            answer = replayed(leader.host, leader.management_port, stream)
            assert b" 403 " in answer and b" 200 " not in answer.split(b"\r\n\r\n", 1)[-1], answer[:300]
        # ... and after the node that took it has started again, leading again: it remembers nothing, and needs not
        leader.kill()
        leader.start()
        cluster.ready()
        wait_for(lambda: api(follower.host, follower.management_port, "PUT", "/api/vhosts/%2F/leader",
                             body={"node": leader.name})[0] == 204, 30, "the restarted node named to lead")
        wait_for(lambda: cluster.leader() is leader and api(leader.host, leader.management_port, "GET",
                                                            "/api/overview")[0] == 200, 30, "the restarted node leads")
        for stream in forwarded:
            answer = replayed(leader.host, leader.management_port, stream)
            assert b" 403 " in answer and b" 200 " not in answer.split(b"\r\n\r\n", 1)[-1], answer[:300]
        # the leader's asks for the other nodes' entries need no credentials, and carry none
        others = {(node.host, node.management_port) for node in cluster.nodes.values() if node is not leader}
        asks = [data for (source, destination), data in between_nodes.items()
                if source[0] == leader.host and destination in others]
        assert asks, "no ask for another node's entries captured"
        for stream in asks:
            assert b"/api/nodes" in stream and b"authorization" not in stream.lower()

