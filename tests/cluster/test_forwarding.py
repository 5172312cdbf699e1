"""Any node of a cluster answers for the whole cluster, whether its nodes run one worker or two (the same code, in
two shapes: tests/cluster/shapes.py). A node forwards every client to the leader of its vhost's group, amqps ones
included (their TLS session ends at the node they reached, which tells the leader so in its PROXY v2 header, and the
leader shows them as RabbitMQ shows amqps connections), and every management API request to the API of the groups
it concerns, so that any node's API, console and warrenctl show and change the whole cluster, as any RabbitMQ
node's do. The tests of what a user sees the same way in both shapes run over both (the workers fixture)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import re
import ssl
import time
import urllib.error
import urllib.request
import uuid
from types import SimpleNamespace

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.netns import Place
from tests.cluster.nodes import LEASE_TTL, Cluster, wait_for
from tests.cluster.shapes import (Nodes, api, api_ready, connect, drained, in_path, publish_confirmed, three_nodes,
                                  warrenctl)
from tests.mqtt.clients import Client as MqttClient
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.slow

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
ALL_RIGHTS = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture(params=[1, 2], ids=["1-worker", "2-workers"])
def workers(request) -> int:
    """The workers of each node: one (one group, every vhost in it), or two (the vhosts "one" and "two" in groups 0
    and 1, led by different nodes)."""
    return request.param


@pytest.fixture
def shaped(tmp_path, etcd_endpoint, workers, request):
    """Three nodes of ``workers`` workers, started; their logs printed should the test fail."""
    failed = request.session.testsfailed
    with three_nodes(tmp_path, etcd_endpoint, workers) as nodes:
        yield nodes
        if request.session.testsfailed > failed:
            print(nodes.cluster.logs())


def test_any_nodes_management_api_shows_and_changes_every_group(shaped: Nodes):
    """Users, permissions, vhosts and queues made through one node are shown through another, wherever the group of
    each vhost is led; the credentials are the leader's to check, whichever node is asked."""
    cluster, vhosts = shaped.cluster, shaped.vhosts
    led = shaped.leaders()
    last = len(led) - 1  # alice's vhost's group ("/" in the one group, or "two" in group 1)
    elsewhere = next(node for node in "abc" if node not in led)  # a node that leads no group
    through = next(node for node in "abc" if node not in (elsewhere, led[last]))  # it forwards alice to led[last]
    api_ready(cluster)
    assert api(cluster, elsewhere, "PUT", "/api/users/alice", {"password": "secret", "tags": "management"})[0] == 201
    assert api(cluster, elsewhere, "PUT", f"/api/permissions/{in_path(vhosts[last])}/alice", ALL_RIGHTS)[0] == 201
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.nodes[through].port, vhosts[last], pika.PlainCredentials("alice", "secret"),
            connection_attempts=50, retry_delay=0.2)) as connection:
        publish_confirmed(connection, "alice's", [b"hello"])  # the group's leader knows alice
        status, connections = api(cluster, through, "GET", "/api/connections?columns=user,peer_host,port",
                                  user="alice:secret")
        assert (status, connections) == (200, [
            {"user": "alice", "peer_host": "127.0.0.1", "port": cluster.nodes[through].port}])
    expected = {(vhosts[last], "alice's"): shaped.worker(led[last], last)}
    for group, vhost in enumerate(vhosts[:last]):  # (two groups: group 0's vhost, through group 1's leader)
        with connect(cluster, led[last], vhost) as connection:
            publish_confirmed(connection, "guest's", [b"hello"])
        expected[(vhost, "guest's")] = shaped.worker(led[group], group)
    status, queues = api(cluster, elsewhere, "GET", "/api/queues")
    assert status == 200
    assert {(queue["vhost"], queue["name"]): queue["node"].split("@")[0] for queue in queues} == expected
    status, queue = api(cluster, through, "GET", f"/api/queues/{in_path(vhosts[last])}/alice's")
    assert (status, queue["messages"], queue["node"].split("@")[0]) == (200, 1, shaped.worker(led[last], last))
    status, listed = api(cluster, led[last], "GET", "/api/vhosts")
    assert (status, sorted(vhost["name"] for vhost in listed)) == (200, sorted({"/", *vhosts}))
    assert api(cluster, led[last], "PUT", "/api/vhosts/three")[0] == 201  # its creator may use it
    with connect(cluster, elsewhere, "three") as connection:
        publish_confirmed(connection, "made through the API", [b"hello"])
    assert api(cluster, elsewhere, "GET", "/api/queues/three")[1][0]["name"] == "made through the API"
    assert api(cluster, elsewhere, "GET", "/api/overview", user="alice:wrong")[0] == 401
    assert api(cluster, through, "DELETE", "/api/users/alice")[0] == 204
    assert api(cluster, elsewhere, "GET", "/api/overview", user="alice:secret")[0] == 401
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.nodes[led[last]].port, vhosts[last], pika.PlainCredentials("alice", "secret")))


