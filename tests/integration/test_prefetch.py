"""basic.qos prefetch: per consumer (global=false), per channel (global=true), both at once, and the default."""

from __future__ import annotations


from tests.integration.helpers import (
    Inbox,
    bodies,
    connect,
    consume,
    declare_queue,
    enqueue,
    message_count,
    open_channel,
    stay_quiet,
)


def filled_queue(conn, name: str, count: int) -> str:
    """An exclusive queue holding `count` messages name-0, name-1, ..."""
    queue = declare_queue(conn.channel(), name, exclusive=True)
    enqueue(conn, queue, bodies(name, count))
    return queue


def settled_count(conn, inbox: Inbox, expected: int) -> int:
    """Wait for `expected` deliveries, then watch a moment longer; return how many arrived in total."""
    inbox.wait_for(conn, expected)
    stay_quiet(conn)
    return len(inbox.deliveries)


def test_consumer_prefetch_limits_unacked_deliveries(conn, unique):
    queue = filled_queue(conn, unique, 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    _tag, inbox = consume(ch, queue)
    assert settled_count(conn, inbox, 2) == 2
    assert inbox.bodies == bodies(unique, 2)


def test_acks_free_credit_one_for_one(conn, unique):
    queue = filled_queue(conn, unique, 6)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    _tag, inbox = consume(ch, queue)
    inbox.wait_for(conn, 2)
    ch.basic_ack(1)
    assert settled_count(conn, inbox, 3) == 3
    ch.basic_ack(3, multiple=True)
    assert settled_count(conn, inbox, 5) == 5
    assert inbox.bodies == bodies(unique, 5)


def test_reject_and_nack_free_credit_too(conn, unique):
    queue = filled_queue(conn, unique, 4)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    _tag, inbox = consume(ch, queue)
    inbox.wait_for(conn, 1)
    ch.basic_reject(1, requeue=False)
    inbox.wait_for(conn, 2)
    ch.basic_nack(2, requeue=False)
    assert settled_count(conn, inbox, 3) == 3
    assert inbox.bodies == bodies(unique, 3)


def test_consumer_prefetch_applies_only_to_consumers_started_afterwards(conn, unique):
    before_queue = filled_queue(conn, unique + "-before", 5)
    after_queue = filled_queue(conn, unique + "-after", 5)
    ch = conn.channel()
    _tag, before = consume(ch, before_queue)
    before.wait_for(conn, 5)
    ch.basic_qos(prefetch_count=2)
    _tag, after = consume(ch, after_queue)
    assert settled_count(conn, after, 2) == 2
    assert len(before.deliveries) == 5


def test_consumer_prefetch_is_per_consumer(conn, unique):
    first_queue = filled_queue(conn, unique + "-1", 5)
    second_queue = filled_queue(conn, unique + "-2", 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    inbox = Inbox()
    first, _ = consume(ch, first_queue, inbox)
    second, _ = consume(ch, second_queue, inbox)
    assert settled_count(conn, inbox, 4) == 4
    assert len(inbox.of(first)) == len(inbox.of(second)) == 2


def test_global_prefetch_is_shared_by_the_channels_consumers(conn, unique):
    first_queue = filled_queue(conn, unique + "-1", 5)
    second_queue = filled_queue(conn, unique + "-2", 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    inbox = Inbox()
    consume(ch, first_queue, inbox)
    consume(ch, second_queue, inbox)
    assert settled_count(conn, inbox, 3) == 3
    ch.basic_ack(inbox.deliveries[0].delivery_tag)
    assert settled_count(conn, inbox, 4) == 4


def test_global_prefetch_does_not_limit_other_channels(conn, unique):
    first_queue = filled_queue(conn, unique + "-1", 3)
    second_queue = filled_queue(conn, unique + "-2", 3)
    limited, free = conn.channel(), conn.channel()
    limited.basic_qos(prefetch_count=1, global_qos=True)
    _tag, limited_inbox = consume(limited, first_queue)
    _tag, free_inbox = consume(free, second_queue)
    free_inbox.wait_for(conn, 3)
    assert settled_count(conn, limited_inbox, 1) == 1


def test_consumer_and_channel_prefetch_are_enforced_together(conn, unique):
    first_queue = filled_queue(conn, unique + "-1", 5)
    second_queue = filled_queue(conn, unique + "-2", 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)  # each consumer started from now on: at most 2 unacked
    ch.basic_qos(prefetch_count=3, global_qos=True)  # the whole channel: at most 3 unacked
    inbox = Inbox()
    first, _ = consume(ch, first_queue, inbox)
    assert settled_count(conn, inbox, 2) == 2  # the consumer limit bites first
    second, _ = consume(ch, second_queue, inbox)
    assert settled_count(conn, inbox, 3) == 3  # then the channel limit
    assert (len(inbox.of(first)), len(inbox.of(second))) == (2, 1)
    ch.basic_ack(inbox.of(second)[0].delivery_tag)
    assert settled_count(conn, inbox, 4) == 4
    assert (len(inbox.of(first)), len(inbox.of(second))) == (2, 2)  # first still at its own limit


def test_zero_means_unlimited(conn, unique):
    queue = filled_queue(conn, unique, 20)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    ch.basic_qos(prefetch_count=0)
    _tag, inbox = consume(ch, queue)
    assert settled_count(conn, inbox, 20) == 20


def test_no_ack_consumers_ignore_prefetch(conn, unique):
    queue = filled_queue(conn, unique, 10)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    _tag, inbox = consume(ch, queue, auto_ack=True)
    assert settled_count(conn, inbox, 10) == 10


def test_basic_get_is_not_limited_by_prefetch(conn, unique):
    queue = filled_queue(conn, unique, 5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    ch.basic_qos(prefetch_count=1, global_qos=True)
    got = [ch.basic_get(queue, auto_ack=False) for _ in range(3)]
    assert [(method.delivery_tag, body) for method, _properties, body in got] == [
        (1, f"{unique}-0".encode()), (2, f"{unique}-1".encode()), (3, f"{unique}-2".encode())]
    assert message_count(ch, queue) == 2


def test_configured_default_consumer_prefetch_applies_without_basic_qos(own_broker, tmp_path, unique):
    config = tmp_path / "warren.toml"
    config.write_text("[amqp]\ndefault_consumer_prefetch = 3\n")
    warren = own_broker("--config", str(config))
    with connect(warren) as conn:
        queue = filled_queue(conn, unique, 6)
        ch = conn.channel()
        _tag, inbox = consume(ch, queue)
        assert settled_count(conn, inbox, 3) == 3
        ch.basic_ack(1)
        assert settled_count(conn, inbox, 4) == 4
    with open_channel(warren) as ch:
        ch.basic_qos(prefetch_count=0)  # an explicit basic.qos still overrides the default
        queue = filled_queue(ch.connection, unique + "-explicit", 6)
        _tag, inbox = consume(ch, queue)
        assert settled_count(ch.connection, inbox, 6) == 6
