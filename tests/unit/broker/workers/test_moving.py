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


def fill(data_dir) -> None:
    """Worker 1's store: vhost v (an exchange, a queue of three messages, the first delivered once, a binding, a
    policy) and vhost w (a queue of one message)."""
    def work(store):
        for kind, name, data in VHOST_DEFINITIONS:
            store.append_definition(kind, name, data)
        store.append_definition("queue", "w|q", {"vhost": "w", "name": "q", "durable": True})
        for msg_id in (1, 2, 3):
            store.append_message(msg_id, ("v|q",), "orders", "new.order", b"h", b"order %d" % msg_id)
        store.append_message(4, ("w|q",), "", "q", b"h", b"w's")
        store.append_delivered("v|q", [1])
    run(worker_data_dir(data_dir, 1), work)
    run(worker_data_dir(data_dir, 2), lambda store: store.append_message(7, ("x|q",), "", "q", b"h", b"x's"))


def definitions(data_dir, worker: int) -> list[tuple[str, str, dict]]:
    from storage.store import MessageStore
    store = MessageStore(worker_data_dir(data_dir, worker))
    store.recover()
    try:
        return [item for item in store.definitions() if item[2].get("vhost") == "v"]
    finally:
        store.close()


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
