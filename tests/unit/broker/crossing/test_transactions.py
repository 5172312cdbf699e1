"""A start that finds shares of transactions across processes in its store (broker.model.transactions): those it
coordinated are decided by the decision it recorded, or its absence; the others wait for their coordinator, which
names its committed ones as it links (broker.crossing.transactions). Either way each message ends in its queue once,
after what the queue held, or nowhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable, TypeVar

import pytest

from broker.crossing.frames import FrameError
from broker.crossing.home import Crossing
from broker.crossing.transactions import checked, coordinator_of
from broker.model.durability import restore
from broker.model.keys import queue_key
from broker.model.node import Node
from broker.model.transactions import restore_shares
from storage.records import held_key
from storage.store import MessageStore
from tests.unit.broker.model.test_upgrade import header, vhost
from tests.unit.storage.storage_support import durable, run

T = TypeVar("T")
ELSEWHERE = "0.1700000000.7"  # a transaction that worker 0 coordinated
KEY = queue_key("/", "q")


def stored(data_dir: Path, decided: bool) -> None:
    """Queue q with two messages of its own, and a share of ELSEWHERE's (two more) held for it; with decided, the
    decision to commit it recorded in the same store (as its coordinator's own store holds it)."""
    def work(store: MessageStore) -> None:
        store.append_definition(*vhost("/"))
        store.append_definition("queue", KEY, {"vhost": "/", "name": "q", "durable": True, "auto_delete": False,
                                               "arguments": {}})
        for msg_id, key in enumerate((KEY, held_key(ELSEWHERE, KEY), KEY, held_key(ELSEWHERE, KEY)), 1):
            store.append_message(msg_id, (key,), "", "q", header(b"m%d" % msg_id), b"m%d" % msg_id)
        if decided:
            store.append_definition("transaction", ELSEWHERE, {"name": ELSEWHERE, "owners": [1]})
    run(data_dir, work)


def started(data_dir: Path, group: int | None, then: Callable[[Node], T] = lambda node: None) -> tuple[list[bytes], T]:
    """Start on data_dir as worker group (None: one process), run then(node), and say what q holds."""
    async def main() -> tuple[list[bytes], T]:
        store = MessageStore(data_dir)
        recovered = store.recover()
        node = Node(store)
        if group is not None:
            crossing = Crossing(group, {}, "client-local", str)
            node.cross(crossing)
            crossing.node = node
        node.restore_definitions(recovered.vhosts, recovered.users, recovered.permissions,
                                 recovered.topic_permissions)
        restore(node, recovered)
        restore_shares(node, recovered)
        seen = then(node)
        queue = node.vhosts["/"].queues["q"]
        bodies = [entry.message.body for entry in queue.entries]
        assert await durable(store)
        store.close()
        return bodies, seen
    return asyncio.run(main())


def test_a_share_of_its_own_transaction_is_adopted_where_its_decision_was_recorded(tmp_path):
    stored(tmp_path, decided=True)
    assert started(tmp_path, 0)[0] == [b"m1", b"m3", b"m2", b"m4"]  # (after what the queue held at the stop)
    assert started(tmp_path, 0)[0] == [b"m1", b"m2", b"m3", b"m4"]  # (read back in the order written)


def test_a_share_of_its_own_transaction_without_a_decision_is_dropped(tmp_path):
    stored(tmp_path, decided=False)
    assert started(tmp_path, None)[0] == [b"m1", b"m3"]
    assert started(tmp_path, None)[0] == [b"m1", b"m3"]


def test_a_share_of_another_workers_transaction_waits_for_its_decision(tmp_path):
    stored(tmp_path, decided=False)
    held, transactions = started(tmp_path, 1, lambda node: set(node.crossing.transactions.held))
    assert held == [b"m1", b"m3"] and transactions == {ELSEWHERE}
    # another worker's shares are not decided by a link of a third one, nor by a decision that names others
    kept = started(tmp_path, 1, lambda node: node.crossing.transactions.resolve(2, [ELSEWHERE], [], object())
                   or node.crossing.transactions.resolve(0, ["0.1700000000.8", ELSEWHERE], [], object()))
    assert kept == ([b"m1", b"m3", b"m2", b"m4"], True)
    assert started(tmp_path, 1, lambda node: set(node.crossing.transactions.held)) == (
        [b"m1", b"m2", b"m3", b"m4"], set())


def test_a_share_of_another_workers_transaction_that_it_did_not_commit_is_dropped(tmp_path):
    stored(tmp_path, decided=False)
    assert started(tmp_path, 1, lambda node: node.crossing.transactions.resolve(0, [], [], object()))[0] == [
        b"m1", b"m3"]
    assert started(tmp_path, 1, lambda node: set(node.crossing.transactions.held)) == ([b"m1", b"m3"], set())


def test_a_share_whose_decision_its_coordinator_is_writing_is_kept_for_the_link_that_says_how_it_went(tmp_path):
    stored(tmp_path, decided=False)
    link = object()

    def linked_while_deciding(node: Node) -> tuple[bool, bool]:
        transactions = node.crossing.transactions
        transactions.resolve(0, [], [ELSEWHERE], link)
        again = transactions.resolve(0, [], [], link)  # (a later word of that link's own does not drop it)
        return ELSEWHERE in transactions.held and not again, transactions.settle(ELSEWHERE, True)

    assert started(tmp_path, 1, linked_while_deciding) == ([b"m1", b"m3", b"m2", b"m4"], (True, True))


def test_a_link_may_name_only_transactions_this_version_makes():
    assert checked(ELSEWHERE) == ELSEWHERE and coordinator_of(ELSEWHERE) == 0
    for name in ("\u00b2.1.1", "1|2.3.4", "1.2", None, 7, "9" * 30 + ".1.1"):
        assert coordinator_of(str(name)) == -1
        with pytest.raises(FrameError, match="malformed transaction name"):
            checked(name)
