"""A cluster's record of which group holds each vhost (cluster.groups.VhostRecord), on the in-memory etcd: the one
placement rule of a node of workers, kept where every node reads it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.workers.placement import MOVES_IN_A_CLUSTER, RecordedPlacement
from cluster.groups import VhostRecord
from tests.unit.cluster.fake_etcd import MemoryCoordinator, MemoryEtcd


def records(etcd: MemoryEtcd, workers: int = 2, pins: dict[str, int] | None = None, group: int = 0) -> VhostRecord:
    """The record as the worker of one group reads and writes it (a group's keys are its own; the record is the
    cluster's)."""
    prefix = "/warren/test" + (f"/groups/{group}" if group else "")
    return VhostRecord(MemoryCoordinator(etcd, prefix, "a", 5.0, root="/warren/test"), group, workers, pins or {})


def run(scenario):
    async def with_etcd():
        await scenario(MemoryEtcd())
    asyncio.run(asyncio.wait_for(with_etcd(), 10))


def test_new_vhosts_go_to_the_group_that_holds_fewest_and_every_group_reads_the_same_record():
    async def scenario(etcd):
        first, second = records(etcd), records(etcd, group=1)
        assert await first.record(["/", "a", "b"], found=[]) == {"/": 0, "a": 1, "b": 0}
        assert await second.record(["a", "c"], found=[]) == {"/": 0, "a": 1, "b": 0, "c": 1}
        assert await first.record([], found=[]) == {"/": 0, "a": 1, "b": 0, "c": 1}
    run(scenario)


def test_a_vhost_without_a_record_whose_contents_a_store_holds_is_recorded_in_that_stores_group():
    """Where its data is: a cluster of an earlier version placed vhosts by a hash of their names (or etcd lost its
    keys); nothing moves, whichever group's leader starts first, and a vhost with no contents anywhere goes by the
    rule."""
    async def scenario(etcd):
        assert await records(etcd, workers=3, group=2).record(["/", "old", "empty"], found=["old"]) == {
            "old": 2, "/": 0, "empty": 1}
        assert await records(etcd, workers=3, group=1).record(["/", "old", "mine"], found=["old", "mine"]) == {
            "old": 2, "/": 0, "empty": 1, "mine": 1}  # (a record stands: the first group to start wrote it)
    run(scenario)


def test_a_pin_places_a_new_vhost_and_one_the_record_contradicts_is_named_in_the_log(caplog):
    async def scenario(etcd):
        assert await records(etcd).record(["held"], found=[]) == {"held": 0}
        with caplog.at_level(logging.ERROR, "cluster"):
            assert await records(etcd, pins={"pinned": 1, "held": 1}).record(["pinned", "held"], found=[]) == {
                "held": 0, "pinned": 1}
        assert ("vhost 'held' is pinned to group 1 ([[vhosts]] worker), but the cluster records it in group 0, "
                "where its data is: it stays there (remove the pin)") in caplog.messages
    run(scenario)


def test_two_nodes_placing_one_vhost_at_once_agree_on_the_first_record():
    async def scenario(etcd):
        one, other = records(etcd), records(etcd)
        await one.record(["x"], found=[])  # x in group 0: the next new vhost would go to group 1
        first, second = await asyncio.gather(one.asked({"record": ["y"]}), other.asked({"record": ["y"]}))
        assert first == second == {"placement": {"x": 0, "y": 1}}
    run(scenario)


def test_a_deleted_vhost_leaves_the_record_and_a_follower_of_it_sees_each_change():
    async def scenario(etcd):
        record, follower = records(etcd), records(etcd, group=1)
        seen: list[dict] = []

        async def seeing(state: dict) -> None:
            while seen[-1:] != [state]:
                await asyncio.sleep(0.01)

        following = asyncio.ensure_future(follower.follow(seen.append, timeout=5))
        await seeing({})  # the record as it is first read
        await record.asked({"record": ["a", "b"]})
        await seeing({"a": 0, "b": 1})
        assert await record.asked({"forget": ["a"]}) == {"placement": {"b": 1}}
        await seeing({"b": 1})
        assert seen[0] == {} and {"a": 0, "b": 1} in seen and seen[-1] == {"b": 1}
        following.cancel()
    run(scenario)


def test_while_etcd_does_not_answer_the_supervisor_is_told_why_and_the_follower_waits():
    async def scenario(etcd):
        record = records(etcd)
        seen: list[dict] = []
        etcd.set_reachable(False)
        following = asyncio.ensure_future(record.follow(seen.append, timeout=5))
        answer = await record.asked({"record": ["a"]})
        assert "etcd" in answer["refused"] and "placement" not in answer
        etcd.set_reachable(True)
        assert (await record.asked({"record": ["a"]})) == {"placement": {"a": 0}}
        while seen[-1:] != [{"a": 0}]:
            await asyncio.sleep(0.01)
        following.cancel()
    run(scenario)


def test_a_vhost_of_a_cluster_does_not_move_between_groups():
    placement = RecordedPlacement({"a": 0}, None, 2, {}, movable=False)
    with pytest.raises(ValueError, match="stays in the group it was recorded in") as refusal:
        placement.check_move("a", 1)
    assert str(refusal.value) == MOVES_IN_A_CLUSTER
