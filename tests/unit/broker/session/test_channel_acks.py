"""A channel's acks, nacks and rejects, single and `multiple`, and requeue to the original position, driven with
no socket (channel_host.Host). Expected texts are RabbitMQ's."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands as spec

from broker.session.settlement import SETTLE_SLICE
from broker.session.unacked import CHUNK
from tests.unit.broker.session.channel_host import (
    MANY, SETTLED_WITHIN, Host, bodies, consuming, consuming_many, methods, ready, settled,
)


def test_an_ack_settles_one_delivery_and_multiple_every_one_up_to_its_tag():
    host = Host()
    channel, delivered = consuming(host, "q", 5)
    assert [delivery.delivery_tag for delivery in delivered] == [1, 2, 3, 4, 5]
    host.send(channel, spec.Basic.Ack(delivery_tag=2))
    assert list(channel.unacked) == [1, 3, 4, 5]
    host.send(channel, spec.Basic.Ack(delivery_tag=4, multiple=True))
    assert list(channel.unacked) == [5]
    host.send(channel, spec.Basic.Ack(delivery_tag=0, multiple=True))  # 0 with multiple: everything
    assert not channel.unacked and host.vhost.queues["q"].acknowledged == 5 and not host.failures


def test_an_unknown_or_twice_acked_tag_closes_the_channel_with_406():
    host = Host()
    channel, _ = consuming(host, "q", 2)
    host.send(channel, spec.Basic.Ack(delivery_tag=1))
    host.send(channel, spec.Basic.Ack(delivery_tag=1))
    assert host.failures == [(406, "PRECONDITION_FAILED - unknown delivery tag 1")]
    assert not channel.open
    assert ready(host, "q") == [b"m1"]  # the closed channel's unacked delivery went back


def test_a_nack_without_requeue_drops_and_a_reject_with_requeue_returns_redelivered():
    host = Host()
    channel, _ = consuming(host, "q", 3)
    host.send(channel, spec.Basic.Cancel(consumer_tag="c"))
    host.send(channel, spec.Basic.Nack(delivery_tag=2, multiple=True, requeue=False))
    host.send(channel, spec.Basic.Reject(delivery_tag=3, requeue=True))
    received = host.send(channel, spec.Basic.Get(queue="q", no_ack=True))
    [get_ok] = methods(received, spec.Basic.GetOk)
    assert bodies(received) == [b"m2"] and get_ok.redelivered
    assert ready(host, "q") == []  # m0 and m1 were dropped


def test_requeued_deliveries_go_back_to_their_original_positions():
    host = Host()
    channel, _ = consuming(host, "q", 6, prefetch=4)  # m0..m3 delivered, m4 and m5 wait
    host.send(channel, spec.Basic.Cancel(consumer_tag="c"))
    host.send(channel, spec.Basic.Nack(delivery_tag=3, requeue=True))
    host.send(channel, spec.Basic.Nack(delivery_tag=1, requeue=True))
    assert ready(host, "q") == [b"m0", b"m2", b"m4", b"m5"]
    host.send(channel, spec.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    assert ready(host, "q") == [b"m1", b"m3"]


def test_closing_the_channel_requeues_its_unacked_deliveries_in_order():
    host = Host()
    channel, _ = consuming(host, "q", 3)
    host.send(channel, spec.Basic.Ack(delivery_tag=2))
    host.send(channel, spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert not channel.open and ready(host, "q") == [b"m0", b"m2"]


async def test_channels_closing_with_many_deliveries_requeue_them_in_the_line_of_sliced_work_in_order():
    """A connection's channels closing at once each requeue theirs over loop turns (all at once, 200 channels of
    4,096 deliveries held the event loop 0.36 s); every delivery goes back to its place."""
    host = Host()
    publisher = host.open(100)
    host.send(publisher, spec.Queue.Declare(queue="q"))
    host.publish(publisher, "q", *[f"m{number}".encode() for number in range(2000)])
    channels = []
    for number in range(1, 21):
        channel = host.open(number)
        host.send(channel, spec.Basic.Qos(prefetch_count=100), spec.Basic.Consume(queue="q", consumer_tag="c"))
        channels.append(channel)
    assert all(len(channel.unacked) == 100 for channel in channels)
    for channel in channels:
        host.close_channel(channel.number, send_close_ok=False)
    queue = host.vhost.queues["q"]
    assert queue.count_ready() == 0  # (none requeued in the turn of the closes)
    deadline = time.monotonic() + SETTLED_WITHIN
    while queue.count_ready() < 2000 and time.monotonic() < deadline:
        await asyncio.sleep(0)
    assert ready(host, "q") == [f"m{number}".encode() for number in range(2000)]


def counts(host: Host, observer, queue: str) -> tuple[int, int]:
    """The queue's ready messages and consumers, as a passive declare on observer reports them."""
    [declare_ok] = methods(host.send(observer, spec.Queue.Declare(queue=queue, passive=True)), spec.Queue.DeclareOk)
    return declare_ok.message_count, declare_ok.consumer_count


