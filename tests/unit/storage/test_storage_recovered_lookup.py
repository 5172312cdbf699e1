"""Whether a queue's recovered messages hold an id (what recovery asks of every id a removal or delivery record
names): the same answer in whatever order the ids are asked, the usual queue order taking the short way."""

from __future__ import annotations

import random
from pathlib import Path

from storage.index import MessageIndex
from storage.recovered_messages import RecoveredMessages


def recovered_messages(ids: list[int]) -> RecoveredMessages:
    messages = RecoveredMessages("q", Path("unused"), MessageIndex())
    for position, msg_id in enumerate(ids):
        messages.add(msg_id, position, 0, True, False)
    return messages


def test_an_id_is_found_in_any_order_and_only_if_present():
    ids = sorted(random.Random(7).sample(range(1, 5000), 1000))
    held = set(ids)
    messages = recovered_messages(ids)
    asked = [*ids, *reversed(ids), *range(-2, 5003)]  # queue order, the reverse, and every id around them
    random.Random(8).shuffle(shuffled := list(asked))
    for msg_id in [*asked, *shuffled, ids[0], ids[0], ids[-1], ids[-1]]:
        assert (msg_id in messages) == (msg_id in held), msg_id


def test_no_id_is_found_in_a_queue_without_messages():
    messages = recovered_messages([])
    assert 0 not in messages and -1 not in messages and 1 not in messages
