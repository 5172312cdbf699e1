"""The ready list of a queue whose messages expire where they are: tombstones left in place, skipped and let go at
the head, never counted; entries taken out of the list are told apart from those waiting in it."""

from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.features.expiry import BURIED, READY, TAKEN, ExpiringEntries
from broker.model.features.ready import FifoEntries, PriorityEntries
from protocol.codec import encode_header_payload


def entry(seq: int, priority: int | None = None) -> messages.QueueEntry:
    header = messages.Header(encode_header_payload(1, Basic.Properties(priority=priority)))
    return messages.QueueEntry(seq, messages.Message(messages.Address("", "q"), header, b"x"))


def test_a_buried_entry_is_not_counted_listed_or_handed_out():
    entries = ExpiringEntries(FifoEntries())
    made = [entry(seq) for seq in range(4)]
    for item in made:
        entries.append(item)
    entries.bury(made[1])
    entries.bury(made[2])
    assert (len(entries), bool(entries), [item.seq for item in entries]) == (2, True, [0, 3])
    assert made[1].message is None  # its body is let go at once
    assert [entries.popleft().seq, entries.popleft().seq] == [0, 3]
    assert (len(entries), bool(entries), entries.buried, len(entries.inner)) == (0, False, 0, 0)


def test_only_tombstones_left_is_empty():
    entries = ExpiringEntries(FifoEntries())
    item = entry(0)
    entries.append(item)
    entries.bury(item)
    assert (len(entries), bool(entries), list(entries)) == (0, False, [])


def test_taken_entries_are_marked_and_put_back_ones_are_ready_again():
    entries = ExpiringEntries(FifoEntries())
    made = [entry(seq) for seq in range(3)]
    for item in made:
        entries.append(item)
    first = entries.popleft()
    assert (first.place, made[1].place) == (TAKEN, READY)
    entries.put_back([first])
    assert first.place == READY
    assert [item.seq for item in entries] == [0, 1, 2]


def test_take_all_hands_every_entry_over_tombstones_and_all():
    entries = ExpiringEntries(FifoEntries())
    made = [entry(seq) for seq in range(3)]
    for item in made:
        entries.append(item)
    entries.bury(made[1])  # a tombstone between two live entries
    rest, taken = entries.take_all()
    assert (rest is entries, len(entries), bool(entries)) == (True, 0, False)
    assert list(taken) == made


def test_tombstones_at_the_head_are_let_go_at_once():
    entries = ExpiringEntries(FifoEntries())
    made = [entry(seq) for seq in range(4)]
    for item in made:
        entries.append(item)
    entries.bury(made[1])
    assert (len(entries.inner), entries.buried) == (4, 1)  # behind a live entry it waits
    entries.bury(made[0])
    assert (len(entries.inner), entries.buried, [item.seq for item in entries.inner]) == (2, 0, [2, 3])


def test_a_priority_queue_skips_tombstones_at_every_level():
    entries = ExpiringEntries(PriorityEntries(5))
    high, low, higher = entry(0, 5), entry(1, 1), entry(2, 5)
    for item in (high, low, higher):
        entries.append(item)
    entries.bury(high)
    assert high.place == BURIED
    assert [entries.popleft().seq, entries.popleft().seq] == [2, 1]
    assert not entries
