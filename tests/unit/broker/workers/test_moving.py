"""Moving a vhost between two workers' stores (broker.workers.moving): what moves, what stays, and a move stopped
at any point finished by the next start, with the vhost whole where the placement says at every moment."""

from __future__ import annotations

import pytest

from broker.workers import moving
from broker.workers.placement import worker_data_dir
from tests.unit.storage.storage_support import reopen, run

VHOST_DEFINITIONS = [
    ("exchange", "v|orders", {"vhost": "v", "name": "orders", "type": "topic", "durable": True}),
    ("queue", "v|q", {"vhost": "v", "name": "q", "durable": True}),
    ("binding", "v\x00orders\x00queue\x00q\x00new.*\x00", {"vhost": "v", "source": "orders", "destination": "q"}),
    ("policy", "v\x00short", {"vhost": "v", "name": "short", "pattern": "^q$"}),
]


def fill(data_dir, definitions=VHOST_DEFINITIONS) -> None:
    """Worker 1's store: vhost v's definitions (by default an exchange, a queue, a binding, a policy), three messages
    in its queue q (the first delivered once), and vhost w (a queue of one message). Worker 2's: a message of its
    own."""
    def work(store):
        for kind, name, data in definitions:
            store.append_definition(kind, name, data)
        store.append_definition("queue", "w|q", {"vhost": "w", "name": "q", "durable": True})
        for msg_id in (1, 2, 3):
            store.append_message(msg_id, ("v|q",), "orders", "new.order", b"h", b"order %d" % msg_id)
        store.append_message(4, ("w|q",), "", "q", b"h", b"w's")
        store.append_delivered("v|q", [1])
    run(worker_data_dir(data_dir, 1), work)
    run(worker_data_dir(data_dir, 2), lambda store: store.append_message(7, ("x|q",), "", "q", b"h", b"x's"))


def stored(data_dir, worker: int) -> list[tuple[str, str, dict]]:
    """Every definition the worker's store holds."""
    from storage.store import MessageStore
    store = MessageStore(worker_data_dir(data_dir, worker))
    store.recover()
    try:
        return store.definitions()
    finally:
        store.close()


def definitions(data_dir, worker: int) -> list[tuple[str, str, dict]]:
    return [item for item in stored(data_dir, worker) if item[2].get("vhost") == "v"]


def assert_moved(data_dir) -> None:
    """v whole on worker 2, once; gone from worker 1, whose vhost w stays."""
    target, source = reopen(worker_data_dir(data_dir, 2)), reopen(worker_data_dir(data_dir, 1))
    moved = list(target.messages["v|q"])
    assert [(message.body, message.redelivered, message.exchange, message.routing_key) for message in moved] == [
        (b"order 1", True, "orders", "new.order"), (b"order 2", False, "orders", "new.order"),
        (b"order 3", False, "orders", "new.order")]
    assert min(message.msg_id for message in moved) > 7  # fresh ids, above the target's own
    assert [message.body for message in target.messages["x|q"]] == [b"x's"]
    assert "v|q" not in source.messages and [message.body for message in source.messages["w|q"]] == [b"w's"]
    assert definitions(data_dir, 2) == VHOST_DEFINITIONS and definitions(data_dir, 1) == []
    assert moving.pending(data_dir) is None


def test_a_vhost_moves_whole_and_leaves_nothing_behind(tmp_path):
    fill(tmp_path)
    placement = {"v": 1}
    moving.move(tmp_path, "v", 1, 2, lambda: placement["v"], lambda: placement.update(v=2))
    assert placement == {"v": 2}
    assert_moved(tmp_path)


class Stopped(Exception):
    """The supervisor stopped (a kill -9, a power cut) at this point."""


def test_a_move_stopped_before_the_placement_changed_is_copied_again_without_duplicates(tmp_path):
    fill(tmp_path)
    placement = {"v": 1}

    def stopped() -> None:
        raise Stopped

    with pytest.raises(Stopped):  # copied to worker 2, the placement not changed yet
        moving.move(tmp_path, "v", 1, 2, lambda: placement["v"], stopped)
    assert moving.pending(tmp_path) == {"vhost": "v", "from": 1, "to": 2}
    assert len(reopen(worker_data_dir(tmp_path, 1)).messages["v|q"]) == 3  # still whole where the placement says
    moving.finish(tmp_path, lambda: placement["v"], lambda: placement.update(v=2))  # the next start
    assert placement == {"v": 2}
    assert_moved(tmp_path)


