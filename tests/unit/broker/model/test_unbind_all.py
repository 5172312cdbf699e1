"""A queue's or exchange's many bindings removed a slice a loop turn before its deletion (VirtualHost.unbind_all; a
closed connection's exclusive queue, VirtualHost.connection_closed): the subject stays as it was meanwhile, bindings
made meanwhile go too, and a few go at once."""

from __future__ import annotations

import asyncio

from broker.model import turns
from broker.model.vhost import BINDINGS_AT_ONCE, VirtualHost
from tests.unit.broker.model.test_exclusive_queues import Owner, turns_until

MANY = 20_000  # topic bindings: about 2.4 µs each to remove, several loop turns


def bound(count: int, auto_delete: bool = False, owner: Owner | None = None):
    """A topic exchange and queue "q" (exclusive to owner, if one is given) bound by count patterns."""
    vhost = VirtualHost("/")
    exchange = vhost.declare_exchange("t", "topic", False, auto_delete, False, False, {})
    queue = vhost.declare_queue("q", owner or Owner(), False, False, owner is not None, False, {})
    for number in range(count):
        vhost.bind(exchange, queue, f"k.{number}.#", {})
    return vhost, exchange, queue


def test_an_exclusive_queue_of_few_bindings_goes_at_once_with_its_connection():
    owner = Owner()
    vhost, exchange, queue = bound(BINDINGS_AT_ONCE, owner=owner)
    vhost.connection_closed(owner)
    assert queue.deleted and not exchange.bindings and "q" not in vhost.queues


def test_an_exclusive_queue_of_many_bindings_goes_over_loop_turns_with_those_bound_meanwhile():
    owner = Owner()
    vhost, exchange, queue = bound(MANY, owner=owner)
    done: list[bool] = []

    async def scenario() -> int:
        vhost.connection_closed(owner, lambda: done.append(True))
        assert not done and vhost.queues["q"] is queue and not queue.deleted
        assert len(exchange.bindings) == MANY  # (removed from the next loop turn on, none in the frame's)
        vhost.bind(exchange, queue, "made.meanwhile", {})
        return await turns_until(done)

    assert asyncio.run(scenario()) > 1
    assert queue.deleted and "q" not in vhost.queues and not exchange.bindings
    assert not list(exchange.route("made.meanwhile", None)) and not list(exchange.route("k.1", None))


def test_an_auto_delete_exchange_losing_its_bindings_stays_until_its_deletion():
    vhost, exchange, queue = bound(MANY, auto_delete=True)
    unbound: list[bool] = []

    async def scenario() -> None:
        vhost.unbind_all(exchange, lambda: unbound.append(True))
        await turns_until(unbound)

    asyncio.run(scenario())
    assert vhost.exchanges["t"] is exchange and not exchange.deleted and len(exchange.bindings) <= BINDINGS_AT_ONCE
    vhost.delete_exchange("t", if_unused=False)
    assert exchange.deleted and not queue.bindings


def test_a_second_call_for_the_same_subject_waits_for_the_first_ones_slices():
    vhost, exchange, queue = bound(MANY)
    called: list[str] = []

    async def scenario() -> int:
        vhost.unbind_all(queue, lambda: called.append("first"))
        vhost.unbind_all(queue, lambda: called.append("second"))
        assert len(queue.bindings) == MANY  # (the first slice waits for the next loop turn)
        assert len(turns._line.waiting) == 1
        return await turns_until(called)

    assert asyncio.run(scenario()) > 1
    assert called == ["first", "second"] and len(queue.bindings) <= BINDINGS_AT_ONCE and not queue.deleted
    assert not vhost.unbinding


def test_each_deletion_waiting_for_the_bindings_is_called_back_though_one_fails(caplog):
    vhost, exchange, queue = bound(MANY)
    called: list[str] = []

    def failing() -> None:
        raise RuntimeError("a bug")

    async def scenario() -> None:
        vhost.unbind_all(queue, failing)
        vhost.unbind_all(queue, lambda: called.append("second"))
        await turns_until(called)

    asyncio.run(scenario())
    assert called == ["second"] and not vhost.unbinding and "a bug" in caplog.text