def test_any_nodes_api_lists_every_worker_of_every_node_until_one_that_left_is_forgotten(shaped: Nodes):
    """/api/nodes on any node, and warrenctl cluster_status, list each node's workers (a node of one worker as the
    node itself), leading their group or following (a node per worker, as RabbitMQ lists every node of its
    cluster); a node killed stays in the list, as not running, until warrenctl forget_cluster_node forgets it (as
    rabbitmqctl's does: only a node that is down, and here out of every group's in-sync replicas), and its
    maintenance with it."""
    cluster = shaped.cluster
    led = shaped.leaders()
    last = len(led) - 1
    elsewhere = next(node for node in "abc" if node not in led)  # a node that leads no group
    api_ready(cluster)
    with connect(cluster, elsewhere, shaped.vhosts[last]) as connection:
        publish_confirmed(connection, "listed", [b"hello"])

    every = sorted(shaped.worker(node, group) for node in "abc" for group in range(shaped.workers))
    for node in "abc":
        # (a node that cannot answer yet, as before it knows the cluster's secret, is listed as not running)
        nodes = wait_for(lambda: (found := listed(cluster, node)) and list(found) == every
                         and all(entry["running"] for entry in found.values()) and found, 30,
                         f"every worker of every node listed by {node}, in order, running")
        assert len({entry["os_pid"] for entry in nodes.values()}) == len(every)
        follower = nodes[shaped.worker(elsewhere, last)]  # a worker that leads nothing, asked for by name
        status, entry = api(cluster, node, "GET", f"/api/nodes/{follower['name']}")
        assert (status, entry["name"], entry["running"], entry["os_pid"]) == (
            200, follower["name"], True, follower["os_pid"])
        assert api(cluster, node, "GET", "/api/nodes/nobody@nowhere")[0] == 404
    queue = api(cluster, elsewhere, "GET", f"/api/queues/{in_path(shaped.vhosts[last])}/listed")[1]
    assert queue["node"].split("@")[0] == shaped.worker(led[last], last)
    assert nodes[shaped.worker(led[last], last)]["name"] == queue["node"]
    assert api(cluster, led[0], "GET", "/api/nodes", user="nobody:wrong")[0] == 401
    status = warrenctl(cluster, elsewhere, "cluster_status", "--formatter", "json")
    assert status.returncode == 0, status.stderr
    assert [name.split("@")[0] for name in json.loads(status.stdout)["running_nodes"]] == every
    drained = warrenctl(cluster, elsewhere, "drain")  # (it leads nothing: at once) and forgetting it revives it
    assert drained.returncode == 0, drained.stderr
    cluster.nodes[elsewhere].kill()
    rest = [name for name in every if not name.startswith(elsewhere)]
    wait_for(lambda: (found := listed(cluster, led[0])) and [name for name in found if found[name]["running"]] == rest,
             30, f"{elsewhere}'s workers listed as not running")
    assert list(listed(cluster, led[0])) == every
    status = warrenctl(cluster, led[0], "cluster_status", "--formatter", "json")
    shown = json.loads(status.stdout)
    assert [name.split("@")[0] for name in shown["disk_nodes"]] == every
    assert [name.split("@")[0] for name in shown["running_nodes"]] == rest

    running = next(node for node in "abc" if node not in (elsewhere, led[0]))
    for node, reason in ((running, f"node {running} is running"), (led[0], f"node {led[0]} is this node")):
        status, error = api(cluster, led[0], "DELETE", f"/api/nodes/{nodes[shaped.worker(node, 0)]['name']}")
        assert (status, error["error"]) == (400, "bad_request"), error
        assert reason in error["reason"]
    assert api(cluster, led[0], "DELETE", f"/api/nodes/{elsewhere}", user="nobody:wrong")[0] == 401
    assert list(listed(cluster, led[0])) == every  # (the refusals forgot nothing)
    gone = nodes[shaped.worker(elsewhere, 0)]["name"]
    # (refused while a group's leader keeps the killed node in sync: until it has missed ack_timeout's heartbeats)
    forgot = wait_for(lambda: warrenctl(cluster, led[0], "forget_cluster_node", gone), 30, f"{gone} forgotten",
                      step=0.2, until=lambda done: done.returncode == 0)
    assert forgot.stdout == f"Removing node {gone} from the cluster\n"
    for node in (led[0], running):  # every node's list, as each reads etcd
        wait_for(lambda: listed(cluster, node) is not None and list(listed(cluster, node)) == rest, 30,
                 f"{elsewhere}'s workers no longer listed by {node}")
    shown = json.loads(warrenctl(cluster, running, "cluster_status", "--formatter", "json").stdout)
    assert [name.split("@")[0] for name in shown["disk_nodes"]] == rest
    refused = warrenctl(cluster, led[0], "forget_cluster_node", gone)
    assert (refused.returncode, refused.stderr.splitlines()[0]) == (
        65, "Error: The node selected is not in the cluster."), refused
    cluster.nodes[elsewhere].start()  # started again, it joins again
    found = wait_for(lambda: (found := listed(cluster, running)) and list(found) == every
                     and all(entry["running"] for entry in found.values()) and found, 30,
                     f"{elsewhere} listed again, running")
    assert not any(found[shaped.worker(elsewhere, group)]["being_drained"] for group in range(shaped.workers))
    connect(cluster, elsewhere, shaped.vhosts[0]).close()  # (it takes clients: not in maintenance)