def test_a_move_stopped_after_the_placement_changed_only_clears_the_source(tmp_path, monkeypatch):
    fill(tmp_path)
    placement = {"v": 1}
    removing = moving._remove_from

    async def stopped(data_dir, vhost):
        raise Stopped

    monkeypatch.setattr(moving, "_remove_from", stopped)
    with pytest.raises(Stopped):
        moving.move(tmp_path, "v", 1, 2, lambda: placement["v"], lambda: placement.update(v=2))
    monkeypatch.setattr(moving, "_remove_from", removing)
    assert placement == {"v": 2} and moving.pending(tmp_path) is not None
    moving.finish(tmp_path, lambda: placement["v"], lambda: pytest.fail("copied again"))
    assert_moved(tmp_path)


def test_a_copy_that_fails_leaves_the_vhost_where_it_was(tmp_path, monkeypatch):
    fill(tmp_path)
    placement = {"v": 1}

    async def refused(target, key, stored, next_id):
        raise moving.MoveError("the disk is full")

    monkeypatch.setattr(moving, "_copy_messages", refused)
    with pytest.raises(moving.MoveError, match="vhost 'v' stays on worker 1: the disk is full"):
        moving.move(tmp_path, "v", 1, 2, lambda: placement["v"], lambda: pytest.fail("placed on the target"))
    assert placement == {"v": 1} and moving.pending(tmp_path) is None
    assert definitions(tmp_path, 2) == [] and "v|q" not in reopen(worker_data_dir(tmp_path, 2)).messages
    assert len(reopen(worker_data_dir(tmp_path, 1)).messages["v|q"]) == 3


