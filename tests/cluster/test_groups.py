"""Three nodes of two workers each: worker k of every node is a member of replication group k, and vhosts pinned to
the two groups are led by different nodes. A client reaches its vhost through any node's AMQP port; losing the
node that leads one group moves that group's vhosts alone, with nothing confirmed lost. (What any node's API and
ports show of every group, the same with nodes of one worker, is tested over both in test_forwarding.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pika
import pytest

from broker.workers.placement import worker_data_dir
from tests.cluster.nodes import Node, Observer, wait_for
from tests.cluster.shapes import api, api_ready, connect, drained, leaders, publish_confirmed, three_nodes
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def grouped(tmp_path, etcd_endpoint, request):
    failed = request.session.testsfailed
    with three_nodes(tmp_path, etcd_endpoint, 2) as nodes:
        yield nodes.cluster, nodes.observers
        if request.session.testsfailed > failed:
            print(nodes.cluster.logs())


def every_node_in_sync(observers: list[Observer]) -> None:
    """Wait until every node is in sync in both groups, before group 1's leader (node or worker) is killed: then the
    node that leads neither group takes group 1. Killed while the third node is not yet in sync in group 1 (and a
    killed worker slow to start again), group 0's leader takes group 1 too, then hands group 0 over to balance the
    leaders by count, closing the connections kept on group 0."""
    wait_for(lambda: all(sorted(observer.isr() or ()) == ["a", "b", "c"] for observer in observers), 30,
             "every node in sync in each group")


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


def test_vhosts_made_through_any_node_go_to_the_group_that_holds_fewest_and_every_node_reaches_them(grouped):
    """The one placement rule, as on one node of workers: a new vhost goes to the group holding the fewest (after
    the pins), recorded in etcd, where every node reads it; a client reaches it through any node at once."""
    cluster, observers = grouped
    wait_for(lambda: leaders(observers), 30, "a leader in each group")
    api_ready(cluster)
    made = {"new-1": "a", "new-2": "b", "new-3": "c"}  # each made through another node
    for vhost, node in made.items():  # (its maker, guest, may use it: RabbitMQ grants the user who makes a vhost)
        assert api(cluster, node, "PUT", f"/api/vhosts/{vhost}")[0] == 201
    # "/" and "one" (pinned) in group 0, "two" (pinned) in group 1: then one new vhost each in turn
    for node in "abc":
        assert {vhost: api(cluster, node, "GET", f"/api/vhosts/{vhost}/leader")[1]["group"] for vhost in made} == {
            "new-1": 1, "new-2": 0, "new-3": 1}
    for vhost in made:
        sent = [f"{vhost} through {node}".encode() for node in "abc"]
        for node, body in zip("abc", sent):
            with connect(cluster, node, vhost) as connection:
                publish_confirmed(connection, "orders", [body])
        with connect(cluster, "b", vhost) as connection:
            assert sorted(drained(connection, "orders")) == sorted(sent)


def test_a_wrong_password_is_refused_with_403_by_the_leader(grouped):
    """A front door whose worker leads its group refuses the login at start-ok; any other cannot check it, and the
    vhost's group leader refuses it after connection.open (pika then says ProbableAccessDeniedError where it says
    ProbableAuthenticationError for a refusal after start-ok): either way with 403."""
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
    every_node_in_sync(observers)
    cluster.nodes[led[1]].kill()
    wait_for(lambda: (found := observers[1].leader()) and found[0] != led[1], 30, "a new leader of group 1")
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
    try:
        code = other.process.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"node d was not refused within 30 s; its log:\n{other.log()}")
    assert code == 1
    assert ("the cluster's nodes run 2 workers each, and this node's config says 3: every node must run the same "
            "number") in other.log()


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


def test_a_host_name_only_the_node_reached_knows_reaches_every_group(tmp_path, etcd_endpoint):
    """The Host (and Origin) of a request are checked by the node it reaches; a node that answers for a group led
    there gets the request under its own address, so a name configured on the first node alone is not refused."""
    with three_nodes(tmp_path, etcd_endpoint, 2, hostnames={"a": ["broker.example"]}) as nodes:
        cluster = nodes.cluster
        led = nodes.leaders()
        assert set(led) != {"a"}  # (leaders are spread: at least one group is led by another node)
        api_ready(cluster)
        status, vhosts = api(cluster, "a", "GET", "/api/vhosts", host="broker.example:15672")
        assert status == 200 and sorted(vhost["name"] for vhost in vhosts) == ["/", "one", "two"]
        status, queues = api(cluster, "a", "GET", "/api/queues/two", host="broker.example")
        assert (status, queues) == (200, [])
        status, refusal = api(cluster, "a", "GET", "/api/vhosts", host="elsewhere.example")
        assert status == 403 and "Host header" in refusal["reason"]


def test_a_killed_worker_moves_its_group_alone_and_loses_nothing_confirmed(grouped):
    cluster, observers = grouped
    led = wait_for(lambda: leaders(observers), 30, "a leader in each group")
    epoch = observers[1].leader()[1]
    with connect(cluster, led[1], "two") as connection:
        publish_confirmed(connection, "orders", [b"before"])
    staying = connect(cluster, led[0], "one")
    publish_confirmed(staying, "orders", [b"one before"])
    pid = int(re.findall(r"worker 1 serves \(pid (\d+)\)", cluster.nodes[led[1]].log())[-1])
    every_node_in_sync(observers)
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
