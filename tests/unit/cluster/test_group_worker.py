"""A clustered node's worker (cluster.worker.GroupWorker): where its front doors send each client, and when it
campaigns, by what the node's workers posted on their board."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from broker.config import Config
from broker.workers.placement import RecordedPlacement
from cluster.worker import GroupWorker, group_config

TTL = 2.0


class Board:
    """The board's copy as a worker reads it."""

    def __init__(self, entries: dict) -> None:
        self.entries = entries
        self.posts: list[dict] = []

    def post(self, entries: dict) -> None:
        self.posts.append(entries)


def led(node: str) -> dict:
    return {"node": node, "host": f"10.0.0.{ord(node) - 96}", "port": 5672, "api": 15672}


@pytest.fixture
def senders():
    pairs = [socket.socketpair() for _ in range(2)]
    yield {number: pair[0] for number, pair in enumerate(pairs)}
    for pair in pairs:
        for end in pair:
            end.close()


def worker(number: int, board: dict, senders, started_long_ago: bool = True) -> GroupWorker:
    config = Config(cluster_node_id="a", cluster_lease_ttl=TTL, workers=2)
    placement = RecordedPlacement({"one": 0, "two": 1}, None, 2, {}, movable=False)
    group = GroupWorker(config, number, placement, Board(board), senders, None)
    if started_long_ago:
        group.started_at -= TTL
    return group


def test_a_client_goes_to_the_worker_here_or_the_node_that_leads_its_vhosts_group(senders):
    group = worker(0, {"group 0": led("a"), "group 1": led("b")}, senders)
    assert group.route("one", forwarded=False) is senders[0]
    assert group.route("two", forwarded=False) == ("10.0.0.2", 5672)
    assert group.route(None, forwarded=False) is senders[0]  # what is no handshake: the default group's leader
    assert group.route("two", forwarded=True) == (
        "vhost 'two' is unavailable: node a does not lead it now; connect again")  # never forwarded twice


def test_a_worker_serves_the_clients_of_the_vhosts_recorded_in_its_group_alone(senders):
    """Not those of another group's vhost, nor of one it has no record of yet (made through another node a moment
    ago): their clients are refused as of a vhost that is down, and come again."""
    assert [worker(1, {}, senders).serves(name) for name in ("one", "two", "made elsewhere")] == [False, True, False]
    assert worker(0, {}, senders).serves("one")


def test_a_group_with_no_leader_known_turns_its_clients_away(senders):
    group = worker(0, {"group 0": led("a")}, senders)
    assert group.route("two", forwarded=False) == (
        "vhost 'two' is unavailable: the replication group that holds it has no leader now; connect again")


def test_a_node_lets_a_lighter_one_that_could_lead_campaign_first(senders):
    assert worker(1, {"group 0": led("a")}, senders).hold(["b", "c"]) == TTL  # they lead none, this node one
    assert worker(1, {"group 0": led("b")}, senders).hold(["b", "c"]) == 0.0  # c leads none too: no one lighter
    assert worker(1, {"group 0": led("a")}, senders).hold([]) == 0.0  # nobody else could lead: it never waits


def test_at_a_fresh_start_the_groups_elect_in_order(senders):
    assert 0 < worker(1, {}, senders, started_long_ago=False).hold(["b", "c"]) < TTL  # group 0 first
    assert worker(1, {"group 0": led("a")}, senders, started_long_ago=False).hold([]) == TTL  # others may come
    assert worker(0, {}, senders, started_long_ago=False).hold(["b", "c"]) == 0.0
    assert worker(1, {}, senders).hold(["b", "c"]) == 0.0  # (after its first lease it waits for no one)


def test_group_configs_keep_their_own_store_and_replication_port():
    config = Config(data_dir="/var/lib/warren", cluster_replication_port=5680, workers=3)
    assert [(c.data_dir, c.cluster_replication_port) for c in (group_config(config, k, 3) for k in range(3))] == [
        ("/var/lib/warren", 5680), ("/var/lib/warren/workers/1", 5681), ("/var/lib/warren/workers/2", 5682)]
    picked = dataclasses.replace(config, cluster_replication_port=0)  # 0: each picks a free one
    assert [group_config(picked, k, 3).cluster_replication_port for k in range(3)] == [0, 0, 0]


def test_a_node_leading_two_groups_more_than_another_hands_one_of_them_over(senders):
    both = {"group 0": led("a"), "group 1": led("a")}
    assert worker(0, both, senders).lighter(["b", "c"]) == "b"  # its lowest group steps aside
    assert worker(1, both, senders).lighter(["b", "c"]) is None  # the other stays: one at a time
    assert worker(0, both, senders).lighter([]) is None  # nobody could take it
    assert worker(0, {"group 0": led("a"), "group 1": led("b")}, senders).lighter(["b", "c"]) is None  # balanced


def test_worker_0_posts_the_secret_it_learns_for_the_whole_node(senders):
    first, second = worker(0, {}, senders), worker(1, {}, senders)
    first.learnt("group 0's secret")
    second.learnt("group 1's secret")  # (each group has one; the cluster's is group 0's)
    assert first.board.posts == [{"cluster secret": "group 0's secret"}]
    assert second.board.posts == []
    posted = worker(0, {"cluster secret": "group 0's secret"}, senders)
    posted.learnt("group 0's secret")  # learnt again, after a new lease: nothing new to post
    assert posted.board.posts == []
