"""A follower of a cluster of one-process nodes answers for the cluster. It forwards every client to the leader,
amqps ones included (their TLS session ends at the follower, which tells the leader so in its PROXY v2 header, and
the leader shows them as RabbitMQ shows amqps connections), and every management API request to the leader's API,
so that any node's API, console and warrenctl show and change the whole cluster, as any RabbitMQ node's do."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pika
import pytest

from tests.cluster.netns import Place
from tests.cluster.nodes import Cluster, wait_for
from tests.conftest import REPO_ROOT, free_port
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.slow

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def test_amqps_clients_of_every_node_reach_the_leader_shown_as_amqps(tmp_path, etcd_endpoint):
    """Every node's amqps port reaches the leader, which shows those clients as amqps; a follower's API over HTTPS
    asks the leader's over HTTPS."""
    certificates = make_certificates(tmp_path / "certs")
    cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint)
    for node in cluster.nodes.values():
        node.tls_port = free_port()
        text = node.config_path.read_text().replace("[management]\n", "[management]\ntls = true\n")
        node.config_path.write_text(text + f'[tls]\nport = {node.tls_port}\n'
                                    f'certfile = "{certificates.path("server.pem")}"\n'
                                    f'keyfile = "{certificates.path("server.key")}"\n'
                                    f'cacertfile = "{certificates.path("ca.pem")}"\n')
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
        follower = cluster.followers()[0]
        request = urllib.request.Request(
            f"https://127.0.0.1:{follower.management_port}/api/connections?columns=port,ssl",
            headers={"Authorization": GUEST})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            shown = json.loads(response.read())
        # the port each client connected to: the leader's own amqps port, or the follower's that forwarded it
        assert sorted((connection["port"], connection["ssl"]) for connection in shown) == sorted(
            (node.tls_port, True) for node in cluster.nodes.values())
        channel = connections.enter_context(pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", leader.port))).channel()
        assert channel.queue_declare("through-tls", durable=True, passive=True).method.message_count == 3


@pytest.mark.parametrize("where, workers", [("localhost", 1), ("127.0.0.2-4", 1), ("localhost", 2)])
def test_a_node_is_believed_for_what_it_proves_not_for_the_address_it_connects_from(tmp_path, etcd_endpoint, where,
                                                                                    workers):
    """Nodes that advertise a name (localhost, as a DNS name would be), or that listen on 127.0.0.2-4 and connect
    out from 127.0.0.1: a follower's clients reach the leader, which names each client by its own address."""
    if where == "localhost":
        cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint, advertise_host="localhost",
                          workers=workers)
    else:
        cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint,
                          places={name: Place(f"127.0.0.{index}") for index, name in enumerate("abc", 2)})
    with cluster.running():
        cluster.ready()
        for node in cluster.nodes.values():
            with pika.BlockingConnection(pika.ConnectionParameters(
                    node.host, node.port, connection_attempts=50, retry_delay=0.2)) as connection:
                channel = connection.channel()
                channel.queue_declare(f"through-{node.name}")
                channel.basic_publish("", f"through-{node.name}", node.name.encode())
                assert channel.basic_get(f"through-{node.name}", auto_ack=True)[2] == node.name.encode()
                def listed():
                    status, views = node.api("GET", "/api/connections")
                    return status == 200 and [view for view in views if view["port"] == node.port]
                shown = wait_for(listed, 30, "the connection listed")
                assert [view["peer_host"] for view in shown] == ["127.0.0.1"]
        refusals = [line for line in cluster.logs().splitlines() if "PROXY header" in line]
        assert not refusals, refusals


@pytest.fixture
def cluster(tmp_path, etcd_endpoint):
    with Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint).running() as instance:
        yield instance


