"""A follower forwards every client to the leader, amqps ones included: their TLS session ends at the follower,
which tells the leader so in its PROXY v2 header, and the leader shows them as RabbitMQ shows amqps connections."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import urllib.request
import uuid

import pika
import pytest

from tests.cluster.nodes import Cluster
from tests.conftest import free_port
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.slow

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def test_amqps_clients_of_every_node_reach_the_leader_shown_as_amqps(tmp_path, etcd_endpoint):
    certificates = make_certificates(tmp_path / "certs")
    cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint)
    for node in cluster.nodes.values():
        node.tls_port = free_port()
        node.config_path.write_text(node.config_path.read_text() + f'[tls]\nport = {node.tls_port}\n'
                                    f'certfile = "{certificates.path("server.pem")}"\n'
                                    f'keyfile = "{certificates.path("server.key")}"\n')
    context = ssl.create_default_context(cafile=certificates.path("ca.pem"))
    with cluster.running(), contextlib.ExitStack() as connections:
        leader = cluster.ready()
        for node in cluster.nodes.values():
            connection = connections.enter_context(pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", node.tls_port, ssl_options=pika.SSLOptions(context, "localhost"),
                connection_attempts=50, retry_delay=0.2)))  # (a follower forwards once it has heard the leader)
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("through-tls", durable=True)
            channel.basic_publish("", "through-tls", node.name.encode(), pika.BasicProperties(delivery_mode=2))
        request = urllib.request.Request(
            f"http://127.0.0.1:{leader.management_port}/api/connections?columns=port,ssl",
            headers={"Authorization": GUEST})
        with urllib.request.urlopen(request, timeout=10) as response:
            shown = json.loads(response.read())
        # the port each client connected to: the leader's own amqps port, or the follower's that forwarded it
        assert sorted((connection["port"], connection["ssl"]) for connection in shown) == sorted(
            (node.tls_port, True) for node in cluster.nodes.values())
        channel = connections.enter_context(pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", leader.port))).channel()
        assert channel.queue_declare("through-tls", durable=True, passive=True).method.message_count == 3
