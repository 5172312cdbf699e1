"""Policies and operator policies set through the management API, observed by AMQP clients: dead-lettering, length
limits and alternate exchanges come from the policy that applies, at once for queues and exchanges that exist."""

import re

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    channel_error, connect, declare_queue, get_all, message_count, publish, wait_until,
)


@pytest.fixture
def policies(broker):
    """Set policies (kind "operator-policies" for operator policies); they are cleared at the end of the test."""
    made: list[tuple[str, str]] = []

    def set_policy(name, pattern, definition, priority=0, apply_to="all", kind="policies"):
        management.set_policy(broker, "/", name, pattern, definition, priority, apply_to, kind)
        made.append((name, kind))

    yield set_policy
    for name, kind in made:
        management.clear_policy(broker, "/", name, kind)


def rejected_into(ch, queue: str) -> None:
    """Take the next message of queue and reject it without requeue (it is dead-lettered)."""
    method, _, _ = ch.basic_get(queue)
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=False)


def fanout_to_queue(ch, name: str) -> str:
    ch.exchange_declare(name, "fanout", auto_delete=True)
    queue = declare_queue(ch, name + ".q", exclusive=True)
    ch.queue_bind(queue, name)
    return queue


def test_a_policy_dead_letter_exchange_is_overridden_by_the_queue_argument(broker, conn, policies, unique):
    ch = conn.channel()
    by_policy = fanout_to_queue(ch, f"{unique}.dlx-policy")
    by_argument = fanout_to_queue(ch, f"{unique}.dlx-argument")
    policies(f"{unique}-dlx", f"^{re.escape(unique)}\\.work", {"dead-letter-exchange": f"{unique}.dlx-policy"},
             apply_to="queues")
    plain = declare_queue(ch, f"{unique}.work-plain", exclusive=True)
    own = declare_queue(ch, f"{unique}.work-own", exclusive=True,
                        arguments={"x-dead-letter-exchange": f"{unique}.dlx-argument"})
    publish(ch, plain, [b"to-policy-dlx"])
    publish(ch, own, [b"to-argument-dlx"])
    rejected_into(ch, plain)
    rejected_into(ch, own)
    wait_until(conn, lambda: message_count(ch, by_policy) + message_count(ch, by_argument) == 2)
    assert get_all(ch, by_policy) == [b"to-policy-dlx"]
    assert get_all(ch, by_argument) == [b"to-argument-dlx"]


def test_a_changed_policy_dead_letters_the_next_message_to_its_new_exchange(broker, conn, policies, unique):
    ch = conn.channel()
    first = fanout_to_queue(ch, f"{unique}.dlx-1")
    second = fanout_to_queue(ch, f"{unique}.dlx-2")
    pattern = f"^{re.escape(unique)}\\.work$"
    policies(f"{unique}-dlx", pattern, {"dead-letter-exchange": f"{unique}.dlx-1"}, apply_to="queues")
    work = declare_queue(ch, f"{unique}.work", exclusive=True)
    publish(ch, work, [b"one", b"two"])
    rejected_into(ch, work)
    wait_until(conn, lambda: message_count(ch, first) == 1)
    policies(f"{unique}-dlx", pattern, {"dead-letter-exchange": f"{unique}.dlx-2"}, apply_to="queues")
    rejected_into(ch, work)
    wait_until(conn, lambda: message_count(ch, second) == 1)
    assert get_all(ch, first) == [b"one"] and get_all(ch, second) == [b"two"]


def test_a_lower_max_length_policy_drops_the_oldest_messages_at_once(broker, conn, policies, unique):
    ch = conn.channel()
    queue = declare_queue(ch, f"{unique}.q", exclusive=True)
    publish(ch, queue, [b"1", b"2", b"3", b"4", b"5"])
    wait_until(conn, lambda: message_count(ch, queue) == 5)  # RabbitMQ may count before its queue has them all
    policies(f"{unique}-limit", f"^{re.escape(unique)}\\.q$", {"max-length": 2})
    wait_until(conn, lambda: message_count(ch, queue) == 2)
    assert get_all(ch, queue) == [b"4", b"5"]


