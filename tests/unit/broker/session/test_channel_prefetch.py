"""Prefetch: basic.qos per consumer and channel-wide (global), as RabbitMQ counts them, driven with no socket."""

from __future__ import annotations

from pamqp import commands as spec

from protocol.codec import encode_method
from protocol.framing import FrameReader
from tests.unit.broker.session.channel_host import Host, methods


def declared(host: Host, *queues: str, messages: int = 5):
    channel = host.open()
    for queue in queues:
        host.send(channel, spec.Queue.Declare(queue=queue))
        host.publish(channel, queue, *[f"{queue}-{number}".encode() for number in range(messages)])
    return channel


def delivered(received: list) -> list[int]:
    return [delivery.delivery_tag for delivery in methods(received, spec.Basic.Deliver)]


def test_a_consumer_gets_its_prefetch_count_and_one_more_per_ack():
    host = Host()
    channel = declared(host, "q")
    host.send(channel, spec.Basic.Qos(prefetch_count=2))
    assert delivered(host.send(channel, spec.Basic.Consume(queue="q", consumer_tag="c"))) == [1, 2]
    assert delivered(host.send(channel, spec.Basic.Ack(delivery_tag=1))) == [3]
    assert delivered(host.send(channel, spec.Basic.Ack(delivery_tag=3, multiple=True))) == [4, 5]


def test_the_per_consumer_limit_applies_to_each_consumer_started_after_it():
    host = Host()
    channel = declared(host, "a", "b")
    host.send(channel, spec.Basic.Qos(prefetch_count=1))
    received = host.send(channel, spec.Basic.Consume(queue="a", consumer_tag="ca"),
                         spec.Basic.Consume(queue="b", consumer_tag="cb"))
    assert sorted(delivery.consumer_tag for delivery in methods(received, spec.Basic.Deliver)) == ["ca", "cb"]


def test_a_global_limit_caps_the_channel_over_all_its_consumers():
    host = Host()
    channel = declared(host, "a", "b")
    host.send(channel, spec.Basic.Qos(prefetch_count=3, global_=True))
    received = host.send(channel, spec.Basic.Consume(queue="a", consumer_tag="ca"),
                         spec.Basic.Consume(queue="b", consumer_tag="cb"))
    assert len(methods(received, spec.Basic.Deliver)) == 3
    assert len(delivered(host.send(channel, spec.Basic.Ack(delivery_tag=0, multiple=True)))) == 3


def test_both_limits_hold_at_once():
    host = Host()
    channel = declared(host, "a", "b")
    host.send(channel, spec.Basic.Qos(prefetch_count=1), spec.Basic.Qos(prefetch_count=5, global_=True))
    received = host.send(channel, spec.Basic.Consume(queue="a", consumer_tag="ca"),
                         spec.Basic.Consume(queue="b", consumer_tag="cb"))
    assert len(methods(received, spec.Basic.Deliver)) == 2  # one per consumer, within the channel's five


def test_a_get_is_not_limited_by_prefetch():
    host = Host()
    channel = declared(host, "q", messages=2)
    host.send(channel, spec.Basic.Qos(prefetch_count=1, global_=True))
    host.send(channel, spec.Basic.Get(queue="q"))
    assert methods(host.send(channel, spec.Basic.Get(queue="q")), spec.Basic.GetOk)


def test_a_channel_closing_with_thousands_of_consumers_leaves_the_others_serving_in_their_order():
    """A closing channel's consumers leave their queue in one walk of its list (one removal each, 10,000 on one
    queue took 0.18 s); the other channels' consumers keep their places."""
    host = Host()
    closing, staying = host.open(1), host.open(2)
    host.send(staying, spec.Queue.Declare(queue="q"), spec.Basic.Consume(queue="q", consumer_tag="first"))
    host.send(closing, *[spec.Basic.Consume(queue="q", consumer_tag=f"c{number}") for number in range(3000)])
    host.send(staying, spec.Basic.Consume(queue="q", consumer_tag="last"))
    host.close_channel(closing.number, send_close_ok=False)
    queue = host.vhost.queues["q"]
    assert [consumer.tag for consumer in queue.consumers] == ["first", "last"]
    received = host.publish(staying, "q", b"1", b"2", b"3")
    assert [delivery.consumer_tag for delivery in methods(received, spec.Basic.Deliver)] == ["first", "last", "first"]