async def test_a_closed_channels_consumer_leaves_its_queue_with_its_last_delivery_back():
    # (as RabbitMQ's queue drops a channel's consumers and requeues its deliveries in one step)
    host = Host()
    channel = consuming_many(host, "q")
    observer = host.open(2)
    host.close_channel(channel.number, send_close_ok=True)
    assert channel.settling and counts(host, observer, "q") == (0, 1)
    await settled(host, channel)
    assert counts(host, observer, "q") == (MANY, 0)


async def test_a_closed_channels_exclusive_consumer_holds_no_exclusive_use_while_its_deliveries_go_back():
    # (RabbitMQ's queue answers a consume once it has dropped the closed channel's consumer)
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="q"))
    host.publish(channel, "q", *[f"m{number}".encode() for number in range(MANY)])
    host.send(channel, spec.Basic.Consume(queue="q", consumer_tag="c", exclusive=True))
    assert len(channel.unacked) == MANY
    host.close_channel(channel.number, send_close_ok=True)
    other = host.open(2)
    received = host.send(other, spec.Basic.Consume(queue="q", consumer_tag="d", exclusive=True, no_ack=True))
    assert methods(received, spec.Basic.ConsumeOk) and not host.failures
    received += await settled(host, channel)
    delivered = methods(received, spec.Basic.Deliver)
    assert len(delivered) == MANY and all(deliver.consumer_tag == "d" and deliver.redelivered for deliver in delivered)
    assert sorted(bodies(received)) == sorted(f"m{number}".encode() for number in range(MANY))


async def test_a_multiple_ack_of_many_deliveries_settles_them_all_before_the_channel_answers_what_follows():
    host = Host()
    channel = consuming_many(host, "q")
    tag = 2 * SETTLE_SLICE + 7
    received = host.send(channel, spec.Basic.Ack(delivery_tag=tag, multiple=True), spec.Basic.Qos(prefetch_count=10))
    assert not methods(received, spec.Basic.QosOk)  # (settled a slice a loop turn: the qos waits for them)
    received = await settled(host, channel)
    assert methods(received, spec.Basic.QosOk) and host.vhost.queues["q"].acknowledged == tag
    assert list(channel.unacked) == list(range(tag + 1, MANY + 1)) and not host.failures


async def test_a_multiple_nack_of_many_deliveries_requeues_them_in_their_original_order():
    host = Host()
    channel = consuming_many(host, "q")
    host.send(channel, spec.Basic.Cancel(consumer_tag="c"))
    host.send(channel, spec.Basic.Nack(delivery_tag=MANY - 3, multiple=True, requeue=True))
    await settled(host, channel)
    assert ready(host, "q") == [f"m{number}".encode() for number in range(MANY - 3)]
    assert list(channel.unacked) == [MANY - 2, MANY - 1, MANY]