def test_the_lower_of_argument_and_policy_limits_applies_and_the_arguments_overflow_wins(broker, conn, policies,
                                                                                          unique):
    """As RabbitMQ: for max-length (and message-ttl, expires) the lower value applies, not the argument's."""
    policies(f"{unique}-limit", f"^{re.escape(unique)}\\.q$", {"max-length": 2, "overflow": "drop-head"})
    ch = conn.channel()
    queue = declare_queue(ch, f"{unique}.q", exclusive=True,
                          arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    refused = 0
    for body in (b"1", b"2", b"3", b"4"):
        try:
            ch.basic_publish("", queue, body)
        except pika.exceptions.NackError:
            refused += 1
    assert refused == 2
    assert get_all(ch, queue) == [b"1", b"2"]


def test_of_two_matching_policies_the_higher_priority_applies(broker, conn, policies, unique):
    pattern = f"^{re.escape(unique)}\\."
    policies(f"{unique}-low", pattern, {"max-length": 1}, priority=1)
    policies(f"{unique}-high", pattern, {"max-length": 3}, priority=5)
    ch = conn.channel()
    queue = declare_queue(ch, f"{unique}.q", exclusive=True)
    publish(ch, queue, [b"1", b"2", b"3", b"4", b"5"])
    assert get_all(ch, queue) == [b"3", b"4", b"5"]


def test_an_operator_policy_caps_the_policys_max_length(broker, conn, policies, unique):
    pattern = f"^{re.escape(unique)}\\."
    policies(f"{unique}-policy", pattern, {"max-length": 10})
    policies(f"{unique}-operator", pattern, {"max-length": 2}, apply_to="queues", kind="operator-policies")
    ch = conn.channel()
    queue = declare_queue(ch, f"{unique}.q", exclusive=True)
    publish(ch, queue, [b"1", b"2", b"3", b"4", b"5"])
    assert get_all(ch, queue) == [b"4", b"5"]


def test_a_policy_for_exchanges_gives_an_alternate_exchange(broker, conn, policies, unique):
    ch = conn.channel()
    alternate = fanout_to_queue(ch, f"{unique}.ae")
    ch.exchange_declare(f"{unique}.x", "direct", auto_delete=True)
    ch.queue_bind(declare_queue(ch, exclusive=True), f"{unique}.x", "bound")  # keeps the exchange alive
    policies(f"{unique}-ae", f"^{re.escape(unique)}\\.x$", {"alternate-exchange": f"{unique}.ae"},
             apply_to="exchanges")
    ch.basic_publish(f"{unique}.x", "bound", b"routed")
    ch.basic_publish(f"{unique}.x", "nowhere", b"unroutable")
    wait_until(conn, lambda: message_count(ch, alternate) == 1)
    assert get_all(ch, alternate) == [b"unroutable"]


def test_a_queue_redeclared_without_its_policy_keys_is_still_equivalent(broker, conn, policies, unique):
    policies(f"{unique}-limit", f"^{re.escape(unique)}\\.q$", {"max-length": 2, "message-ttl": 60000})
    ch = conn.channel()
    queue = declare_queue(ch, f"{unique}.q", arguments={"x-max-length": 10})
    try:
        assert ch.queue_declare(queue, arguments={"x-max-length": 10}).method.queue == queue
        code, text = channel_error(lambda: ch.queue_declare(queue, arguments={"x-max-length": 2}))
        assert code == 406 and text.startswith(f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue "
                                               f"'{queue}'")
    finally:
        conn.channel().queue_delete(queue)


def test_a_policy_survives_a_restart(own_broker, unique):
    broker = own_broker()
    management.set_policy(broker, "/", "limit", "^limited", {"max-length": 1})
    with connect(broker) as conn:
        conn.channel().queue_declare("limited-before", durable=True)
    broker.restart()
    with connect(broker) as conn:
        ch = conn.channel()
        for queue in ("limited-before", "limited-after"):
            ch.queue_declare(queue, durable=True)
            publish(ch, queue, [b"1", b"2", b"3"], properties=pika.BasicProperties(delivery_mode=2))
            assert get_all(ch, queue) == [b"3"]


def test_a_max_length_bytes_policy_is_a_streams_retention(broker, conn, policies, unique):
    """For a stream the policy's max-length-bytes wins over the argument (RabbitMQ's precedence for streams): the
    oldest segments go once the stream outgrows it."""
    channel = conn.channel()
    declare_queue(channel, unique, durable=True, arguments={
        "x-queue-type": "stream", "x-max-length-bytes": 10_000_000, "x-stream-max-segment-size-bytes": 1000})
    policies(f"{unique}-retention", f"^{re.escape(unique)}$", {"max-length-bytes": 5000}, apply_to="queues")
    publisher = conn.channel()
    publisher.confirm_delivery()
    for start in range(0, 200, 20):
        for number in range(start, start + 20):
            publisher.basic_publish("", unique, f"m{number}".encode())
    seen = []
    reader = conn.channel()
    reader.basic_qos(prefetch_count=500)
    reader.basic_consume(unique, lambda ch, method, properties, body: seen.append(body),
                         arguments={"x-stream-offset": "first"})
    wait_until(conn, lambda: seen and seen[-1] == b"m199")
    assert 0 < len(seen) < 100  # about 5,000 bytes of the newest messages
    channel.queue_delete(unique)