def test_a_consumer_passed_over_for_want_of_credit_is_served_first_again_once_it_acks():
    """The queue passes over a consumer without credit until credit may have come back (an ack, here): the
    higher-priority one gets the next message again, not the one after it."""
    host = Host()
    high, low = host.open(1), host.open(2)
    host.send(high, spec.Queue.Declare(queue="q"), spec.Basic.Qos(prefetch_count=1),
              spec.Basic.Consume(queue="q", consumer_tag="high", arguments={"x-priority": 5}))
    host.send(low, spec.Basic.Consume(queue="q", consumer_tag="low"))
    first = host.publish(low, "q", b"1")
    second = host.publish(low, "q", b"2")
    host.send(high, spec.Basic.Ack(delivery_tag=1))
    third = host.publish(low, "q", b"3")
    assert [delivery.consumer_tag for received in (first, second, third)
            for delivery in methods(received, spec.Basic.Deliver)] == ["high", "low", "high"]


def test_an_ack_under_a_channel_limit_not_reached_offers_credit_to_its_own_queue_only():
    """Under a channel-wide limit, an ack offers every queue the channel consumes from a chance to deliver only
    where the limit had been reached (each ack walked them all: 9 ms at 10,000 queues)."""
    host = Host()
    queues = [f"q{number}" for number in range(100)]
    channel = declared(host, *queues, messages=2)
    host.send(channel, spec.Basic.Qos(prefetch_count=1), spec.Basic.Qos(prefetch_count=1000, global_=True))
    received = host.send(channel, *[spec.Basic.Consume(queue=queue, consumer_tag=queue) for queue in queues])
    assert len(delivered(received)) == 100  # one each (its own limit), a second waiting in each queue
    for frame_type, _, payload in FrameReader(0).feed(encode_method(channel.number, spec.Basic.Ack(delivery_tag=1))):
        channel.handle_frame(frame_type, payload)  # (read, and the loop turn not ended yet)
    assert [queue.name for queue in host.vhost.dispatcher.pending] == ["q0"]
    assert [delivery.consumer_tag for delivery in methods(host.turn(), spec.Basic.Deliver)] == ["q0"]


def test_an_ack_that_ends_a_full_channel_limit_lets_every_queue_deliver():
    host = Host()
    channel = declared(host, "a", "b", messages=2)
    host.send(channel, spec.Basic.Qos(prefetch_count=2, global_=True))
    received = host.send(channel, spec.Basic.Consume(queue="a", consumer_tag="ca"),
                         spec.Basic.Consume(queue="b", consumer_tag="cb"))
    assert [delivery.consumer_tag for delivery in methods(received, spec.Basic.Deliver)] == ["ca", "ca"]
    received = host.send(channel, spec.Basic.Ack(delivery_tag=1))
    assert [delivery.consumer_tag for delivery in methods(received, spec.Basic.Deliver)] == ["cb"]


def test_an_ack_that_ends_a_full_channel_limit_lets_the_queue_of_a_consumer_cancelled_meanwhile_deliver():
    """A single active consumer cancelled with a delivery unacked: its successor, on another channel, takes over
    once that delivery is acked, though the channel of the ack has no consumer left."""
    host = Host()
    first, second = host.open(1), host.open(2)
    host.send(first, spec.Queue.Declare(queue="q", arguments={"x-single-active-consumer": True}))
    host.publish(first, "q", b"1", b"2", b"3")
    host.send(first, spec.Basic.Qos(prefetch_count=1, global_=True), spec.Basic.Consume(queue="q", consumer_tag="ca"))
    host.send(second, spec.Basic.Qos(prefetch_count=1), spec.Basic.Consume(queue="q", consumer_tag="cb"))
    host.send(first, spec.Basic.Cancel(consumer_tag="ca"))
    received = host.send(first, spec.Basic.Ack(delivery_tag=1))
    assert [delivery.consumer_tag for delivery in methods(received, spec.Basic.Deliver)] == ["cb"]
