"""A transaction's messages written under a held key (storage.records.held_key) stay apart from their queue until an
ADOPTED record makes them its messages, or a removal drops them; a restart and compaction keep which they are."""

from __future__ import annotations

import asyncio

from storage import records
from storage.store import MessageStore
from tests.unit.storage.storage_support import durable, reopen, run
from tests.unit.storage.test_storage_compaction import SMALL, settle

HELD = records.held_key("1.7.3", "v|q")


def ids(recovered, key: str) -> list[int]:
    return [message.msg_id for message in recovered.messages.get(key, [])]


def test_a_held_key_is_read_back_apart_from_its_queue_until_a_queue_adopts_it():
    assert records.held_parts(HELD) == ("1.7.3", "v|q")
    assert records.held_parts("v|q") is None and records.held_parts(records.HELD_PREFIX + "no-separator") is None


def test_messages_held_and_not_adopted_come_back_under_their_held_key(tmp_path):
    def work(store):
        store.append_message(1, ("v|q",), "", "q", b"h", b"own")
        store.append_message(2, (HELD,), "", "q", b"h", b"held")

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert ids(recovered, "v|q") == [1] and ids(recovered, HELD) == [2]


def test_adopted_messages_join_their_queue_in_id_order_and_later_acks_and_deliveries_hold(tmp_path):
    other = records.held_key("1.7.4", "v|q")

    def work(store):
        store.append_message(1, ("v|q",), "", "q", b"h", b"a")
        store.append_message(2, (HELD, "v|r"), "", "q", b"h", b"b")  # (one record for two queues)
        store.append_message(3, (HELD,), "", "q", b"h", b"c")
        store.append_message(4, ("v|q",), "", "q", b"h", b"d")
        store.append_message(5, (other,), "", "q", b"h", b"e")
        store.adopt(HELD, "v|q", [2, 3])
        store.append_removed("v|q", [3])
        store.append_delivered("v|q", [2])
        store.append_removed(other, [5])  # (a transaction that was not committed)

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert [(message.msg_id, message.body, message.redelivered) for message in recovered.messages["v|q"]] == [
        (1, b"a", False), (2, b"b", True), (4, b"d", False)]
    assert ids(recovered, "v|r") == [2]
    assert HELD not in recovered.messages and other not in recovered.messages
    store = MessageStore(tmp_path)
    store.recover()
    assert store.stats()["live_messages"] == 4  # (the pairs: 1, 2 and 4 in q, 2 in r)
    store.close()


def test_a_removal_in_the_turn_of_the_adoption_follows_it_on_disk(tmp_path):
    """The queue may drop a message in the very turn it adopts it (a consumer was waiting): the removal gathered
    for the next batch must not come before the ADOPTED record, or the message would come back."""
    def work(store):
        store.append_message(1, ("v|q",), "", "q", b"h", b"a")
        store.append_message(2, (HELD,), "", "q", b"h", b"b")
        store.append_removed("v|q", [1])
        store.adopt(HELD, "v|q", [2])
        store.append_removed("v|q", [2])

    run(tmp_path, work)
    assert reopen(tmp_path).messages.get("v|q") is None


def test_a_rewrite_of_the_held_records_names_the_queue_and_the_adoption_can_go(tmp_path):
    async def main() -> None:
        store = MessageStore(tmp_path, **SMALL)
        store.recover()
        for msg_id in range(1, 601):  # three or four segments of held records
            store.append_message(msg_id, (HELD,), "", "q", b"h", b"x" * 200)
        await durable(store)
        store.adopt(HELD, "v|q", range(1, 601))
        store.append_removed("v|q", range(1, 600))  # all but the last: the rewrite keeps it
        store.append_delivered("v|q", [600])
        for msg_id in range(601, 1201):  # what the queue gets next rolls the segments on
            store.append_message(msg_id, ("v|r",), "", "r", b"h", b"y" * 200)
        await settle(store)
        store.append_removed("v|r", range(601, 1201))
        await settle(store)
        stats = store.stats()
        store.close()
        assert stats["live_messages"] == 1

    asyncio.run(main())
    recovered = reopen(tmp_path, **SMALL)
    assert [(message.msg_id, message.redelivered) for message in recovered.messages["v|q"]] == [(600, True)]
    assert set(recovered.messages) == {"v|q"}
    segments = sorted((tmp_path / "messages").iterdir())
    written = b"".join(path.read_bytes() for path in segments)
    assert HELD.encode() not in written  # rewritten under the queue's key, and the ADOPTED record gone with its need


def test_an_adoption_after_a_damaged_record_is_still_found_and_applied(tmp_path):
    def work(store):
        store.append_message(1, (HELD,), "", "q", b"h", b"held")
        store.append_message(2, ("v|q",), "", "q", b"h", b"damaged")
        store.adopt(HELD, "v|q", [1])

    run(tmp_path, work)
    segment = next((tmp_path / "messages").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[data.index(b"damaged")] ^= 0xFF  # that record's CRC no longer holds: reading resumes at the next one
    segment.write_bytes(bytes(data))
    recovered = reopen(tmp_path)
    assert ids(recovered, "v|q") == [1] and HELD not in recovered.messages


def test_a_message_two_queues_adopted_leaves_each_by_that_queues_removal_alone(tmp_path):
    first, second = records.held_key("1.7.3", "v|q1"), records.held_key("1.7.3", "v|q2")

    def work(store):
        store.append_message(1, (first, second), "", "q", b"h", b"both")  # (one record, held for both queues)
        store.adopt(first, "v|q1", [1])
        store.adopt(second, "v|q2", [1])
        store.append_removed("v|q1", [1])

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert ids(recovered, "v|q1") == [] and ids(recovered, "v|q2") == [1]
    assert set(recovered.messages) == {"v|q2"}


def test_an_adoption_by_a_queue_deleted_since_brings_nothing_back(tmp_path):
    def work(store):
        store.append_message(1, (HELD,), "", "q", b"h", b"held")
        store.adopt(HELD, "v|q", [1])
        store.drop_messages("v|q")  # (the queue deleted after its adoption)
        store.append_message(2, ("v|q",), "", "q", b"h", b"a new queue of that name")

    run(tmp_path, work)
    assert ids(reopen(tmp_path), "v|q") == [2]