async def test_a_multiple_nack_that_dead_letters_thousands_goes_over_loop_turns_and_reaches_the_dead_letter_queue():
    """Fewer than a settlement's slice, but a dead-lettered message whose properties are its own (here a message id)
    costs about 20 microseconds: 4,000 in one turn held the event loop about 80 ms."""
    host = Host()
    channel = host.open()
    host.send(channel, spec.Queue.Declare(queue="dead"),
              spec.Queue.Declare(queue="q", arguments={"x-dead-letter-exchange": "",
                                                       "x-dead-letter-routing-key": "dead"}))
    count = SETTLE_SLICE - 96
    for number in range(count):
        host.publish(channel, "q", b"m", properties=spec.Basic.Properties(message_id=f"m{number}"))
    delivered = methods(host.send(channel, spec.Basic.Consume(queue="q", consumer_tag="c")), spec.Basic.Deliver)
    assert len(delivered) == count
    received = host.send(channel, spec.Basic.Nack(delivery_tag=count, multiple=True, requeue=False),
                         spec.Basic.Qos(prefetch_count=10))
    assert not methods(received, spec.Basic.QosOk) and channel.settling  # (not all in the turn it came)
    received = await settled(host, channel)
    assert methods(received, spec.Basic.QosOk) and not channel.unacked and not host.failures
    assert host.vhost.queues["dead"].count_ready() == count and host.vhost.queues["q"].count_ready() == 0


async def test_an_unknown_tag_in_a_multiple_ack_of_many_closes_the_channel_with_406():
    host = Host()
    channel = consuming_many(host, "q")
    host.send(channel, spec.Basic.Ack(delivery_tag=MANY + 1, multiple=True))
    assert host.failures == [(406, f"PRECONDITION_FAILED - unknown delivery tag {MANY + 1}")]
    await settled(host, channel)
    assert len(ready(host, "q")) == MANY  # the closed channel's deliveries went back


async def test_a_channel_closed_during_a_multiple_ack_of_many_settles_it_then_requeues_the_rest_in_order():
    host = Host()
    channel = consuming_many(host, "q")
    tag = SETTLE_SLICE + 1
    host.send(channel, spec.Basic.Ack(delivery_tag=tag, multiple=True),
              spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await settled(host, channel)
    assert not channel.open and host.vhost.queues["q"].acknowledged == tag
    assert ready(host, "q") == [f"m{number}".encode() for number in range(tag, MANY)]


async def test_the_queue_counts_its_unacked_deliveries_and_their_bytes_through_every_settlement():
    """What the management API and the metrics show, kept as deliveries come and go (never counted by walking
    millions of them): acks single and multiple, a multiple ack over several loop turns, a requeue, the close."""
    host = Host()
    channel = consuming_many(host, "q")
    queue = host.vhost.queues["q"]

    def counted_as(tags) -> tuple[int, int]:
        return len(tags), sum(len(f"m{tag - 1}") for tag in tags)
    assert (queue.unacked_count, queue.unacked_bytes) == counted_as(range(1, MANY + 1))
    host.send(channel, spec.Basic.Ack(delivery_tag=1), spec.Basic.Ack(delivery_tag=3, multiple=True))
    host.send(channel, spec.Basic.Ack(delivery_tag=2 * SETTLE_SLICE, multiple=True))
    await settled(host, channel)
    assert (queue.unacked_count, queue.unacked_bytes) == counted_as(range(2 * SETTLE_SLICE + 1, MANY + 1))
    host.send(channel, spec.Basic.Cancel(consumer_tag="c"), spec.Basic.Reject(delivery_tag=MANY, requeue=True))
    assert (queue.unacked_count, queue.unacked_bytes) == counted_as(range(2 * SETTLE_SLICE + 1, MANY))
    host.send(channel, spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await settled(host, channel)
    assert (queue.unacked_count, queue.unacked_bytes) == (0, 0) and not host.failures


async def test_acks_on_either_side_of_a_chunk_of_unacked_deliveries_settle_what_they_name():
    host = Host()
    count = CHUNK + 10  # deliveries: a full chunk of unacked ones and ten in the next
    channel, delivered = consuming(host, "q", count)
    assert len(delivered) == count
    assert len(channel.unacked) == count and len(channel.unacked.chunks) == 2
    host.send(channel, spec.Basic.Ack(delivery_tag=CHUNK + 5), spec.Basic.Ack(delivery_tag=7))
    host.send(channel, spec.Basic.Ack(delivery_tag=CHUNK + 2, multiple=True))
    await settled(host, channel)
    assert list(channel.unacked) == [CHUNK + 3, CHUNK + 4, *range(CHUNK + 6, count + 1)] and not host.failures
    assert len(channel.unacked.chunks) == 1 and host.vhost.queues["q"].acknowledged == CHUNK + 3
