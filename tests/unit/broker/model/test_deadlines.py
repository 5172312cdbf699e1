"""Deadlines: one timer serves many due times, in due order, arrival order on ties."""

import asyncio

from broker.model.features.deadlines import FIRE_SLICE, PRUNE_SLICE, Deadlines, now_ms
from tests.waiting import two_loop_turns


def run(coroutine):
    return asyncio.run(coroutine)


def test_items_come_due_in_due_order_with_arrival_order_on_ties():
    async def scenario():
        fired: list[list[str]] = []
        done = asyncio.Event()

        def on_due(items):
            fired.append(items)
            if sum(map(len, fired)) == 4:
                done.set()

        deadlines = Deadlines(on_due)
        start = now_ms()
        deadlines.add(start + 40, "late")
        deadlines.add(start + 10, "first")
        deadlines.add(start + 10, "second")
        deadlines.add(start + 20, "middle")
        await asyncio.wait_for(done.wait(), 2)
        return [item for items in fired for item in items], len(deadlines), deadlines.timer

    order, left, timer = run(scenario())
    assert order == ["first", "second", "middle", "late"]
    assert left == 0 and timer is None


def test_an_earlier_item_rearms_the_one_timer():
    async def scenario():
        deadlines = Deadlines(lambda items: None)
        start = now_ms()
        deadlines.add(start + 10_000, "far")
        far_timer = deadlines.timer
        deadlines.add(start + 5, "near")
        near_timer = deadlines.timer
        deadlines.add(start + 20_000, "farther")  # not the earliest: the timer stays
        result = (far_timer.cancelled(), near_timer is not far_timer, deadlines.timer is near_timer,
                  deadlines.next_due() == start + 5)
        handed = deadlines.take_all()
        return result, deadlines.timer, len(deadlines), sorted(item for _, _, item in handed)

    (far_cancelled, rearmed, kept, next_due), timer, left, handed = run(scenario())
    assert far_cancelled and rearmed and kept
    assert timer is None and left == 0 and handed == ["far", "farther", "near"]
    assert next_due


def test_take_due_and_prune():
    async def scenario():
        deadlines = Deadlines(lambda items: None)
        start = now_ms()
        for offset, name in ((5, "a"), (6, "b"), (10_000, "c"), (20_000, "d")):
            deadlines.add(start + offset, name)
        taken = deadlines.take_due(start + 6)
        deadlines.prune(lambda item: item != "d")
        rest = sorted(deadlines)
        deadlines.take_all()
        return taken, rest

    taken, rest = run(scenario())
    assert taken == ["a", "b"]
    assert rest == ["c"]


def test_many_items_due_at_once_are_handed_over_a_slice_a_loop_turn_in_order():
    async def scenario():
        fired: list[list[int]] = []
        done = asyncio.Event()
        many = 2 * FIRE_SLICE + 3

        def on_due(items):
            fired.append(items)
            if sum(map(len, fired)) == many:
                done.set()

        deadlines = Deadlines(on_due)
        due = now_ms() + 5
        for number in range(many):
            deadlines.add(due, number)
        await asyncio.wait_for(done.wait(), 2)
        return fired, many

    fired, many = run(scenario())
    assert [len(items) for items in fired] == [FIRE_SLICE, FIRE_SLICE, 3]
    assert [item for items in fired for item in items] == list(range(many))


def test_a_prune_of_many_looks_at_a_slice_every_other_loop_turn_and_a_take_all_meanwhile_takes_everything():
    async def scenario():
        many = 2 * PRUNE_SLICE + 1
        deadlines = Deadlines(lambda items: None)
        due = now_ms() + 60_000
        for number in range(many):
            deadlines.add(due + number, number)
        deadlines.prune(lambda number: number % 2 == 0)
        kept = [len(deadlines.heap)]
        waiting = [len(deadlines)]  # (those it has yet to look at count)
        while deadlines.aside is not None:
            await two_loop_turns()
            kept.append(len(deadlines.heap))
            waiting.append(len(deadlines))
        pruned = deadlines.take_due(due + many)
        deadlines = Deadlines(lambda items: None)
        for number in range(many):
            deadlines.add(due + number, number)
        deadlines.prune(lambda number: False)  # (a slice at once)
        taken = deadlines.take_all()
        await asyncio.sleep(0)
        return kept, waiting, pruned, len(taken), len(deadlines), many

    kept, waiting, pruned, taken, left, many = run(scenario())
    assert waiting == [many - PRUNE_SLICE // 2, many - PRUNE_SLICE, (many + 1) // 2]
    assert len(kept) == 3 and kept[0] < kept[1] < kept[2] == (many + 1) // 2  # (a slice at once, then one every other turn)
    assert len(pruned) == FIRE_SLICE and pruned == list(range(0, 2 * FIRE_SLICE, 2))
    assert (taken, left) == (many - PRUNE_SLICE, 0)  # nothing the prune had set aside came back after the take_all