def test_a_request_between_nodes_counts_only_when_proven(shaped: Nodes):
    """A request that says it comes from another node (for a group: a forward to its leader; for the node itself:
    a node's ask for its entries in /api/nodes) is refused without the proof of the cluster's secret, with or
    without a client's credentials, and does nothing."""
    cluster = shaped.cluster
    led = shaped.leaders()
    elsewhere = next(node for node in "abc" if node not in led)  # a node that leads no group
    api_ready(cluster)
    asked = [*((node, str(group)) for group, node in enumerate(led)), (elsewhere, "node")]
    for node, group in asked:
        port = cluster.nodes[node].management_port
        for request in (
                urllib.request.Request(f"http://127.0.0.1:{port}/api/nodes", headers={
                    "Authorization": GUEST, "X-Warren-Group": group, "X-Warren-Proof": "0" * 64,
                    "X-Warren-Client": "10.9.9.9"}),
                urllib.request.Request(f"http://127.0.0.1:{port}/api/users/mallory", method="PUT",
                                       data=b'{"password": "x", "tags": "administrator"}', headers={
                                           "X-Warren-Group": group, "X-Warren-Proof": "0" * 64,
                                           "Content-Type": "application/json"})):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 403, (node, group, request.full_url)
            assert "proof of the cluster's secret" in json.loads(refused.value.read())["reason"]
        assert api(cluster, node, "GET", "/api/users/mallory")[0] == 404


def metrics(cluster: Cluster, node: str) -> str:
    """The text of a node's Prometheus endpoint, per object."""
    port = cluster.nodes[node].prometheus_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/per-object", timeout=10) as response:
        return response.read().decode()


