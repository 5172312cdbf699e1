"""Shovels and federation links in a cluster of three nodes: each runs once, on the leader of its vhost's group,
whichever node's API defined it, and moves to the new leader after a failover (RabbitMQ's users have seen shovels
run on every node, and duplicate: rabbitmq-server #3153)."""

from __future__ import annotations

import uuid

import pytest

from tests.cluster.nodes import Cluster, Node, wait_for
from tests.cluster.shapes import connect, drained, publish_confirmed

pytestmark = pytest.mark.slow

MOVED_WITHIN = 30.0  # seconds a shovel may take to start (again) and move a hundred messages


@pytest.fixture
def cluster(tmp_path, etcd_endpoint):
    with Cluster(tmp_path, f"t{uuid.uuid4().hex[:10]}", etcd_endpoint).running() as instance:
        yield instance


def running_on(asked: Node, path: str = "/api/shovels", state: str = "state") -> list[str] | None:
    """The nodes every running link of path is listed on (shovels, or federation links with their "status"), as
    asked's API lists them (its node names, before their @); None while it does not answer (a failover under
    way)."""
    status, links = asked.api("GET", path)
    if status != 200:
        return None
    return [entry["node"].split("@")[0] for entry in links if entry[state] == "running"]


def links_running_on(asked: Node) -> list[str] | None:
    return running_on(asked, "/api/federation-links", "status")


def test_a_shovel_runs_once_on_the_leader_and_moves_with_it(cluster: Cluster):
    leader = cluster.ready()
    follower = cluster.followers()[0]
    with connect(cluster, follower.name, "/") as connection:
        channel = connection.channel()
        channel.queue_declare("from", durable=True)
        channel.queue_declare("to", durable=True)
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    status, _ = follower.api("PUT", "/api/parameters/shovel/%2F/across", {"value": {
        "src-uri": "amqp://", "src-queue": "from", "dest-uri": "amqp://", "dest-queue": "to", "reconnect-delay": 1}})
    assert status == 201
    for asked in cluster.nodes.values():
        wait_for(lambda: running_on(asked), MOVED_WITHIN, f"the shovel listed by {asked.name}",
                 until=lambda nodes: nodes == [leader.name])
    with connect(cluster, follower.name, "/") as connection:
        publish_confirmed(connection, "from", [b"before-%d" % number for number in range(100)])
    leader.kill()
    wait_for(lambda: cluster.leader() not in (None, leader), 60, "another node leading")
    new_leader = cluster.ready(timeout=60)
    wait_for(lambda: running_on(new_leader), MOVED_WITHIN, "the shovel running on the new leader",
             until=lambda nodes: nodes == [new_leader.name])
    with connect(cluster, new_leader.name, "/") as connection:
        publish_confirmed(connection, "from", [b"after-%d" % number for number in range(100)])
        # every message acked at the source (none ready or in flight): each is in "to", once or more
        wait_for(lambda: new_leader.api("GET", "/api/queues/%2F/from")[1].get("messages"), MOVED_WITHIN,
                 "every message moved", until=lambda count: count == 0)
        received = set(drained(connection, "to"))
    assert received >= {b"before-%d" % number for number in range(100)} | {b"after-%d" % number
                                                                          for number in range(100)}


def test_a_federation_link_runs_once_on_the_leader_and_moves_with_it(cluster: Cluster):
    leader = cluster.ready()
    follower = cluster.followers()[0]
    with connect(cluster, follower.name, "/") as connection:
        channel = connection.channel()
        channel.queue_declare("upstream", durable=True)
        channel.queue_declare("federated", durable=True)
    wait_for(lambda: follower.api("GET", "/api/overview")[0] == 200, 30, "the follower's API")
    for path, body in (("/api/parameters/federation-upstream/%2F/here", {"value": {
            "uri": "amqp://", "queue": "upstream", "reconnect-delay": 1}}),
            ("/api/policies/%2F/federated", {"pattern": "^federated$", "apply-to": "queues", "definition": {
                "federation-upstream": "here"}})):
        assert follower.api("PUT", path, body)[0] == 201
    for asked in cluster.nodes.values():
        wait_for(lambda: links_running_on(asked), MOVED_WITHIN, f"the link listed by {asked.name}",
                 until=lambda nodes: nodes == [leader.name])
    with connect(cluster, follower.name, "/") as connection:
        publish_confirmed(connection, "upstream", [b"before-%d" % number for number in range(100)])
    leader.kill()
    wait_for(lambda: cluster.leader() not in (None, leader), 60, "another node leading")
    new_leader = cluster.ready(timeout=60)
    wait_for(lambda: links_running_on(new_leader), MOVED_WITHIN, "the link running on the new leader",
             until=lambda nodes: nodes == [new_leader.name])
    wanted = {b"before-%d" % number for number in range(100)} | {b"after-%d" % number for number in range(100)}
    with connect(cluster, new_leader.name, "/") as connection:
        publish_confirmed(connection, "upstream", [b"after-%d" % number for number in range(100)])
        channel = connection.channel()
        received: set[bytes] = set()  # (a federated queue takes messages while a consumer waits)
        channel.basic_consume("federated", lambda ch, method, _, body: (received.add(body), ch.basic_ack(
            method.delivery_tag)))
        wait_for(lambda: (connection.process_data_events(0.01), received)[1], MOVED_WITHIN,
                 "every message federated", until=lambda got: got >= wanted)
