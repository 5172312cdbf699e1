"""A read whose READ_SECONDS are spent goes on after the replies that other clients' frames, read meanwhile, made:
they would otherwise wait for another slice of it."""

from __future__ import annotations

import asyncio

import uvloop

from broker.model.turns import go_on_after_replies


def turns_order(loop: asyncio.AbstractEventLoop) -> list[str]:
    """The order in which the rest of a spent read and a reply queued after it (as a flush that another client's
    read queues in the same loop turn) run."""
    order: list[str] = []
    done = loop.create_future()

    def rest() -> None:
        order.append("rest of the read")
        done.set_result(None)

    go_on_after_replies(loop, rest)
    loop.call_soon(order.append, "reply")
    loop.run_until_complete(done)
    return order


def test_the_rest_of_a_spent_read_waits_for_the_replies_of_the_next_turn():
    for loop in (uvloop.new_event_loop(), asyncio.new_event_loop()):
        try:
            assert turns_order(loop) == ["reply", "rest of the read"], type(loop)
        finally:
            loop.close()