def queue_messages(text: str) -> dict[tuple[str, str], float]:
    """(vhost, queue) -> ready messages, as a Prometheus text reports them."""
    return {(sample.labels["vhost"], sample.labels["queue"]): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "rabbitmq_queue_messages_ready"}


def test_a_nodes_metrics_are_those_of_the_groups_it_leads(tmp_path, etcd_endpoint, workers):
    """As each RabbitMQ node reports what it runs: every node its identity, and the queues of the groups it leads
    alone (a node that leads none, none), so that a scrape of every node finds each up and counts each queue once."""
    with three_nodes(tmp_path, etcd_endpoint, workers, prometheus=True) as nodes:
        cluster = nodes.cluster
        led = nodes.leaders()
        api_ready(cluster)  # (the metrics listen from the same time on)
        for group, (node, vhost) in enumerate(zip(led, nodes.vhosts)):
            with connect(cluster, node, vhost) as connection:  # group k's queue: k + 1 messages
                publish_confirmed(connection, "counted", [b"%d" % each for each in range(group + 1)])
        for node in "abc":
            text = metrics(cluster, node)
            [identity] = [line for line in text.splitlines() if line.startswith("rabbitmq_identity_info{")]
            [named] = re.findall(r'rabbitmq_node="([^"@]*)@', identity)  # (with two: a worker it leads by, or 0)
            assert named in {nodes.worker(node, group) for group in range(workers)}, identity
            assert queue_messages(text) == {(vhost, "counted"): group + 1 for group, (leader, vhost)
                                            in enumerate(zip(led, nodes.vhosts)) if leader == node}, node
            assert ('queue="counted"' in text) is (node in led), node


def test_an_operator_moves_a_vhosts_leadership_to_another_node(shaped: Nodes):
    """Through any node's API or warrenctl, naming the node bare or as name@host: the vhost's group (with nodes of
    one worker, the cluster) is led there, with its messages, and no other group moves."""
    cluster, observers = shaped.cluster, shaped.observers
    led = shaped.leaders()
    group = len(led) - 1
    vhost = shaped.vhosts[group]
    api_ready(cluster)
    with connect(cluster, led[group], vhost) as connection:
        publish_confirmed(connection, "orders", [b"before"])
    # a node that leads no group (leading two, it would hand one over once the pin is cleared, as leaders are spread)
    target = next(node for node in "abc" if node not in led)
    asking = next(node for node in "abc" if node not in (target, led[group]))
    status, refusal = api(cluster, asking, "PUT", f"/api/vhosts/{in_path(vhost)}/leader", {"node": "nobody"})
    assert (status, refusal["reason"]) == (400, "node 'nobody' is not a member of the cluster now (members: a, b, c)")
    status, refusal = api(cluster, asking, "PUT", f"/api/vhosts/{in_path(vhost)}/group", {"group": 0})
    assert (status, refusal["reason"]) == (400, (  # (its data does not move: moving its leader is what there is)
        "a vhost of a cluster stays in the group it was recorded in: it does not move between groups; choose the "
        "node that leads its group instead (PUT .../leader)"))
    wait_for(lambda: api(cluster, asking, "PUT", f"/api/vhosts/{in_path(vhost)}/leader",
                         {"node": f"{target}@elsewhere"})[0] == 204, 30,
             f"{target} accepted as group {group}'s leader (once it holds an in-sync copy)", step=0.2)
    wait_for(lambda: (observers[group].leader() or ("",))[0] == target, 30, f"group {group} led by {target}")
    assert [observer.leader()[0] for observer in observers[:group]] == led[:group], "the other group stays"
    state = wait_for(lambda: (answer := api(cluster, led[group], "GET", f"/api/vhosts/{in_path(vhost)}/leader"))[0]
                     == 200 and answer[1], 30, "the new leader's API through the old one")
    assert state == {"vhost": vhost, "group": group, "node": target, "pinned": target}
    wait_for(lambda: warrenctl(cluster, asking, "set_vhost_leader", target, "-p", vhost).returncode == 0, 30,
             f"warrenctl set_vhost_leader {target} (led there already)", step=0.2)
    with connect(cluster, led[group], vhost) as connection:
        assert drained(connection, "orders") == [b"before"]
    assert api(cluster, led[group], "DELETE", f"/api/vhosts/{in_path(vhost)}/leader")[0] == 204
    assert api(cluster, target, "GET", f"/api/vhosts/{in_path(vhost)}/leader")[1]["pinned"] is None
    assert warrenctl(cluster, "b", "clear_vhost_leader", "-p", vhost).returncode == 0
    assert api(cluster, "b", "GET", f"/api/vhosts/{in_path(vhost)}/leader")[1]["pinned"] is None
    wait_for(lambda: sorted(observers[group].isr() or []) == ["a", "b", "c"], 30, "every node back in the ISR")