# --- a queue (moving.move_queue): vhost v's worker is 0, its queue q owned by worker 1, and q2 by worker 0 ---------
Q = {"vhost": "v", "name": "q", "durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}


def fill_queues(data_dir) -> None:
    """Worker 0 (v's home): q's record naming worker 1 as its owner, q2 with a message of its own. Worker 1 (as
    fill's): q, three messages (the first delivered once), and a queue of vhost w. Worker 2: a message of its own."""
    def home(store):
        store.append_definition("queue", "v|q", {**Q, "owner": 1})
        store.append_definition("queue", "v|q2", {**Q, "name": "q2"})
        store.append_message(1, ("v|q2",), "", "q2", b"h", b"q2's")
    run(worker_data_dir(data_dir, 0), home)
    fill(data_dir, [("queue", "v|q", Q)])


def queue_records(data_dir, worker: int) -> dict[str, dict]:
    return {name: data for kind, name, data in stored(data_dir, worker) if kind == "queue"}


def bodies(data_dir, worker: int, key: str) -> list[tuple[bytes, bool]]:
    return [(message.body, message.redelivered) for message in reopen(worker_data_dir(data_dir, worker)).messages.get(
        key, ())]


ORDERS = [(b"order 1", True), (b"order 2", False), (b"order 3", False)]


def test_a_queue_moves_to_its_vhosts_worker_which_then_owns_it(tmp_path):
    fill_queues(tmp_path)
    moving.move_queue(tmp_path, "v", "q", 0, 1, 0)
    assert queue_records(tmp_path, 0) == {"v|q": Q, "v|q2": {**Q, "name": "q2"}}  # no owner named: its own
    assert bodies(tmp_path, 0, "v|q") == ORDERS and bodies(tmp_path, 0, "v|q2") == [(b"q2's", False)]
    assert queue_records(tmp_path, 1) == {"w|q": {"vhost": "w", "name": "q", "durable": True}}
    assert bodies(tmp_path, 1, "v|q") == [] and bodies(tmp_path, 1, "w|q") == [(b"w's", False)]
    assert moving.pending(tmp_path) is None


def test_a_queue_moves_from_its_vhosts_worker_and_between_two_others(tmp_path):
    fill_queues(tmp_path)
    moving.move_queue(tmp_path, "v", "q2", 0, 0, 2)
    assert queue_records(tmp_path, 0)["v|q2"] == {**Q, "name": "q2", "owner": 2}
    assert bodies(tmp_path, 0, "v|q2") == [] and bodies(tmp_path, 2, "v|q2") == [(b"q2's", False)]
    moving.move_queue(tmp_path, "v", "q", 0, 1, 2)
    assert queue_records(tmp_path, 0)["v|q"] == {**Q, "owner": 2}
    assert queue_records(tmp_path, 2) == {"v|q": Q, "v|q2": {**Q, "name": "q2"}}
    assert bodies(tmp_path, 2, "v|q") == ORDERS and bodies(tmp_path, 2, "x|q") == [(b"x's", False)]
    assert min(message.msg_id for message in reopen(worker_data_dir(tmp_path, 2)).messages["v|q"]) > 7
    assert "v|q" not in queue_records(tmp_path, 1) and bodies(tmp_path, 1, "v|q") == []


@pytest.mark.parametrize("target", [0, 2])
def test_a_queue_move_stopped_before_its_home_named_the_target_is_copied_again_without_duplicates(
        tmp_path, monkeypatch, target):
    fill_queues(tmp_path)
    copying = moving._copy_messages

    async def stopped(*args):  # the messages copied, the record that names the target not written yet
        await copying(*args)
        raise Stopped

    monkeypatch.setattr(moving, "_copy_messages", stopped)
    with pytest.raises(Stopped):
        moving.move_queue(tmp_path, "v", "q", 0, 1, target)
    monkeypatch.undo()
    assert queue_records(tmp_path, 0)["v|q"] == {**Q, "owner": 1} and bodies(tmp_path, 1, "v|q") == ORDERS
    assert bodies(tmp_path, target, "v|q") == ORDERS  # (the copy: dropped, and made again)
    moving.finish(tmp_path, lambda: pytest.fail("a vhost's"), lambda: pytest.fail("a vhost's"))  # the next start
    assert bodies(tmp_path, target, "v|q") == ORDERS and bodies(tmp_path, 1, "v|q") == []
    assert queue_records(tmp_path, 0)["v|q"] == (Q if target == 0 else {**Q, "owner": 2})
    assert "v|q" not in queue_records(tmp_path, 1) and moving.pending(tmp_path) is None


def test_a_queue_move_stopped_after_its_home_named_the_target_only_clears_the_source(tmp_path, monkeypatch):
    fill_queues(tmp_path)

    async def stopped(*args):
        raise Stopped

    monkeypatch.setattr(moving, "_remove_queue_from", stopped)
    with pytest.raises(Stopped):
        moving.move_queue(tmp_path, "v", "q", 0, 1, 2)
    monkeypatch.undo()
    assert queue_records(tmp_path, 0)["v|q"] == {**Q, "owner": 2} and bodies(tmp_path, 1, "v|q") == ORDERS
    monkeypatch.setattr(moving, "_copy_queue", lambda *args: pytest.fail("copied again"))
    moving.finish(tmp_path, lambda: pytest.fail("a vhost's"), lambda: pytest.fail("a vhost's"))
    assert bodies(tmp_path, 2, "v|q") == ORDERS and bodies(tmp_path, 1, "v|q") == []
    assert "v|q" not in queue_records(tmp_path, 1) and moving.pending(tmp_path) is None


@pytest.mark.parametrize("target", [0, 2])
def test_a_queue_copy_that_fails_leaves_the_queue_where_it_was(tmp_path, monkeypatch, target):
    fill_queues(tmp_path)

    async def refused(*args):
        raise moving.MoveError("the disk is full")

    monkeypatch.setattr(moving, "_copy_messages", refused)
    with pytest.raises(moving.MoveError, match="queue 'q' of vhost 'v' stays on worker 1: the disk is full"):
        moving.move_queue(tmp_path, "v", "q", 0, 1, target)
    assert queue_records(tmp_path, 0)["v|q"] == {**Q, "owner": 1} and bodies(tmp_path, target, "v|q") == []
    assert queue_records(tmp_path, 1)["v|q"] == Q and bodies(tmp_path, 1, "v|q") == ORDERS
    assert moving.pending(tmp_path) is None


def test_a_queue_that_changed_owner_since_the_move_was_asked_does_not_move(tmp_path):
    fill_queues(tmp_path)
    with pytest.raises(moving.MoveError, match="queue 'q2' of vhost 'v' is not on worker 1 now"):
        moving.move_queue(tmp_path, "v", "q2", 0, 1, 2)
    assert queue_records(tmp_path, 0)["v|q2"] == {**Q, "name": "q2"} and bodies(tmp_path, 0, "v|q2") == [
        (b"q2's", False)]
    assert bodies(tmp_path, 2, "v|q2") == [] and moving.pending(tmp_path) is None
