"""A rolling upgrade of a three-node cluster under a publisher and a consumer, as docs/clustering.md tells it: each
node in turn, the followers first, drained (``warrenctl drain``), stopped, started again as another version and
revived (``warrenctl revive``), and back in the ISR before the next. Every confirmed id is consumed or read back;
the confirms pause at most 1 s per node with the drain, at most 3 s without it (a plain stop and start).

The other version is the package's metadata as that version would install it, first on the node's PYTHONPATH (the
node runs from a directory of its own, where the source tree's metadata does not come first).
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.cluster.nodes import Cluster, Node
from tests.cluster.shapes import warrenctl
from tests.cluster.test_failover import cluster, kill_publishers, publisher_on  # noqa: F401 (fixtures)
from tests.cluster.test_failover_load import consumer_on, kill_consumers, read_back  # noqa: F401 (a fixture)
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

UPGRADED = "99.0.0"  # the version each node is started again as
PER_STEP = 2000  # ids confirmed before each node's turn
PAUSE_DRAINED = 1.0  # seconds without a confirm that a drained node's turn may cost
PAUSE_STOPPED = 3.0  # and a node's turn without the drain


def other_version(tmp_path: Path) -> Path:
    """A directory holding Warren's package metadata as version UPGRADED would install it."""
    site = tmp_path / "upgraded-site"
    metadata = site / f"warren-{UPGRADED}.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: warren\nVersion: {UPGRADED}\n")
    return site


def being_drained(asked: Node, node: Node) -> bool | None:
    """Whether /api/nodes, asked on ``asked``, shows ``node`` in maintenance (None: it does not list it running)."""
    status, entries = asked.api("GET", "/api/nodes")
    assert status == 200, entries
    found = [entry for entry in entries if entry["name"].startswith(f"{node.name}@") and entry["running"]]
    return found[0]["being_drained"] if found else None


def upgrade(cluster: Cluster, node: Node, site: Path, drained: bool) -> None:
    """One node's turn: drained (or not), stopped, started as version UPGRADED, revived, back in the ISR."""
    if drained:
        done = warrenctl(cluster, node.name, "drain")
        assert done.returncode == 0, done.stderr
        assert "into maintenance mode" in done.stdout
        assert cluster.leader() is not node, "a drained node still leads"
        assert being_drained(node, node) is True
    assert node.stop() == 0
    node.workdir = site.parent
    node.environment = {"PYTHONPATH": str(site)}
    node.start()
    wait_for(lambda: f"Warren {UPGRADED} listening on" in node.log(), 30, f"{node.name} running {UPGRADED}")
    if drained:
        elsewhere = next(other for other in cluster.nodes.values() if other is not node)
        wait_for(lambda: being_drained(elsewhere, node) is not None, 30, f"{node.name} listed by {elsewhere.name}")
        assert being_drained(elsewhere, node) is True, "a drained node came back out of maintenance by itself"
        # (its API has a request checked by a group's leader, a revive's too, once its workers learnt who leads:
        # asked before, it answers 503 "worker 0's group has no leader now")
        wait_for(lambda: node.api("GET", "/api/nodes")[0] == 200, 30, f"{node.name}'s API reaching a leader")
        done = warrenctl(cluster, node.name, "revive")
        assert done.returncode == 0, done.stderr
        assert being_drained(node, node) is False
    cluster.ready(timeout=60)


def test_maintenance_is_asked_of_the_node_itself_by_an_administrator(cluster):
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    wait_for(lambda: being_drained(a, b) is not None, 30, "b listed by a")
    [b_name] = [entry["name"] for entry in a.api("GET", "/api/nodes")[1] if entry["name"].startswith("b@")]
    status, body = a.api("PUT", f"/api/nodes/{quote(b_name)}/maintenance")
    assert (status, body["reason"]) == (400, f"{b_name!r} does not name this node (a): a node is put in maintenance, "
                                             "or revived, through its own API")
    assert a.api("PUT", "/api/users/watcher", {"password": "pw", "tags": "monitoring"})[0] in (201, 204)
    status, body = b.api("PUT", f"/api/nodes/{quote(b_name)}/maintenance", user="watcher:pw")
    assert (status, body["reason"]) == (401, "Not administrator user")
    assert being_drained(a, b) is False and being_drained(b, b) is False


@pytest.mark.alone  # (a timing test: the pauses are decided by what runs beside it)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("drained", [True, False], ids=["drained", "stopped"])
def test_a_rolling_upgrade_loses_nothing_and_pauses_confirms_briefly(cluster, tmp_path, drained):
    site = other_version(tmp_path)
    consumer = consumer_on(cluster, tmp_path)
    publisher = publisher_on(cluster, tmp_path)
    leader = cluster.leader()
    turns = []  # (node, time.time() its turn began, and ended)
    for node in [*cluster.followers(), leader]:  # the leader last: it would refuse followers of a newer format
        publisher.wait_confirmed(publisher.confirmed + PER_STEP, timeout=30)
        began = time.time()
        upgrade(cluster, node, site, drained)
        publisher.wait_confirmed(publisher.confirmed + PER_STEP, timeout=30)
        turns.append((node.name, began, time.time()))
    (tmp_path / "stop-publishing").touch()
    result = publisher.wait(timeout=30)
    read_back(cluster, result, consumer)
    pauses = {name: max((gap for at, gap in result["gaps"] if at <= ended and at + gap >= began), default=0.0)
              for name, began, ended in turns}
    print(f"rolling upgrade ({'drain, ' if drained else ''}stop, start as {UPGRADED}"
          f"{', revive' if drained else ''}): the longest pause between two confirms in each node's turn "
          + ", ".join(f"{name} {pause:.2f} s" for name, pause in pauses.items()))
    assert max(pauses.values()) <= (PAUSE_DRAINED if drained else PAUSE_STOPPED), pauses
