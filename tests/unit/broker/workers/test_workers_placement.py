"""Where vhosts are led among worker processes (broker.workers.placement)."""

import asyncio
import collections
import time

import pytest

from broker.workers.placement import ClusterPlacement, Placement, PlacementError, place_new, worker_data_dir


def test_new_vhosts_go_to_the_worker_that_leads_fewest(tmp_path):
    placement = Placement.load(tmp_path, workers=3)
    assert placement.place(["/", "a", "b", "c"], found_in_first=[])
    assert placement.leaders == {"/": 0, "a": 1, "b": 2, "c": 0}
    assert not placement.place(["a", "c"], found_in_first=[])  # placed already: nothing changes


def test_the_vhosts_of_a_one_process_store_stay_in_it(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    placement.place(["/", "old", "new"], found_in_first=["/", "old"])
    assert placement.leaders == {"/": 0, "old": 0, "new": 1}


def test_only_the_first_start_with_workers_keeps_found_vhosts_on_the_first(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    placement.place(["/"], found_in_first=["/"])
    placement.save()
    again = Placement.load(tmp_path, workers=2)
    again.place(["/", "x"], found_in_first=["/", "x"])  # x came from the first worker's copy of node-wide vhosts
    assert again.leaders == {"/": 0, "x": 1}


def test_a_saved_placement_is_read_back(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    placement.place(["/", "v"], found_in_first=[])
    placement.save()
    assert Placement.load(tmp_path, workers=4).leaders == {"/": 0, "v": 1}


def test_too_few_workers_for_the_placement_is_refused(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    placement.place(["/", "v"], found_in_first=[])
    placement.save()
    with pytest.raises(PlacementError, match="vhost 'v' lives in the store of worker 1, but there are only 1 workers: "
                                             "start with at least 2"):
        Placement.load(tmp_path, workers=1)


@pytest.mark.parametrize("content", ["not json", "[]", '{"format": 2, "vhosts": {}}', '{"format": 1, "vhosts": []}',
                                     '{"format": 1, "vhosts": {"v": "1"}}', '{"format": 1, "vhosts": {"v": -1}}',
                                     '{"format": 1, "vhosts": {"v": true}}'])
def test_a_damaged_placement_is_refused_with_its_path(tmp_path, content):
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "placement.json").write_text(content)
    with pytest.raises(PlacementError, match="placement"):
        Placement.load(tmp_path, workers=2)


def test_the_first_worker_keeps_the_data_dir_itself(tmp_path):
    assert worker_data_dir(tmp_path, 0) == tmp_path
    assert worker_data_dir(tmp_path, 2) == tmp_path / "workers" / "2"


def test_a_pinned_vhost_goes_to_its_worker_and_the_others_fill_around_it(tmp_path):
    placement = Placement.load(tmp_path, workers=3, pins={"big": 2, "other": 0})
    placement.place(["/", "big", "a", "b"], found_in_first=[])
    assert placement.leaders == {"/": 0, "big": 2, "a": 1, "b": 0}


def test_a_pin_that_a_store_contradicts_is_refused_naming_both_workers(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    placement.place(["/", "v"], found_in_first=[])
    placement.save()
    with pytest.raises(PlacementError, match=r"vhost 'v' is pinned to worker 0 \(\[\[vhosts\]\] worker\), but it lives "
                                             r"in the store of worker 1: pin it to 1 or remove the pin, start, and "
                                             r"move it \(warrenctl move_vhost 0 -p VHOST\)"):
        Placement.load(tmp_path, workers=2, pins={"v": 0})
    fresh = Placement.load(tmp_path / "one-process", workers=2, pins={"old": 1})
    with pytest.raises(PlacementError, match="vhost 'old' is pinned to worker 1"):  # found in worker 0's store
        fresh.place(["/", "old"], found_in_first=["/", "old"])


def test_placing_many_vhosts_at_once_takes_time_linear_in_their_number(tmp_path):
    """An import of ten thousand vhosts (or a start that finds them) places them in one pass, evenly, without
    counting every worker's vhosts again for each one."""
    placement = Placement(tmp_path / "placement.json", 4, pins={"v7": 3})
    names = [f"v{number}" for number in range(10_000)]
    started = time.perf_counter()
    assert placement.place(names, found_in_first=[])
    assert time.perf_counter() - started < 0.5
    assert placement.leaders["v7"] == 3
    assert sorted(collections.Counter(placement.leaders.values()).values()) == [2500, 2500, 2500, 2500]


def test_the_supervisor_of_a_clustered_node_places_by_the_record_its_first_worker_keeps():
    """One rule, the record in etcd: the first worker writes it for the vhosts the API makes, and posts it on the
    board as it changes (through other nodes too); while it cannot, the API is told why."""
    asked: list[dict] = []
    answers = [{"placement": {"/": 0, "a": 1}}, None, {"refused": "etcd cannot be reached: no answer"}]

    async def ask(request: dict) -> dict | None:
        asked.append(request)
        return answers.pop(0)

    async def scenario() -> None:
        placement = ClusterPlacement({}, ask)
        assert await placement.add(["a"]) and placement.of("a") == 1 and asked == [{"record": ["a"]}]
        assert placement.posted({"placement": {"/": 0, "a": 1, "b": 0}, "group 0": {}})  # made through another node
        assert placement.of("b") == 0 and not placement.posted({"placement": {"/": 0, "a": 1, "b": 0}})
        for reason in ("the node's first worker is not serving", "etcd cannot be reached: no answer"):
            with pytest.raises(PlacementError, match=f"the cluster's record of its vhosts cannot be changed now: "
                                                     f"{reason}"):
                await placement.remove(["b"])
        assert asked[1:] == [{"forget": ["b"]}] * 2 and placement.of("b") == 0

    asyncio.run(scenario())


def test_the_one_rule_outside_a_cluster_is_kept_in_the_file_as_the_api_makes_and_deletes_vhosts(tmp_path):
    placement = Placement.load(tmp_path, workers=2)
    assert asyncio.run(placement.add(["/", "a"])) and placement.leaders == {"/": 0, "a": 1}
    assert not asyncio.run(placement.add(["a"]))
    assert asyncio.run(placement.remove(["a", "never made"])) and placement.leaders == {"/": 0}
    assert not placement.posted({"placement": {"x": 1}})  # (the board holds no record outside a cluster)
    assert place_new({"/": 0}, ["b", "c", "b"], 3, {"c": 0}) == {"b": 1, "c": 0}
