"""Queued messages cost the cyclic garbage collector nothing where the broker is compiled: neither a message, its
header and address, nor its entry in a queue is one of the objects the collector walks at each collection, however
many a queue holds or a dead-lettering makes; nor is a snapshot of many queues a listing or a sampling goes through
(broker/model/untracked.c)."""

from __future__ import annotations

import gc
import weakref

import pytest
from pamqp.commands import Basic

from broker.collector import unwalked
from broker.model.message import Address, Header, Message, QueueEntry
from broker.model.vhost import VirtualHost
from protocol.codec import encode_header_payload
from tests.unit.broker.model.test_exclusive_queues import Owner

untracked_module = pytest.importorskip(
    "broker.model.untracked", reason="not built here (no C compiler or Python headers): the collector walks messages")

MANY = 20_000  # messages: each would add at least four objects to the collector's walk (message, header, entry, ...)


def test_a_message_and_its_entry_are_out_of_the_collectors_sight():
    address = Address("ex", "rk")
    header = Header(encode_header_payload(4, Basic.Properties(headers={"a": [1, 2]})))
    message = Message(address, header, b"body")
    entry = QueueEntry(1, message)
    copy = message.with_headers({"x-death": [{"count": 1}]})

    assert [gc.is_tracked(kept) for kept in (address, header, message, entry, copy, copy.header)] == [False] * 6
    assert copy.headers == {"a": [1, 2], "x-death": [{"count": 1}]}  # (what they hold reads back as before)


def test_queued_and_dead_lettered_messages_add_nothing_to_what_the_collector_walks():
    vhost = VirtualHost("/")
    work = vhost.declare_queue("work", Owner(), False, False, False, False,
                               {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    dead = vhost.declare_queue("dead", Owner(), False, False, False, False, {})
    gc.collect()
    walked_before = len(gc.get_objects())

    for number in range(MANY):
        body = b"%d" % number
        work.enqueue(Message(Address("", "work"), Header(encode_header_payload(len(body), Basic.Properties())), body))
    taken = [work.take(no_ack=False) for _ in range(MANY)]
    work.settle(taken, requeue=False)
    del taken
    gc.collect()

    assert (work.count_ready(), dead.count_ready()) == (0, MANY)
    assert len(gc.get_objects()) - walked_before < MANY // 10


def test_only_a_class_whose_instances_the_collector_would_walk_can_be_untracked():
    with pytest.raises(TypeError, match="takes a class"):
        untracked_module.untracked(Message(Address("", ""), Header(b""), b""))
    with pytest.raises(TypeError, match="int does not allocate"):
        untracked_module.untracked(int)
    assert untracked_module.untracked(Message) is Message  # (again: nothing changes)


def test_a_list_untracked_is_walked_by_no_collection_and_still_holds_and_frees_what_it_holds():
    """unwalked(): a snapshot of many queues costs the collector's youngest generation nothing (a young list of
    100,000 queues cost each of its collections 6 ms), and what it holds is freed with it as ever."""
    vhost = VirtualHost("/")
    queues = [vhost.declare_queue(f"q{number}", Owner(), False, False, False, False, {}) for number in range(3)]
    snapshot = unwalked(list(vhost.queues.values()))
    assert not gc.is_tracked(snapshot) and snapshot == queues
    assert not any(held is snapshot for held in gc.get_objects())

    class Held:
        pass

    held = unwalked([Held()])
    freed = weakref.ref(held[0])
    gc.collect()
    assert freed() is not None  # (the list holds it)
    del held
    assert freed() is None
    with pytest.raises(TypeError, match="takes a list, not dict"):
        untracked_module.untrack({})
