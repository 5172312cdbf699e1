"""Slices of work from many owners share each loop turn's budget, in the order they came."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from broker.model.turns import TURN_SECONDS, OffLoop, in_slices, next_turn


def test_slices_of_many_owners_run_a_turns_budget_at_a_time_in_order():
    """60 owners each with a slice of a third of a turn's budget: a loop turn runs about three of them, not all 60
    (each owner scheduling its own, one loop turn ran every one: 2,000 closing channels held it seconds)."""
    ran: list[tuple[int, int]] = []  # (owner, loop turn) of each slice run
    turn = 0

    def owner_slice(owner: int) -> None:
        ends = time.perf_counter() + TURN_SECONDS / 3
        while time.perf_counter() < ends:
            pass
        ran.append((owner, turn))

    async def scenario() -> None:
        nonlocal turn
        for owner in range(60):
            next_turn(lambda owner=owner: owner_slice(owner))
        while len(ran) < 60:
            await asyncio.sleep(0)
            turn += 1

    asyncio.run(scenario())
    assert [owner for owner, _ in ran] == list(range(60))
    per_turn = [sum(1 for _, at in ran if at == turn) for turn in {at for _, at in ran}]
    assert max(per_turn) <= 4 and len(per_turn) >= 15, per_turn


def test_a_slice_scheduled_by_a_slice_waits_for_a_later_turn():
    order: list[str] = []

    def first() -> None:
        order.append("first")
        next_turn(lambda: order.append("its next"))

    async def scenario() -> None:
        next_turn(first)
        next_turn(lambda: order.append("second"))
        for _ in range(4):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert order == ["first", "second", "its next"]


def test_what_a_spent_turn_leaves_goes_on_after_the_replies_queued_in_the_next():
    """A reply that a read queues (as its flush) in the loop turn after one the slices spent is written before the
    next slice runs: when the line went on at the next turn, another client's round trip waited for a whole slice
    more (11 ms at the median during a nack of 400,000 messages)."""
    order: list[str] = []

    def spending_a_turn(name: str) -> Callable[[], None]:
        def slice_() -> None:
            ends = time.perf_counter() + TURN_SECONDS
            while time.perf_counter() < ends:
                pass
            order.append(name)
        return slice_

    async def scenario() -> None:
        next_turn(spending_a_turn("first slice"))
        next_turn(spending_a_turn("second slice"))
        await asyncio.sleep(0)  # (the turn the first slice spends)
        asyncio.get_running_loop().call_soon(order.append, "reply")
        while len(order) < 3:
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert order == ["first slice", "reply", "second slice"]


def test_a_slice_that_fails_is_logged_and_the_others_still_run(caplog):
    order: list[str] = []

    def failing() -> None:
        raise RuntimeError("a bug")

    async def scenario() -> None:
        next_turn(failing)
        next_turn(lambda: order.append("after it"))
        await asyncio.sleep(0)
        next_turn(lambda: order.append("later"))
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert order == ["after it", "later"]
    assert "a slice of work done over loop turns failed" in caplog.text and "a bug" in caplog.text


def test_work_in_slices_has_the_calls_it_yields_off_the_loop_made_on_a_thread_and_gets_their_results():
    seen = []

    def steps():
        seen.append((yield OffLoop(threading.get_ident)))
        yield None
        seen.append((yield OffLoop(lambda: "last")))

    async def run():
        await in_slices(steps())
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert seen[0] != loop_thread and seen[1] == "last"
