"""Where a queue's recovered messages hold the ids a removal or delivery record names (what recovery asks of each
such record): the same answer in whatever order the ids are asked, the usual queue order taking the short way; and
the flags recovery sets there from what the index says of those ids."""

from __future__ import annotations

import random
from pathlib import Path

from storage.index import MessageIndex
from storage.recovered_messages import REDELIVERED, REMOVED, TRANSIENT, RecoveredMessages


def recovered_messages(ids: list[int]) -> RecoveredMessages:
    messages = RecoveredMessages("q", Path("unused"), MessageIndex())
    for position, msg_id in enumerate(ids):
        messages.add(msg_id, position, 0, True, False)
    return messages


def test_an_id_is_found_in_any_order_and_only_if_present():
    ids = sorted(random.Random(7).sample(range(1, 5000), 1000))
    where = {msg_id: position for position, msg_id in enumerate(ids)}
    messages = recovered_messages(ids)
    asked = [*ids, *reversed(ids), *range(-2, 5003)]  # queue order, the reverse, and every id around them
    random.Random(8).shuffle(shuffled := list(asked))
    for order in (asked, shuffled, [ids[0], ids[0], ids[-1], ids[-1]]):
        assert messages.positions(order) == [where[msg_id] for msg_id in order if msg_id in where]
    for msg_id in [*asked, *shuffled]:  # one record's id after another's
        assert messages.positions([msg_id]) == ([where[msg_id]] if msg_id in where else []), msg_id


def test_no_id_is_found_in_a_queue_without_messages():
    messages = recovered_messages([])
    assert messages.positions([0, -1, 1]) == []


def test_flags_go_to_the_ids_the_index_named_and_removed_ones_leave_the_columns():
    messages = recovered_messages([10, 20, 30, 40, 50])
    messages.add(60, 5, 0, False, True)  # transient, delivered before
    positions = messages.positions([50, 20, 30, 99])
    messages.flag(positions, [50, 30], REDELIVERED)  # (the index found 20 delivered already)
    messages.flag(messages.positions([10, 30, 60]), [10, 30], REMOVED)
    messages.flag(messages.positions([10]), [10], REMOVED)  # (again: counted once)
    assert list(messages.flags) == [REMOVED, 0, REDELIVERED | REMOVED, 0, REDELIVERED, REDELIVERED | TRANSIENT]
    assert messages.removed == 2
    messages.drop_removed()
    assert (list(messages.ids), list(messages.places), list(messages.flags), messages.removed) == (
        [20, 40, 50, 60], [1, 3, 4, 5], [0, 0, REDELIVERED, REDELIVERED | TRANSIENT], 0)


def test_removed_messages_leave_the_columns_slice_by_slice_the_rest_in_order(monkeypatch):
    monkeypatch.setattr("storage.recovered_messages.SWEEP_SLICE", 3)  # (65,536 a slice: many slices cheaply)
    ids = list(range(100, 200))
    messages = recovered_messages(ids)
    removed = set(random.Random(9).sample(ids, 60)) | {100, 101, 102, 199}  # a whole slice, both ends
    messages.flag(messages.positions(sorted(removed)), sorted(removed), REMOVED)
    messages.drop_removed()
    kept = [position for position, msg_id in enumerate(ids) if msg_id not in removed]
    assert list(messages.ids) == [ids[position] for position in kept]
    assert list(messages.places) == kept
    assert list(messages.flags) == [0] * len(kept)
    assert messages.removed == 0
