"""basic.get: get-ok with message_count, get-empty, manual and no-ack gets."""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import (
    bodies,
    declare_queue,
    enqueue,
    message_count,
    open_channel,
    stay_quiet,
    wait_for_message_count,
)


def test_get_on_empty_queue_returns_get_empty(broker, unique):
    with open_channel(broker) as ch:
        queue = declare_queue(ch, unique, exclusive=True)
        method, properties, body = ch.basic_get(queue)
        assert (method, properties, body) == (None, None, None)


def test_get_ok_reports_messages_left_behind(broker, unique):
    with open_channel(broker) as ch:
        queue = declare_queue(ch, unique, exclusive=True)
        enqueue(ch.connection, queue, bodies("m", 3))
        seen = []
        for _ in range(3):
            method, _properties, body = ch.basic_get(queue, auto_ack=True)
            assert isinstance(method, pika.spec.Basic.GetOk)
            seen.append((body, method.message_count))
        assert seen == [(b"m-0", 2), (b"m-1", 1), (b"m-2", 0)]
        assert ch.basic_get(queue)[0] is None


def test_get_ok_carries_routing_information_and_properties(broker, unique):
    with open_channel(broker) as ch:
        queue = declare_queue(ch, unique, exclusive=True)
        properties = pika.BasicProperties(content_type="text/plain", headers={"k": "v"}, message_id="id-1")
        enqueue(ch.connection, queue, [b"hello"], properties=properties)
        method, received, body = ch.basic_get(queue, auto_ack=True)
        assert (method.exchange, method.routing_key, method.redelivered, method.delivery_tag) == ("", queue, False, 1)
        assert (received.content_type, received.headers, received.message_id) == ("text/plain", {"k": "v"}, "id-1")
        assert body == b"hello"


def test_no_ack_get_is_not_requeued_when_the_channel_closes(broker, unique):
    with open_channel(broker) as owner:
        queue = declare_queue(owner, unique)
        try:
            enqueue(owner.connection, queue, [b"only"])
            with open_channel(broker) as getter:
                method, _properties, body = getter.basic_get(queue, auto_ack=True)
                assert (body, method.message_count) == (b"only", 0)
            stay_quiet(owner.connection)  # time for a (wrong) requeue to show
            assert message_count(owner, queue) == 0
        finally:
            owner.queue_delete(queue)


def test_manual_ack_get_keeps_the_message_until_acked(broker, unique):
    with open_channel(broker) as owner:
        queue = declare_queue(owner, unique)
        try:
            enqueue(owner.connection, queue, [b"first", b"second"])
            with open_channel(broker) as getter:
                method, _properties, body = getter.basic_get(queue, auto_ack=False)
                assert (body, method.message_count, method.delivery_tag) == (b"first", 1, 1)
                assert message_count(owner, queue) == 1  # ready messages exclude the unacked one
                getter.basic_ack(method.delivery_tag)
                method, _properties, body = getter.basic_get(queue, auto_ack=False)
                assert (body, method.delivery_tag) == (b"second", 2)
            # The second get was never acked: closing its channel put the message back, marked redelivered.
            wait_for_message_count(owner, queue, 1)
            method, _properties, body = owner.basic_get(queue, auto_ack=True)
            assert (body, method.redelivered, method.message_count) == (b"second", True, 0)
        finally:
            owner.queue_delete(queue)


def test_get_on_missing_queue_closes_the_channel_with_404(broker, unique):
    with open_channel(broker) as ch:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.basic_get(unique + "-missing")
        assert closed.value.reply_code == 404
        assert closed.value.reply_text == f"NOT_FOUND - no queue '{unique}-missing' in vhost '/'"