@pytest.mark.parametrize("workers, between_nodes", [(1, False), (2, False), (2, True)],
                         ids=["1-worker", "2-workers", "2-workers-tls-between-nodes"])
def test_amqps_and_the_api_over_https_reach_every_group_through_every_node(tmp_path, etcd_endpoint, workers,
                                                                          between_nodes):
    """The TLS session ends at the front door that accepted the client, whichever worker or node leads its vhost,
    and the client is shown as amqps, with the port it connected to; a node's API asks the others' over HTTPS.
    With TLS between the nodes too ([cluster] tls), a client forwarded to another node is shown as it spoke to the
    node it reached, whatever the link between the nodes."""
    certificates = make_certificates(tmp_path / "certs")
    context = ssl.create_default_context(cafile=certificates.path("ca.pem"))
    with three_nodes(tmp_path, etcd_endpoint, workers, certificates, between_nodes=between_nodes) as nodes:
        cluster = nodes.cluster
        led = nodes.leaders()
        for vhost in nodes.vhosts:
            for name, node in cluster.nodes.items():
                with pika.BlockingConnection(pika.ConnectionParameters(
                        "127.0.0.1", node.tls_port, vhost, ssl_options=pika.SSLOptions(context, "localhost"),
                        connection_attempts=50, retry_delay=0.2)) as connection:
                    publish_confirmed(connection, "secret", [f"{vhost} through {name}".encode()])
        idle = next(name for name in "abc" if name not in led)  # a node that leads no group
        request = urllib.request.Request(f"https://127.0.0.1:{cluster.nodes[idle].management_port}/api/queues",
                                         headers={"Authorization": GUEST})
        queues = wait_for(lambda: https_json(request, context, len(nodes.vhosts)), 30,
                          "the API over HTTPS through every group")
        assert {(queue["vhost"], queue["messages"]) for queue in queues} == {(vhost, 3) for vhost in nodes.vhosts}
        listing = urllib.request.Request(
            f"https://127.0.0.1:{cluster.nodes[idle].management_port}/api/connections?columns=vhost,port,ssl",
            headers={"Authorization": GUEST})
        # a client forwarded to another node is shown there as amqps too (the PROXY v2 header says so), with the
        # port it connected to: the leader's own, or that of the node that forwarded it
        with contextlib.ExitStack() as open_connections:
            for vhost in nodes.vhosts:
                for node in cluster.nodes.values():
                    open_connections.enter_context(pika.BlockingConnection(pika.ConnectionParameters(
                        "127.0.0.1", node.tls_port, vhost, ssl_options=pika.SSLOptions(context, "localhost"))))
            with urllib.request.urlopen(listing, timeout=10, context=context) as response:
                shown = json.loads(response.read())
        assert sorted((connection["vhost"], connection["port"], connection["ssl"]) for connection in shown) == sorted(
            (vhost, node.tls_port, True) for vhost in nodes.vhosts for node in cluster.nodes.values())
        with contextlib.ExitStack() as open_connections:  # plain clients, through every node
            for vhost in nodes.vhosts:
                for name in cluster.nodes:
                    open_connections.enter_context(connect(cluster, name, vhost))
            with urllib.request.urlopen(listing, timeout=10, context=context) as response:
                shown = json.loads(response.read())
        assert sorted((connection["vhost"], connection["port"], connection["ssl"]) for connection in shown) == sorted(
            (vhost, node.port, False) for vhost in nodes.vhosts for node in cluster.nodes.values())
        for group, vhost in enumerate(nodes.vhosts):
            with connect(cluster, led[group], vhost) as connection:  # the leader's own port counts them too
                channel = connection.channel()
                assert channel.queue_declare("secret", durable=True, passive=True).method.message_count == 3
            with connect(cluster, "a", vhost) as connection:
                assert sorted(drained(connection, "secret")) == [f"{vhost} through {name}".encode() for name in "abc"]


