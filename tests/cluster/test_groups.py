"""Three nodes of two workers each: worker k of every node is a member of replication group k, and vhosts pinned to
the two groups are led by different nodes. A client reaches its vhost through any node's AMQP port; losing the
node that leads one group moves that group's vhosts alone, with nothing confirmed lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.workers.placement import worker_data_dir
from tests.cluster.nodes import Cluster, Node, Observer, wait_for
from tests.conftest import REPO_ROOT, free_port
from tests.tls_certs import make_certificates

pytestmark = pytest.mark.slow

TABLES = "\n".join(
    f'[[vhosts]]\nname = "{name}"\nworker = {group}\n'
    f'[[permissions]]\nuser = "guest"\nvhost = "{name}"\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
    for name, group in (("one", 0), ("two", 1)))


@contextlib.contextmanager
def two_groups(tmp_path, etcd_endpoint, certificates=None, hostnames: dict[str, list[str]] | None = None,
               between_nodes: bool = False) -> Iterator[tuple[Cluster, list[Observer]]]:
    """Three nodes of two workers (with an amqps port each, and the management API over HTTPS, when given
    certificates, and TLS between the nodes too with between_nodes; with the management hostnames given of a
    node), and an observer of each group's keys; their logs printed should the test fail."""
    name = f"t{uuid.uuid4().hex[:10]}"
    cluster = Cluster(tmp_path, name, etcd_endpoint, workers=2, tables=TABLES)
    for node, names in (hostnames or {}).items():
        config = cluster.nodes[node].config_path
        names_line = f"hostnames = {json.dumps(names)}\n"
        config.write_text(config.read_text().replace("[management]\n", "[management]\n" + names_line))
    certificate = "node" if between_nodes else "server"  # (a node's is a client's too)
    for node in cluster.nodes.values() if certificates is not None else ():
        node.tls_port = free_port()
        text = node.config_path.read_text().replace("[management]\n", "[management]\ntls = true\n")
        if between_nodes:
            text = text.replace("[cluster]\n", "[cluster]\ntls = true\n")
        node.config_path.write_text(text + f'[tls]\ncertfile = "{certificates.path(f"{certificate}.pem")}"\n'
                                    f'keyfile = "{certificates.path(f"{certificate}.key")}"\nport = {node.tls_port}\n'
                                    f'cacertfile = "{certificates.path("ca.pem")}"\n')
    observers = [cluster.observer, Observer(etcd_endpoint, name, group=1)]
    cluster.start()
    try:
        yield cluster, observers
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
        observers[1].close()


@pytest.fixture
def grouped(tmp_path, etcd_endpoint, request):
    failed = request.session.testsfailed
    with two_groups(tmp_path, etcd_endpoint) as (cluster, observers):
        yield cluster, observers
        if request.session.testsfailed > failed:
            print(cluster.logs())


def leaders(observers: list[Observer]) -> list[str] | None:
    """The node leading each group, once both have one and they are different nodes (leaders are spread)."""
    found = [observer.leader() for observer in observers]
    nodes = None if None in found else [leader[0] for leader in found]
    return nodes if nodes is not None and len(set(nodes)) == len(nodes) else None


def connect(cluster: Cluster, node: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[node].port, vhost, connection_attempts=50, retry_delay=0.2, socket_timeout=5))