def test_every_nodes_management_api_shows_and_changes_the_whole_cluster(cluster):
    leader = cluster.ready()
    first, second = cluster.followers()
    for node in cluster.nodes.values():  # (a follower forwards once it has heard the leader)
        wait_for(lambda: node.api("GET", "/api/overview")[0] == 200, 30, f"{node.name}'s API")
    assert first.api("PUT", "/api/users/alice", {"password": "secret", "tags": "management"})[0] == 201
    assert first.api("PUT", "/api/permissions/%2F/alice", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", second.port, "/", pika.PlainCredentials("alice", "secret"))) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("alice's", durable=True)
        channel.basic_publish("", "alice's", b"hello", pika.BasicProperties(delivery_mode=2))
        status, connections = second.api("GET", "/api/connections?columns=user,peer_host,port", user="alice:secret")
        assert status == 200 and connections == [{"user": "alice", "peer_host": "127.0.0.1", "port": second.port}]
    status, queue = second.api("GET", "/api/queues/%2F/alice's")
    assert status == 200 and (queue["messages"], queue["node"]) == (1, f"{leader.name}@{queue['node'].split('@')[1]}")
    # the credentials are the leader's to check, whichever node is asked
    assert first.api("GET", "/api/overview", user="alice:wrong")[0] == 401
    assert second.api("DELETE", "/api/users/alice")[0] == 204
    assert first.api("GET", "/api/overview", user="alice:secret")[0] == 401


def test_every_node_lists_every_node_of_the_cluster(cluster):
    cluster.ready()
    for node in cluster.nodes.values():
        nodes = wait_for(lambda: (found := node.api("GET", "/api/nodes"))[0] == 200 and len(found[1]) == 3
                         and found[1], 30, f"every node listed by {node.name}")
        assert [(entry["name"].split("@")[0], entry["running"]) for entry in nodes] == [
            ("a", True), ("b", True), ("c", True)]
        status, one = node.api("GET", f"/api/nodes/{nodes[1]['name']}")
        assert status == 200 and (one["name"], one["os_pid"]) == (nodes[1]["name"], nodes[1]["os_pid"])
        assert node.api("GET", "/api/nodes/nobody@nowhere")[0] == 404
    env = {**os.environ, "WARREN_MANAGEMENT_URL": f"http://127.0.0.1:{cluster.followers()[0].management_port}",
           "WARREN_MANAGEMENT_USER": "guest", "WARREN_MANAGEMENT_PASSWORD": "guest"}
    status = subprocess.run([sys.executable, "-m", "warrenctl", "cluster_status", "--formatter", "json"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert sorted(name.split("@")[0] for name in json.loads(status.stdout)["running_nodes"]) == ["a", "b", "c"]


def test_a_follower_serves_the_console_and_refuses_a_host_it_does_not_know(cluster):
    cluster.ready()
    follower = cluster.followers()[0]
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    with urllib.request.urlopen(f"http://127.0.0.1:{follower.management_port}/", timeout=10) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
    status, refusal = follower.api("GET", "/api/overview", host="elsewhere.example")
    assert status == 403 and "Host header" in refusal["reason"]


def test_a_request_that_claims_to_come_from_another_node_must_bear_the_clusters_proof(cluster):
    leader = cluster.ready()
    follower = cluster.followers()[0]
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    for node, group in ((leader, "0"), (follower, "node")):  # a forward to the leader, and the leader's ask
        request = urllib.request.Request(
            f"http://127.0.0.1:{node.management_port}/api/nodes",
            headers={"Authorization": GUEST, "X-Warren-Group": group, "X-Warren-Proof": "0" * 64,
                     "X-Warren-Client": "10.9.9.9"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403
        assert "proof of the cluster's secret" in json.loads(refused.value.read())["reason"]


def test_every_node_answers_a_scrape_and_only_the_leader_reports_the_queues(tmp_path, etcd_endpoint):
    """As each RabbitMQ node reports what it runs: a follower its identity alone, so that a scrape of every node
    finds each up and counts each queue once."""
    cluster = Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint)
    for node in cluster.nodes.values():
        node.prometheus_port = free_port()
        node.config_path.write_text(node.config_path.read_text().replace(
            "[prometheus]\nport = 0\n", f"[prometheus]\nport = {node.prometheus_port}\n"))
    with cluster.running():
        leader = cluster.ready()
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", leader.port)) as connection:
            channel = connection.channel()
            channel.queue_declare("counted", durable=True)
            channel.basic_publish("", "counted", b"1")
        for node in cluster.nodes.values():
            with urllib.request.urlopen(f"http://127.0.0.1:{node.prometheus_port}/metrics/per-object",
                                        timeout=10) as response:
                text = response.read().decode()
            [identity] = [line for line in text.splitlines() if line.startswith("rabbitmq_identity_info{")]
            assert f'rabbitmq_node="{node.name}@' in identity
            assert ('queue="counted"' in text) is (node is leader), node.name


def test_an_operator_names_the_node_that_leads_through_any_node(cluster):
    """Every vhost lives in the cluster's one group: naming a vhost's leader names the cluster's."""
    leader = cluster.ready()
    first, second = cluster.followers()
    wait_for(lambda: second.api("GET", "/api/overview")[0] == 200, 30, f"{second.name}'s API")
    status, refusal = second.api("PUT", "/api/vhosts/%2F/leader", {"node": "nobody"})
    assert status == 400 and "not a member" in refusal["reason"]
    assert second.api("PUT", "/api/vhosts/%2F/leader", {"node": f"{first.name}@elsewhere"})[0] == 204
    wait_for(lambda: cluster.leader() is first, 30, f"{first.name} leading")
    state = wait_for(lambda: (answer := leader.api("GET", "/api/vhosts/%2F/leader"))[0] == 200 and answer[1], 30,
                     "the new leader's API through the old one")
    assert state == {"vhost": "/", "group": 0, "node": first.name, "pinned": first.name}
    assert leader.api("DELETE", "/api/vhosts/%2F/leader")[0] == 204
    assert first.api("GET", "/api/vhosts/%2F/leader")[1]["pinned"] is None
    cluster.ready()  # every node back in the ISR


def test_a_compressed_body_through_a_follower_is_answered_as_the_leader_answers_it(cluster):
    """A body goes to the leader as the client sent it, which reads it as RabbitMQ does: a gzip is not JSON."""
    cluster.ready()
    follower = cluster.followers()[0]
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    body = json.dumps({"durable": True}).encode()
    for layers in (1, 2):
        body = gzip.compress(body)
        request = urllib.request.Request(
            f"http://127.0.0.1:{follower.management_port}/api/queues/%2F/gzipped", data=body, method="PUT",
            headers={"Authorization": GUEST, "Content-Type": "application/json", "Content-Encoding": "gzip"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert (refused.value.code, json.loads(refused.value.read())) == (
            400, {"error": "bad_request", "reason": "not_json"})
    assert follower.api("GET", "/api/queues/%2F/gzipped")[0] == 404


def test_a_failover_costs_a_few_log_lines_however_fast_a_client_asks(cluster):
    """A client asking a follower's API as fast as it can while the leader is gone (killed, not yet replaced):
    every answer comes, and the follower's log takes at most 20 lines a second, not one per request."""
    leader = cluster.ready()
    follower = cluster.followers()[0]
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    before = len(follower.log().splitlines())
    leader.kill()
    started = time.monotonic()
    for _ in range(300):
        for user in ("guest:wrong", None):  # credentials the leader would check, and none at all
            headers = {"Authorization": "Basic " + base64.b64encode(user.encode()).decode()} if user else {}
            try:
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{follower.management_port}/api/overview", headers=headers), timeout=10)
            except urllib.error.HTTPError:
                pass
    took = time.monotonic() - started
    lines = follower.log().splitlines()[before:]
    assert len(lines) < 20 * (took + 2), f"{len(lines)} lines for 600 requests in {took:.1f} s:\n" + "\n".join(
        lines[-20:])