def https_json(request: urllib.request.Request, context: ssl.SSLContext, vhosts: int):
    """The JSON of a request over HTTPS once it answers 200 with queues of every group's vhost; None before."""
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            queues = json.loads(response.read())
    except (urllib.error.URLError, OSError):
        return None
    return queues if len({queue["vhost"] for queue in queues}) == vhosts else None


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


def test_a_follower_serves_the_console_and_refuses_a_host_it_does_not_know(cluster):
    cluster.ready()
    follower = cluster.followers()[0]
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    with urllib.request.urlopen(f"http://127.0.0.1:{follower.management_port}/", timeout=10) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
    status, refusal = follower.api("GET", "/api/overview", host="elsewhere.example")
    assert status == 403 and "Host header" in refusal["reason"]


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

    def status(user: str | None) -> int:
        headers = {"Authorization": "Basic " + base64.b64encode(user.encode()).decode()} if user else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{follower.management_port}/api/overview", headers=headers), timeout=10) as ok:
                return ok.status
        except urllib.error.HTTPError as error:
            return error.code

    leader.kill()
    started = time.monotonic()
    answers = []
    for _ in range(300):
        answers.append(status("guest:wrong"))  # credentials the leader would check
        if answers[-1] == 401:  # a new leader refuses them: the failover is over, and each further refusal from this
            break  # address is answered more slowly (failed_login_delay), as on any node
        answers.append(status(None))  # and none at all
    took = time.monotonic() - started
    # asked while no node could check the credentials: answered 503 (the dead leader still named, or no leader for
    # a whole lease), or held until the new leader answered (a request waits for one, at most a lease)
    assert 503 in answers or (len(answers) == 1 and took >= LEASE_TTL / 2), (answers, took)
    lines = follower.log().splitlines()[before:]
    assert len(lines) < 20 * (took + 2), f"{len(lines)} lines for {len(answers)} requests in {took:.1f} s:\n" + \
        "\n".join(lines[-20:])


def listed(cluster: Cluster, node: str) -> dict[str, dict] | None:
    """What a node's /api/nodes lists, by name (before its @host) in its order; None if it did not answer. A node
    lists the others as etcd had them at its last look (every lease_ttl / 2): one just started may be missing yet."""
    status, nodes = api(cluster, node, "GET", "/api/nodes")
    return {entry["name"].split("@")[0]: entry for entry in nodes} if status == 200 else None


def refused_at_once(cluster: Cluster, node: str, vhost: str) -> bool:
    """Whether a client of the node's AMQP port is dropped before its handshake ends."""
    try:
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.nodes[node].port, vhost,
                                                          connection_attempts=1, socket_timeout=5)).close()
    except pika.exceptions.AMQPConnectionError:
        return True
    return False