def publish_confirmed(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def drained(connection: pika.BlockingConnection, queue: str) -> list[bytes]:
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append(got[2])
    return bodies


def test_the_groups_are_led_by_different_nodes_and_every_node_reaches_both(grouped):
    cluster, observers = grouped
    wait_for(lambda: leaders(observers), 30, "a leader in each group, on different nodes")
    for vhost in ("one", "two"):
        sent = [f"{vhost} through {node}".encode() for node in "abc"]
        for node, body in zip("abc", sent):
            with connect(cluster, node, vhost) as connection:
                publish_confirmed(connection, "orders", [body])
        for node in "abc":  # each node's front door reaches the one queue, wherever its group is led
            with connect(cluster, node, vhost) as connection:
                channel = connection.channel()
                assert channel.queue_declare("orders", durable=True, passive=True).method.message_count == 3
        with connect(cluster, "c", vhost) as connection:
            assert sorted(drained(connection, "orders")) == sorted(sent)


def test_a_wrong_password_is_refused_with_403_by_the_leader(grouped):
    """The front door checks no login: the group's leader refuses it, after connection.open (pika then says
    ProbableAccessDeniedError where it says ProbableAuthenticationError for a refusal after start-ok)."""
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    forwarded = next(node for node in "abc" if node != led[1])  # a node that forwards the client to another
    connect(cluster, forwarded, "two").close()  # once it knows where to
    parameters = pika.ConnectionParameters("127.0.0.1", cluster.nodes[forwarded].port, "two",
                                           pika.PlainCredentials("guest", "wrong"))
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(parameters)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(refused.value)


def test_losing_the_node_that_leads_a_group_moves_that_groups_vhosts_alone(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    with connect(cluster, led[1], "two") as connection:
        publish_confirmed(connection, "orders", [b"before"])
    staying = connect(cluster, led[0], "one")  # connected where group 0 is led: the kill does not touch it
    publish_confirmed(staying, "orders", [b"one before"])
    cluster.nodes[led[1]].kill()
    moved = wait_for(lambda: (found := observers[1].leader()) and found[0] != led[1] and found[0], 30,
                     "a new leader of group 1")
    assert observers[0].leader()[0] == led[0], "group 0 kept its leader"
    publish_confirmed(staying, "orders", [b"one after"])  # the same connection, open throughout
    assert sorted(drained(staying, "orders")) == [b"one after", b"one before"]
    staying.close()
    survivor = next(node for node in "abc" if node != led[1])
    with connect(cluster, survivor, "two") as connection:
        assert drained(connection, "orders") == [b"before"]


def test_an_unclean_election_of_group_1_alone_once_every_copy_of_it_is_lost(grouped):
    """Every node's copy of group 1 lost at once (worker 1's data dir wiped on each): group 1 cannot elect, and its
    workers say how to force it, while group 0 serves on; force-leader --group 1 on node a has a lead group 1."""
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    with connect(cluster, led[0], "one") as connection:
        publish_confirmed(connection, "kept", [b"group 0's"])
    wait_for(lambda: len(observers[1].isr() or []) == 3, 30, "every node's copy of group 1 in sync")
    for node in cluster.nodes.values():
        node.kill()
        shutil.rmtree(worker_data_dir(node.data_dir, 1))
    for node in cluster.nodes.values():
        node.start()
    wait_for(lambda: all("force-leader --config FILE --group 1" in node.log() for node in cluster.nodes.values()),
             30, "every node saying how to force group 1's election")
    wait_for(lambda: observers[0].leader(), 30, "group 0 led again")
    with connect(cluster, "b", "one") as connection:
        assert drained(connection, "kept") == [b"group 0's"]
    assert observers[1].leader() is None

    def force(node: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cluster", "force-leader", "--config",
                               str(cluster.nodes[node].config_path), "--group", "1"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    forced = force("a")
    assert forced.returncode == 0, forced.stderr
    assert "the in-sync replicas of group 1 are now a" in forced.stdout
    wait_for(lambda: (found := observers[1].leader()) and found[0] == "a", 30, "node a leading group 1")
    with connect(cluster, "c", "two") as connection:
        publish_confirmed(connection, "after", [b"group 1's again"])
    refused = force("b")
    assert refused.returncode == 1 and "a node leads group 1" in refused.stderr


def test_a_node_that_runs_another_number_of_workers_is_refused(grouped, tmp_path, etcd_endpoint):
    cluster, observers = grouped
    wait_for(lambda: leaders(observers), 30, "a leader in each group")
    other = Node(tmp_path, "d", cluster.name, etcd_endpoint, workers=3)
    other.start()
    assert other.process.wait(30) == 1
    assert ("the cluster's nodes run 2 workers each, and this node's config says 3: every node must run the same "
            "number") in other.log()


def api(cluster: Cluster, node: str, method: str, path: str, body: dict | None = None, user: str = "guest:guest",
        host: str | None = None):
    """(status, JSON or None) of a request to a node's management API (host: the Host header, if not its address)."""
    return cluster.nodes[node].api(method, path, body, user, host)


def warrenctl(cluster: Cluster, node: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WARREN_MANAGEMENT_URL": f"http://127.0.0.1:{cluster.nodes[node].management_port}",
           "WARREN_MANAGEMENT_USER": "guest", "WARREN_MANAGEMENT_PASSWORD": "guest"}
    return subprocess.run([sys.executable, "-m", "warrenctl", *argv], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def api_ready(cluster: Cluster) -> None:
    """Wait until every node's API reaches every group."""
    for node in "abc":
        wait_for(lambda: api(cluster, node, "GET", "/api/vhosts")[0] == 200, 30, f"{node}'s API through every group")


def test_any_nodes_management_api_shows_and_changes_every_group(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    elsewhere = next(node for node in "abc" if node not in led)  # a node that leads neither group
    api_ready(cluster)
    assert api(cluster, elsewhere, "PUT", "/api/users/alice", {"password": "secret", "tags": "management"})[0] == 201
    assert api(cluster, elsewhere, "PUT", "/api/permissions/two/alice",
               {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.nodes[led[0]].port, "two", pika.PlainCredentials("alice", "secret"),
            connection_attempts=50, retry_delay=0.2)) as connection:
        publish_confirmed(connection, "alice's", [b"hello"])  # group 1's leader knows alice
    with connect(cluster, led[1], "one") as connection:
        publish_confirmed(connection, "guest's", [b"hello"])
    status, queues = api(cluster, elsewhere, "GET", "/api/queues")
    assert status == 200
    shown = {(queue["vhost"], queue["name"]): queue["node"].split("@")[0] for queue in queues}
    assert shown == {("one", "guest's"): f"{led[0]}-0", ("two", "alice's"): f"{led[1]}-1"}
    assert api(cluster, elsewhere, "GET", "/api/queues/two/alice's")[1]["messages"] == 1
    status, vhosts = api(cluster, led[1], "GET", "/api/vhosts")
    assert sorted(vhost["name"] for vhost in vhosts) == ["/", "one", "two"]
    assert api(cluster, led[1], "PUT", "/api/vhosts/three")[0] == 201  # its creator may use it
    with connect(cluster, elsewhere, "three") as connection:
        publish_confirmed(connection, "made through the API", [b"hello"])
    assert api(cluster, elsewhere, "GET", "/api/queues/three")[1][0]["name"] == "made through the API"
    assert api(cluster, elsewhere, "DELETE", "/api/users/alice")[0] == 204
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", cluster.nodes[led[1]].port, "two", pika.PlainCredentials("alice", "secret")))


def test_any_nodes_api_lists_every_worker_of_every_node(grouped):
    """/api/nodes on any node lists each node's workers, leading their group or following (a node per worker, as
    RabbitMQ lists every node of its cluster); a node that leaves the cluster leaves the list."""
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    elsewhere = next(node for node in "abc" if node not in led)
    api_ready(cluster)
    with connect(cluster, elsewhere, "two") as connection:
        publish_confirmed(connection, "listed", [b"hello"])

    def listed(node: str) -> dict[str, dict] | None:
        status, nodes = api(cluster, node, "GET", "/api/nodes")
        return {entry["name"].split("@")[0]: entry for entry in nodes} if status == 200 else None

    every = {f"{node}-{worker}" for node in "abc" for worker in (0, 1)}
    nodes = wait_for(lambda: (found := listed(elsewhere)) and set(found) == every and found, 30,
                     "every worker of every node listed")
    assert all(entry["running"] for entry in nodes.values())
    assert len({entry["os_pid"] for entry in nodes.values()}) == 6
    queue = api(cluster, elsewhere, "GET", "/api/queues/two/listed")[1]
    assert queue["node"].split("@")[0] == f"{led[1]}-1"
    assert nodes[f"{led[1]}-1"]["name"] == queue["node"]
    follower = nodes[f"{elsewhere}-1"]["name"]  # a worker that leads nothing, asked for by name on another node
    status, entry = api(cluster, led[0], "GET", f"/api/nodes/{follower}")
    assert (status, entry["name"], entry["running"]) == (200, follower, True)
    assert api(cluster, led[0], "GET", "/api/nodes/nobody@nowhere")[0] == 404
    assert api(cluster, led[0], "GET", "/api/nodes", user="nobody:wrong")[0] == 401
    cluster.nodes[elsewhere].kill()
    rest = {name for name in every if not name.startswith(elsewhere)}
    wait_for(lambda: (found := listed(led[0])) and set(found) == rest, 30, f"{elsewhere}'s workers gone from the list")


def test_a_request_between_nodes_counts_only_when_proven(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.nodes[led[1]].management_port}/api/users/mallory",
                                     method="PUT", data=b'{"password": "x", "tags": "administrator"}',
                                     headers={"X-Warren-Group": "1", "X-Warren-Proof": "0" * 64,
                                              "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert api(cluster, led[1], "GET", "/api/users/mallory")[0] == 404


def test_definitions_imported_through_any_node_reach_each_vhosts_group(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)
    queue = {"durable": True, "auto_delete": False, "arguments": {}}
    status, _ = api(cluster, "a", "POST", "/api/definitions", {"queues": [
        {"name": "imported", "vhost": "one", **queue}, {"name": "imported", "vhost": "two", **queue}]})
    assert status == 204
    status, queues = api(cluster, "b", "GET", "/api/queues")
    assert {(queue["vhost"], queue["node"].split("@")[0]) for queue in queues} == {("one", f"{led[0]}-0"),
                                                                                   ("two", f"{led[1]}-1")}


def queue_messages(cluster: Cluster, node: str) -> dict[tuple[str, str], float]:
    """(vhost, queue) -> ready messages, as a node's Prometheus endpoint reports them."""
    port = cluster.nodes[node].prometheus_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/per-object", timeout=10) as response:
        text = response.read().decode()
    return {(sample.labels["vhost"], sample.labels["queue"]): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "rabbitmq_queue_messages_ready"}


def test_a_nodes_metrics_are_those_of_the_groups_it_leads(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)  # (the metrics listen from the same time on)
    with connect(cluster, led[1], "two") as connection:
        publish_confirmed(connection, "counted", [b"1", b"2"])
    with connect(cluster, led[0], "one") as connection:
        publish_confirmed(connection, "counted", [b"1"])
    assert queue_messages(cluster, led[1]) == {("two", "counted"): 2}  # as RabbitMQ's, a node's own queues
    assert queue_messages(cluster, led[0]) == {("one", "counted"): 1}
    assert queue_messages(cluster, next(node for node in "abc" if node not in led)) == {}


def test_a_host_name_only_the_node_reached_knows_reaches_every_group(tmp_path, etcd_endpoint):
    """The Host (and Origin) of a request are checked by the node it reaches; a node that answers for a group led
    there gets the request under its own address, so a name configured on the first node alone is not refused."""
    with two_groups(tmp_path, etcd_endpoint, hostnames={"a": ["broker.example"]}) as (cluster, observers):
        led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
        assert set(led) != {"a"}  # (leaders are spread: at least one group is led by another node)
        api_ready(cluster)
        status, vhosts = api(cluster, "a", "GET", "/api/vhosts", host="broker.example:15672")
        assert status == 200 and sorted(vhost["name"] for vhost in vhosts) == ["/", "one", "two"]
        status, queues = api(cluster, "a", "GET", "/api/queues/two", host="broker.example")
        assert (status, queues) == (200, [])
        status, refusal = api(cluster, "a", "GET", "/api/vhosts", host="elsewhere.example")
        assert status == 403 and "Host header" in refusal["reason"]


@pytest.mark.parametrize("between_nodes", [False, True], ids=["plain-between-nodes", "tls-between-nodes"])
def test_amqps_and_the_api_over_https_reach_every_group_through_every_node(tmp_path, etcd_endpoint, between_nodes):
    """The TLS session ends at the front door that accepted the client, whichever worker or node leads its vhost;
    a node's API asks the others' over HTTPS. With TLS between the nodes too ([cluster] tls), a client forwarded to
    another node is shown as it spoke to the node it reached, whatever the link between the nodes."""
    certificates = make_certificates(tmp_path / "certs")
    context = ssl.create_default_context(cafile=certificates.path("ca.pem"))
    with two_groups(tmp_path, etcd_endpoint, certificates, between_nodes=between_nodes) as (cluster, observers):
        wait_for(lambda: leaders(observers), 30, "a leader in each group")
        for vhost in ("one", "two"):
            for name, node in cluster.nodes.items():
                with pika.BlockingConnection(pika.ConnectionParameters(
                        "127.0.0.1", node.tls_port, vhost, ssl_options=pika.SSLOptions(context, "localhost"),
                        connection_attempts=50, retry_delay=0.2)) as connection:
                    publish_confirmed(connection, "secret", [f"{vhost} through {name}".encode()])
        idle = next(name for name in "abc" if name not in leaders(observers))
        request = urllib.request.Request(f"https://127.0.0.1:{cluster.nodes[idle].management_port}/api/queues",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
        https = ssl.create_default_context(cafile=certificates.path("ca.pem"))
        https.check_hostname = False
        queues = wait_for(lambda: https_json(request, https), 30, "the API over HTTPS through every group")
        assert {(queue["vhost"], queue["messages"]) for queue in queues} == {("one", 3), ("two", 3)}
        # a client forwarded to another node is shown there as amqps too (the PROXY v2 header says so)
        with contextlib.ExitStack() as open_connections:
            for vhost in ("one", "two"):
                for node in cluster.nodes.values():
                    open_connections.enter_context(pika.BlockingConnection(pika.ConnectionParameters(
                        "127.0.0.1", node.tls_port, vhost, ssl_options=pika.SSLOptions(context, "localhost"))))
            listing = urllib.request.Request(
                f"https://127.0.0.1:{cluster.nodes[idle].management_port}/api/connections?columns=vhost,ssl",
                headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
            with urllib.request.urlopen(listing, timeout=10, context=https) as response:
                shown = json.loads(response.read())
        assert sorted((connection["vhost"], connection["ssl"]) for connection in shown) == [
            ("one", True)] * 3 + [("two", True)] * 3
        with contextlib.ExitStack() as open_connections:  # plain clients, through every node
            for vhost in ("one", "two"):
                for name in cluster.nodes:
                    open_connections.enter_context(connect(cluster, name, vhost))
            with urllib.request.urlopen(listing, timeout=10, context=https) as response:
                shown = json.loads(response.read())
        assert sorted((connection["vhost"], connection["ssl"]) for connection in shown) == [
            ("one", False)] * 3 + [("two", False)] * 3
        for vhost in ("one", "two"):
            with connect(cluster, "a", vhost) as connection:
                assert sorted(drained(connection, "secret")) == [f"{vhost} through {name}".encode() for name in "abc"]


def https_json(request: urllib.request.Request, context: ssl.SSLContext):
    """The JSON of a request over HTTPS once it answers 200 with queues of both groups; None before."""
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            queues = json.loads(response.read())
    except (urllib.error.URLError, OSError):
        return None
    return queues if len({queue["vhost"] for queue in queues}) == 2 else None


def test_a_killed_worker_moves_its_group_alone_and_loses_nothing_confirmed(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    epoch = observers[1].leader()[1]
    with connect(cluster, led[1], "two") as connection:
        publish_confirmed(connection, "orders", [b"before"])
    staying = connect(cluster, led[0], "one")
    publish_confirmed(staying, "orders", [b"one before"])
    pid = int(re.findall(r"worker 1 serves \(pid (\d+)\)", cluster.nodes[led[1]].log())[-1])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (found := observers[1].leader()) and found[1] != epoch, 30, "group 1 led again")
    publish_confirmed(staying, "orders", [b"one after"])  # group 0's clients never noticed
    assert sorted(drained(staying, "orders")) == [b"one after", b"one before"]
    staying.close()
    with connect(cluster, led[1], "two") as connection:  # wherever group 1 is led now
        assert drained(connection, "orders") == [b"before"]
        publish_confirmed(connection, "orders", [b"after"])


def test_clients_reach_a_group_led_elsewhere_while_this_nodes_worker_of_that_group_starts_again(grouped):
    """A node's other workers go on forwarding a group's clients to its leader while the node's own worker of that
    group, a follower, is killed and started again."""
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    elsewhere = next(node for node in "abc" if node != led[1])  # where worker 1 follows group 1's leader
    api_ready(cluster)

    def publish_through_elsewhere(body: bytes) -> None:  # one attempt
        with pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", cluster.nodes[elsewhere].port, "two", socket_timeout=5)) as connection:
            publish_confirmed(connection, "orders", [body])

    def forwarded_once() -> bool:
        try:
            publish_through_elsewhere(b"before")
            return True
        except pika.exceptions.AMQPConnectionError:
            return False

    # (a node that has just joined is taken for a member by the others within half a lease)
    wait_for(forwarded_once, 30, f"{elsewhere}'s forwards taken by {led[1]}")
    pattern = r"worker 1 serves \(pid (\d+)\)"
    pid = int(re.findall(pattern, cluster.nodes[elsewhere].log())[-1])
    os.kill(pid, signal.SIGKILL)
    sent: list[bytes] = []
    deadline = time.monotonic() + 30
    while not (restarted := len(re.findall(pattern, cluster.nodes[elsewhere].log())) > 1) and (
            time.monotonic() < deadline):
        sent.append(f"while restarting {len(sent)}".encode())
        publish_through_elsewhere(sent[-1])
    assert restarted, "worker 1 started again"
    assert sent, "clients came while worker 1 was down"
    with connect(cluster, led[1], "two") as connection:
        assert drained(connection, "orders") == [b"before", *sent]


def test_an_operator_moves_a_vhosts_leadership_to_another_node(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)
    with connect(cluster, led[1], "two") as connection:
        publish_confirmed(connection, "orders", [b"before"])
    target = next(node for node in "abc" if node != led[1])
    status, refusal = api(cluster, "a", "PUT", "/api/vhosts/two/leader", {"node": "nobody"})
    assert (status, refusal["reason"]) == (400, "node 'nobody' is not a member of the cluster now (members: a, b, c)")
    wait_for(lambda: warrenctl(cluster, "a", "set_vhost_leader", target, "-p", "two").returncode == 0, 30,
             f"{target} accepted as group 1's leader (once it holds an in-sync copy)", step=0.2)
    wait_for(lambda: (observers[1].leader() or ("",))[0] == target, 30, f"group 1 led by {target}")
    assert observers[0].leader()[0] == led[0], "group 0 stays where it was"
    state = wait_for(lambda: (answer := api(cluster, "c", "GET", "/api/vhosts/two/leader"))[0] == 200 and answer[1],
                     30, "the API through the new leader")
    assert state == {"vhost": "two", "group": 1, "node": target, "pinned": target}
    with connect(cluster, led[1], "two") as connection:
        assert drained(connection, "orders") == [b"before"]
    assert warrenctl(cluster, "b", "clear_vhost_leader", "-p", "two").returncode == 0
    assert api(cluster, "b", "GET", "/api/vhosts/two/leader")[1]["pinned"] is None


def test_a_node_leading_two_groups_hands_one_over_once_nothing_pins_it(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)
    wait_for(lambda: api(cluster, "a", "PUT", "/api/vhosts/two/leader", {"node": led[0]})[0] == 204, 30,
             f"{led[0]} accepted as group 1's leader (once it holds an in-sync copy)")
    wait_for(lambda: (observers[1].leader() or ("",))[0] == led[0], 30, f"both groups led by {led[0]}")
    wait_for(lambda: api(cluster, "a", "DELETE", "/api/vhosts/two/leader")[0] == 204, 30,
             "the pin taken off (once the API reaches the group's new leader)")
    wait_for(lambda: leaders(observers), 30, "the groups led by different nodes again")
