"""A closed connection's exclusive queues: each deleted whole, a slice a loop turn, and the close's answer (the
``done`` callback) once the last is gone; until its turn a queue stays as it was, refused to other connections."""

from __future__ import annotations

import asyncio

import pytest

from broker.model.vhost import VirtualHost
from protocol.errors import AMQPError


class Owner:
    """A connection as its exclusive queues see it."""

    def __init__(self) -> None:
        self.exclusive_queues: set = set()


def declared(vhost: VirtualHost, owner: Owner, count: int) -> list:
    exchange = vhost.declare_exchange("t", "topic", False, False, False, False, {})
    queues = []
    for number in range(count):
        queue = vhost.declare_queue(f"q{number}", owner, False, False, True, False, {})
        vhost.bind(exchange, queue, f"q.{number}.#", {})
        queues.append(queue)
    return queues


async def turns_until(done: list) -> int:
    """The loop turns taken until something is appended to done."""
    turns = 0
    while not done:
        await asyncio.sleep(0)
        turns += 1
    return turns


def test_a_few_exclusive_queues_go_at_once():
    vhost, owner, closed = VirtualHost("/"), Owner(), []
    queues = declared(vhost, owner, 3)
    vhost.connection_closed(owner, lambda: closed.append(True))
    assert closed == [True] and all(queue.deleted for queue in queues) and not vhost.queues


def test_many_go_over_several_loop_turns_and_the_close_is_answered_after_the_last():
    vhost, owner, closed = VirtualHost("/"), Owner(), []
    queues = declared(vhost, owner, 20_000)  # about 10 µs each with its topic binding: 0.2 s in all

    async def scenario() -> int:
        vhost.connection_closed(owner, lambda: closed.append(True))
        left = [queue for queue in queues if not queue.deleted]
        assert left and not closed
        with pytest.raises(AMQPError) as refused:  # another connection's declare of one still there
            vhost.declare_queue(left[0].name, Owner(), False, False, True, False, {})
        assert refused.value.reply_code == 405
        return await turns_until(closed)

    assert asyncio.run(scenario()) > 1
    assert all(queue.deleted for queue in queues) and not vhost.queues
    assert not vhost.exchanges["t"].bindings
