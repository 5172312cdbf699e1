"""The one table of a connection's moves (broker.connection.connection.MOVES): complete, every state can end, the
handshake runs in AMQP's order, and nothing comes back from a close."""

from __future__ import annotations

from broker.connection.connection import MOVES, State


def reachable(start: State) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for state in MOVES[todo.pop()] - seen:
            seen.add(state)
            todo.append(state)
    return seen


def test_every_state_has_its_moves_and_can_end_closed():
    assert set(MOVES) == set(State)
    assert all(State.CLOSED in reachable(state) for state in State)


def test_the_handshake_moves_one_step_forward_or_ends():
    order = [State.AWAIT_HEADER, State.AWAIT_START_OK, State.AWAIT_TUNE_OK, State.AWAIT_OPEN, State.OPEN]
    ending = {State.CLOSING, State.CLOSE_RECEIVED, State.DRAINING, State.CLOSED}
    for step, state in enumerate(order[:-1]):
        assert MOVES[state] - ending == {order[step + 1]}, state


def test_a_close_never_goes_back():
    closes = {State.CLOSING, State.CLOSE_RECEIVED, State.DRAINING, State.CLOSED}
    for state in closes:
        assert reachable(state) <= closes
