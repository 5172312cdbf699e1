"""Queue length limits (x-max-length, x-max-length-bytes) with x-overflow drop-head and reject-publish."""

import pika
import pytest

from tests.integration.helpers import get_all, open_channel


def publish_confirmed(ch, exchange: str, routing_key: str, body: bytes) -> str:
    try:
        ch.basic_publish(exchange, routing_key, body)
        return "ack"
    except pika.exceptions.NackError:
        return "nack"


@pytest.fixture
def confirmed(broker):
    with open_channel(broker) as ch:
        ch.confirm_delivery()
        yield ch


def test_drop_head_keeps_the_newest_and_reject_publish_nacks_the_newest(confirmed, unique):
    ch = confirmed
    dropping, rejecting = f"{unique}-drop", f"{unique}-reject"
    ch.queue_declare(dropping, exclusive=True, arguments={"x-max-length": 2})
    ch.queue_declare(rejecting, exclusive=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.exchange_declare(unique, "fanout", auto_delete=True)
    ch.queue_bind(dropping, unique)
    ch.queue_bind(rejecting, unique)
    outcomes = [publish_confirmed(ch, unique, "", f"m{index}".encode()) for index in range(4)]
    # One queue refusing the message is enough for a nack, even though the other kept it.
    assert outcomes == ["ack", "ack", "nack", "nack"]
    assert get_all(ch, dropping) == [b"m2", b"m3"]
    assert get_all(ch, rejecting) == [b"m0", b"m1"]


def test_max_length_bytes_counts_body_bytes(confirmed, unique):
    ch = confirmed
    ch.queue_declare(unique, exclusive=True, arguments={"x-max-length-bytes": 10})
    for index in range(4):
        ch.basic_publish("", unique, f"{index}abcd".encode())  # 5 bytes each: two fit
    assert get_all(ch, unique) == [b"2abcd", b"3abcd"]


def test_max_length_zero_drops_everything_yet_confirms(confirmed, unique):
    ch = confirmed
    ch.queue_declare(unique, exclusive=True, arguments={"x-max-length": 0})
    assert publish_confirmed(ch, "", unique, b"gone") == "ack"
    assert get_all(ch, unique) == []


def test_a_requeue_beyond_the_limit_drops_the_oldest(confirmed, unique):
    ch = confirmed
    ch.queue_declare(unique, exclusive=True, arguments={"x-max-length": 2})
    ch.basic_publish("", unique, b"a1")
    ch.basic_publish("", unique, b"a2")
    method, _properties, _body = ch.basic_get(unique)
    ch.basic_publish("", unique, b"a3")
    ch.basic_nack(method.delivery_tag, requeue=True)  # a1 returns to the head: three are ready, one too many
    assert get_all(ch, unique) == [b"a2", b"a3"]


def test_unacked_messages_do_not_count(confirmed, unique):
    ch = confirmed
    ch.queue_declare(unique, exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert publish_confirmed(ch, "", unique, b"first") == "ack"
    method, _properties, body = ch.basic_get(unique)  # delivered, not acked: no longer ready
    assert publish_confirmed(ch, "", unique, b"second") == "ack"
    assert publish_confirmed(ch, "", unique, b"third") == "nack"
    ch.basic_ack(method.delivery_tag)
    assert get_all(ch, unique) == [b"second"]