def test_a_drained_node_takes_no_client_and_leads_no_group_until_revived(shaped: Nodes):
    """warrenctl drain on the node leading the first group: every group is led elsewhere, the node's clients are
    closed and a new one is dropped as by a closed port, while the other nodes serve every vhost; revived, it takes
    clients again."""
    cluster = shaped.cluster
    target = shaped.leaders()[0]
    other = next(node for node in "abc" if node != target)
    api_ready(cluster)
    every = sorted(shaped.worker(node, group) for node in "abc" for group in range(shaped.workers))
    wait_for(lambda: list(listed(cluster, other) or {}) == every, 30, f"every node listed by {other}")
    held = connect(cluster, target, shaped.vhosts[0])
    done = warrenctl(cluster, target, "drain")
    assert done.returncode == 0, done.stderr
    assert all(observer.leader()[0] != target for observer in shaped.observers)
    status = warrenctl(cluster, other, "cluster_status", "--formatter", "json")
    assert {name.split("@")[0]: state for name, state in json.loads(status.stdout)["maintenance_status"].items()} == {
        shaped.worker(node, group): "under maintenance" if node == target else "not under maintenance"
        for node in "abc" for group in range(shaped.workers)}
    with pytest.raises(pika.exceptions.AMQPError):  # closed: its node leads nothing now
        held.channel().queue_declare("", exclusive=True)
    for vhost in shaped.vhosts:
        assert refused_at_once(cluster, target, vhost)
        connect(cluster, other, vhost).close()
    done = warrenctl(cluster, target, "revive")
    assert done.returncode == 0, done.stderr
    connect(cluster, target, shaped.vhosts[0]).close()


def test_mqtt_clients_of_any_node_meet_at_their_vhosts_leader(shaped: Nodes):
    """MQTT clients are forwarded as AMQP ones are: in the vhost of each group, a subscriber on a node that does not
    lead it (over a WebSocket) and a publisher on a third node meet at the group's leader, which shows them as
    connections of its own (the subscriber as a Web MQTT one)."""
    cluster = shaped.cluster
    led = shaped.leaders()
    for group, vhost in enumerate(shaped.vhosts):
        subscribing = next(node for node in "abc" if node != led[group])
        publishing = next(node for node in "abc" if node not in (led[group], subscribing))
        login = {"username": f"{vhost}:guest" if vhost != "/" else "guest", "password": "guest"}
        subscriber = mqtt_client(cluster, subscribing, f"sub-{group}", login, websocket=True)
        try:
            subscriber.subscribe(f"orders/{group}/+", qos=1)
            publisher = mqtt_client(cluster, publishing, f"pub-{group}", login)
            publisher.publish(f"orders/{group}/new", b"through two nodes", qos=1)
            publisher.disconnect()
            message = subscriber.receive()
            assert (message.topic, message.payload) == (f"orders/{group}/new", b"through two nodes")
            def mqtt_connections() -> list:
                return [(c["client_properties"]["client_id"], c["vhost"], c["protocol"])
                        for c in api(cluster, led[group], "GET", "/api/connections")[1]
                        if c["protocol"].endswith("MQTT 3.1.1")]
            # (the publisher's DISCONNECT crosses two nodes: the leader drops its connection a moment later; the
            # subscriber's node told the leader it came over a WebSocket)
            wait_for(mqtt_connections, 10, "the subscriber, alone, at the leader",
                     until=lambda listed: listed == [(f"sub-{group}", vhost, "Web MQTT 3.1.1")])
        finally:
            subscriber.disconnect()


def mqtt_client(cluster: Cluster, node: str, client_id: str, login: dict, websocket: bool = False) -> MqttClient:
    """An MQTT client of node (over a WebSocket: of its web_port), connected once the node knows where its vhost is
    led (until then it is told to come again, with CONNACK 3)."""
    where = cluster.nodes[node]
    transport = {"port": where.mqtt_web_port, "transport": "websockets"} if websocket else {}

    def attempt() -> MqttClient | None:
        client = MqttClient(SimpleNamespace(mqtt_port=where.mqtt_port), client_id, **login, **transport)
        try:
            client.connect(expect_success=False)
        except ConnectionRefusedError:  # (its doors open once all its workers serve)
            return None
        if client.connack is not None and not client.connack[1].is_failure:
            return client
        client.paho.loop_stop()
        return None
    return wait_for(attempt, 30, f"an MQTT client of node {node} connected", step=0.2)
