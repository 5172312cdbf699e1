"""Publisher confirms: confirm.select, sequence numbers, (multiple) acks, unroutable and returned messages."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.helpers import declare_queue, get_all, open_channel
from tests.integration.rawclient import RawClient, describe


@contextlib.contextmanager
def raw_channel(broker) -> Iterator[RawClient]:
    """A raw connection with channel 1 open."""
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        yield client


def select_confirms(client: RawClient) -> None:
    client.send(1, commands.Confirm.Select())
    client.expect(commands.Confirm.SelectOk, channel=1)


def confirmed_tags(acks: list[commands.Basic.Ack], published: int) -> list[int]:
    """Every sequence number the acks cover, in the order they were confirmed; each may appear only once."""
    covered: list[int] = []
    for ack in acks:
        if ack.multiple:
            newly = [seq for seq in range(1, ack.delivery_tag + 1) if seq not in covered]
        else:
            newly = [ack.delivery_tag]
        assert newly and ack.delivery_tag not in covered, f"{describe(ack)} confirms nothing new"
        covered += newly
    assert all(1 <= seq <= published for seq in covered), covered
    return covered


def read_acks_until_all_confirmed(client: RawClient, published: int) -> list[commands.Basic.Ack]:
    """Read basic.ack frames until sequence numbers 1..published are all covered; anything else fails the test."""
    acks: list[commands.Basic.Ack] = []
    while len(confirmed_tags(acks, published)) < published:
        acks.append(client.expect(commands.Basic.Ack, channel=1))
    return acks


def test_confirm_select_answers_select_ok(broker):
    with raw_channel(broker) as client:
        select_confirms(client)
        select_confirms(client)  # selecting again is harmless


def test_every_publish_is_confirmed_exactly_once_with_sequence_numbers_from_one(broker, unique):
    with open_channel(broker) as ch, raw_channel(broker) as client:
        queue = declare_queue(ch, unique)
        try:
            select_confirms(client)
            for index in range(200):
                client.publish(1, "", queue, f"m-{index}".encode())
            acks = read_acks_until_all_confirmed(client, 200)
            assert sorted(confirmed_tags(acks, 200)) == list(range(1, 201))
            client.assert_silent(0.2)  # no duplicate or stray confirms
            assert len(get_all(ch, queue)) == 200
        finally:
            ch.queue_delete(queue)


def test_nowait_confirm_select_has_no_reply_but_enables_confirms(broker, unique):
    with raw_channel(broker) as client:
        client.send(1, commands.Confirm.Select(nowait=True))
        client.publish(1, "amq.fanout", "")
        ack = client.expect(commands.Basic.Ack, channel=1)  # the first frame back is the ack, not select-ok
        assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_unroutable_messages_are_confirmed_at_once(broker, unique):
    with raw_channel(broker) as client:
        select_confirms(client)
        client.publish(1, "", f"{unique}-no-such-queue", b"lost")
        client.publish(1, "amq.direct", f"{unique}-unbound", b"lost")
        acks = read_acks_until_all_confirmed(client, 2)
        assert sorted(confirmed_tags(acks, 2)) == [1, 2]


def test_mandatory_return_comes_before_the_ack_of_that_message(broker, unique):
    with raw_channel(broker) as client:
        select_confirms(client)
        client.publish(1, "", f"{unique}-no-such-queue", b"returned", mandatory=True)
        returned = client.expect(commands.Basic.Return, channel=1)
        assert (returned.reply_code, returned.reply_text, returned.exchange, returned.routing_key) == (
            312, "NO_ROUTE", "", f"{unique}-no-such-queue")
        client.read_frame()  # content header
        _, body = client.read_frame()
        assert body.value == b"returned"
        ack = client.expect(commands.Basic.Ack, channel=1)
        assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_mixed_routable_returned_and_dropped_publishes_are_all_confirmed(broker, unique):
    with open_channel(broker) as ch, raw_channel(broker) as client:
        queue = declare_queue(ch, unique)
        try:
            select_confirms(client)
            for index in range(30):
                routing_key = queue if index % 3 == 0 else f"{unique}-nowhere"
                client.publish(1, "", routing_key, f"m-{index}".encode(), mandatory=index % 3 == 1)
            returned, acks = [], []
            while len(confirmed_tags(acks, 30)) < 30:
                _, frame = client.read_frame()
                if isinstance(frame, commands.Basic.Ack):
                    acks.append(frame)
                elif isinstance(frame, commands.Basic.Return):
                    client.read_frame()  # content header
                    seq = int(client.read_frame()[1].value.decode().removeprefix("m-")) + 1
                    assert seq not in confirmed_tags(acks, 30), f"message {seq} was returned after its ack"
                    returned.append(seq)
            assert sorted(confirmed_tags(acks, 30)) == list(range(1, 31))
            assert returned == list(range(2, 31, 3))
            assert get_all(ch, queue) == [f"m-{index}".encode() for index in range(0, 30, 3)]
        finally:
            ch.queue_delete(queue)


def test_pika_confirmed_publish_succeeds_and_unroutable_mandatory_raises(broker, unique):
    with open_channel(broker) as ch:
        queue = declare_queue(ch, unique, exclusive=True)
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"kept")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"{unique}-nowhere", b"returned", mandatory=True)
        assert get_all(ch, queue) == [b"kept"]


def test_confirm_select_on_a_transactional_channel_is_refused_406(broker):
    with open_channel(broker) as ch:
        ch.tx_select()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.confirm_delivery()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_select_on_a_confirm_channel_is_refused_406(broker):
    with open_channel(broker) as ch:
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.tx_select()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
