"""The ready entries of a priority queue: highest priority first, FIFO within a priority, requeues back in place."""

import asyncio
import math
import random

from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.features.ready import DROP_SLICE, FifoEntries, PriorityEntries, let_go, ready_entries
from protocol.codec import encode_header_payload
from tests.waiting import two_loop_turns


def entry(seq: int, priority: int | None) -> messages.QueueEntry:
    header = messages.Header(encode_header_payload(1, Basic.Properties(priority=priority)))
    return messages.QueueEntry(seq, messages.Message(messages.Address("", "q"), header, b"x"))


def filled(max_priority: int, priorities: list[int | None]) -> tuple[PriorityEntries, list[messages.QueueEntry]]:
    entries = PriorityEntries(max_priority)
    made = [entry(seq, priority) for seq, priority in enumerate(priorities)]
    for item in made:
        entries.append(item)
    return entries, made


def test_highest_priority_first_then_first_in_first_out():
    entries, made = filled(9, [1, 9, None, 9, 1, 5])
    assert [entries[0] is made[1], len(entries)] == [True, 6]
    assert [entries.popleft().seq for _ in range(6)] == [1, 3, 5, 0, 4, 2]
    assert not entries


def test_priorities_above_the_maximum_share_the_top_level():
    entries, _ = filled(3, [3, 200, 2, 4])
    assert [item.seq for item in entries] == [0, 1, 3, 2]


def test_requeued_entries_go_back_to_their_places_within_their_priorities():
    entries, made = filled(9, [5, 5, 5, 1])
    first, second = entries.popleft(), entries.popleft()
    entries.put_back([first, second])
    assert [item.seq for item in entries] == [0, 1, 2, 3]
    low = entries.popleft(), entries.popleft(), entries.popleft(), entries.popleft()
    entries.append(made[0])
    entries.put_back([low[3]])
    assert [item.seq for item in entries] == [0, 3] and len(entries) == 2


class Counted:
    """An entry that counts how often its place in the queue is read (put_back compares them by seq)."""

    reads = 0

    def __init__(self, seq: int) -> None:
        self._seq = seq

    @property
    def seq(self) -> int:
        Counted.reads += 1
        return self._seq


def test_requeued_entries_go_back_among_the_ready_ones_in_seq_order_wherever_they_fall():
    chance = random.Random(7)
    for _ in range(200):
        seqs = list(range(chance.randrange(1, 60)))
        requeued = sorted(chance.sample(seqs, chance.randrange(1, len(seqs) + 1)))
        entries = FifoEntries(Counted(seq) for seq in seqs if seq not in requeued)
        entries.put_back([Counted(seq) for seq in requeued])
        assert [item.seq for item in entries] == seqs


def test_a_requeue_among_a_deep_queue_reads_a_few_places_per_entry_not_the_whole_queue():
    """100 deliveries spread over a queue of 200,000 ready messages (other consumers' requeues came back first): a
    few dozen looks each, where a merge read every place in the queue."""
    depth, spread = 200_000, 100
    requeued = [Counted(seq) for seq in range(0, depth, depth // spread)]
    entries = FifoEntries(Counted(seq) for seq in range(depth) if seq % (depth // spread))
    Counted.reads = 0
    entries.put_back(requeued)
    assert Counted.reads < spread * 4 * math.log2(depth), Counted.reads
    assert [item.seq for item in entries] == list(range(depth))


def test_take_all_leaves_an_empty_list_of_the_same_levels_and_hands_every_entry_over():
    entries, _ = filled(4, [1, 2, 3])
    rest, taken = entries.take_all()
    assert (len(rest), list(rest), len(rest.levels)) == (0, [], 5)
    assert [taken.popleft().seq for _ in range(3)] == [2, 1, 0]


def test_what_was_taken_is_let_go_a_slice_every_other_loop_turn():
    taken = FifoEntries(entry(seq, None) for seq in range(2 * DROP_SLICE + 1))

    async def left_after_each_turn() -> list[int]:
        let_go(taken)
        left = [len(taken)]  # (nothing freed before the loop turns)
        while len(taken):
            await two_loop_turns()
            left.append(len(taken))
        return left
    assert asyncio.run(left_after_each_turn()) == [2 * DROP_SLICE + 1, DROP_SLICE + 1, 1, 0]


def test_a_dict_let_go_is_freed_a_slice_every_other_loop_turn():
    dropped = {number: object() for number in range(2 * DROP_SLICE + 1)}

    async def left_after_each_turn() -> list[int]:
        let_go(dropped)
        left = [len(dropped)]
        while dropped:
            await two_loop_turns()
            left.append(len(dropped))
        return left
    assert asyncio.run(left_after_each_turn()) == [2 * DROP_SLICE + 1, DROP_SLICE + 1, 1, 0]


def test_a_queue_gets_priorities_only_with_a_positive_x_max_priority():
    assert isinstance(ready_entries({"x-max-priority": 10}), PriorityEntries)
    assert type(ready_entries({"x-max-priority": 0})) is FifoEntries
    assert type(ready_entries({})) is FifoEntries
