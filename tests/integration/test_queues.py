"""queue.declare / bind / unbind / purge / delete as RabbitMQ answers them, including its reply texts."""

from __future__ import annotations

import re

import pytest

from tests.integration.helpers import (
    channel_error, connect, declare_queue, fresh, get_all, rabbitmq4, reply_text, wait_until,
)

LOCKED_TEXT = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{}' in vhost '/'. It could be originally "
          "declared on another connection or the exclusive property value does not match that of the original "
          "declaration.")


def locked(queue: str) -> str:
    return reply_text(LOCKED_TEXT.format(queue))


def queue_exists(channel, name: str) -> bool:
    probe = fresh(channel)
    try:
        probe.queue_declare(name, passive=True)
    except Exception as error:  # pika raises ChannelClosedByBroker(404, ...)
        assert getattr(error, "reply_code", None) == 404, error
        return False
    probe.close()
    return True


def test_server_named_queues_start_with_amq_gen(channel):
    first = channel.queue_declare("", exclusive=True).method.queue
    second = channel.queue_declare("", exclusive=True).method.queue
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", first), first
    assert first != second
    channel.basic_publish("", first, b"reachable by its name")
    assert get_all(channel, first) == [b"reachable by its name"]


def test_declare_ok_counts_ready_messages_and_consumers(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.confirm_delivery()  # a confirmed message is in the queue
    for index in range(3):
        channel.basic_publish("", queue, str(index).encode())
    ok = channel.queue_declare(queue, exclusive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    channel.basic_qos(prefetch_count=1)
    delivered = []
    channel.basic_consume(queue, lambda _channel, method, _properties, body: delivered.append(body))
    wait_until(channel.connection, lambda: len(delivered) == 1)
    ok = channel.queue_declare(queue, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)  # the unacked delivery is not ready


def test_passive_declare_of_a_missing_queue_is_404(channel, unique):
    assert channel_error(lambda: channel.queue_declare(unique, passive=True)) == (
        404, f"NOT_FOUND - no queue '{unique}' in vhost '/'")


def test_passive_declare_ignores_flags_and_reports_counts(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.confirm_delivery()  # counts are taken once the queue has the messages
    channel.basic_publish("", queue, b"one")
    channel.basic_publish("", queue, b"two")
    ok = channel.queue_declare(queue, passive=True, durable=True, exclusive=False).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 2, 0)


def test_amq_prefix_is_reserved(channel, unique):
    name = f"amq.{unique}"
    assert channel_error(lambda: channel.queue_declare(name)) == (
        403, f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'")
    assert channel_error(lambda: fresh(channel).queue_declare(name, passive=True)) == (
        404, f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_durable_queue_redeclares_and_deletes(channel, unique):
    ok = channel.queue_declare(unique, durable=True).method
    try:
        assert (ok.queue, ok.message_count, ok.consumer_count) == (unique, 0, 0)
        channel.queue_declare(unique, durable=True)
    finally:
        fresh(channel).queue_delete(unique)


@pytest.mark.parametrize("flag, current, received", [
    ("durable", "false", "true"),
    ("auto_delete", "true", "false"),
])
def test_inequivalent_flag_on_redeclare_is_406(channel, unique, flag, current, received):
    channel.queue_declare(unique, auto_delete=True)
    flags = {"auto_delete": True, flag: received == "true"}
    assert channel_error(lambda: channel.queue_declare(unique, **flags)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg '{flag}' for queue '{unique}' in vhost '/': "
             f"received '{received}' but current is '{current}'")
    fresh(channel).queue_delete(unique)


@pytest.mark.parametrize("declared, redeclared, text", [
    ({"x-max-length": 10}, {"x-max-length": 11}, "received '11' but current is '10'"),
    ({"x-max-length": 10}, {}, "received none but current is the value '10' of type 'signedint'"),
    ({}, {"x-max-length": 5}, "received the value '5' of type 'signedint' but current is none"),
], ids=["different", "missing", "added"])
def test_inequivalent_argument_on_redeclare_is_406(channel, unique, declared, redeclared, text):
    channel.queue_declare(unique, auto_delete=True, arguments=declared)
    assert channel_error(lambda: channel.queue_declare(unique, auto_delete=True, arguments=redeclared)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{unique}' in vhost '/': {text}")
    fresh(channel).queue_delete(unique)


def test_unknown_arguments_are_not_compared_on_redeclare(channel, unique):
    channel.queue_declare(unique, auto_delete=True, arguments={"x-max-length": 10})
    channel.queue_declare(unique, auto_delete=True, arguments={"x-max-length": 10, "x-custom": "anything"})
    channel.queue_delete(unique)


@pytest.mark.parametrize("arguments, reason", [
    ({"x-max-length": -1}, "{value_negative,-1}"),
    ({"x-max-length": "ten"}, '"expected integer, got longstr"'),
    ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ({"x-expires": 0}, "{value_zero,0}"),
    ({"x-max-length-bytes": -1}, "{value_negative,-1}"),
    ({"x-max-priority": 300}, "{max_value_exceeded,300}"),
    ({"x-overflow": "explode"}, "invalid_overflow"),
    ({"x-dead-letter-routing-key": "key"}, "routing_key_but_no_dlx_defined"),
    ({"x-single-active-consumer": "yes"}, "{unacceptable_type,longstr}"),
], ids=lambda value: str(value))
def test_invalid_queue_arguments_are_406(channel, unique, arguments, reason):
    (name,) = arguments
    assert channel_error(lambda: channel.queue_declare(unique, auto_delete=True, arguments=arguments)) == (
        406, f"PRECONDITION_FAILED - invalid arg '{name}' for queue '{unique}' in vhost '/': {reason}")
    assert not queue_exists(channel, unique)


def refused_locator(channel, unique: str, arguments: dict) -> tuple[int, str]:
    arguments = {**arguments, "x-queue-leader-locator": "nearby"}
    return channel_error(lambda: fresh(channel).queue_declare(unique, durable=True, arguments=arguments))


LOCATOR_REFUSED = "PRECONDITION_FAILED - invalid arg 'x-queue-leader-locator' for queue '{}' in vhost '/': " \
                  "invalid_queue_locator_arg"


@rabbitmq4
def test_a_classic_queue_takes_a_leader_locator_and_compares_it_on_redeclare(channel, unique):
    assert refused_locator(channel, unique, {}) == (406, LOCATOR_REFUSED.format(unique))
    channel.queue_declare(unique, auto_delete=True, arguments={"x-queue-leader-locator": "balanced"})
    assert channel_error(lambda: fresh(channel).queue_declare(
        unique, auto_delete=True, arguments={"x-queue-leader-locator": "client-local"})) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-leader-locator' for queue '{unique}' in vhost '/': "
             "received 'client-local' but current is 'balanced'")
    channel.queue_delete(unique)


def test_a_quorum_queue_refuses_an_unknown_leader_locator(channel, unique):
    assert refused_locator(channel, unique, {"x-queue-type": "quorum"}) == (406, LOCATOR_REFUSED.format(unique))
    assert not queue_exists(channel, unique)


def test_dead_letter_exchange_argument_must_be_a_string(channel, unique):
    assert channel_error(lambda: channel.queue_declare(
        unique, auto_delete=True, arguments={"x-dead-letter-exchange": 5})) == (
        406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' "
             f"in queue '{unique}' in vhost '/'")


def test_exclusive_queue_is_locked_to_its_connection(broker, channel, unique):
    channel.queue_declare(unique, exclusive=True)
    other = connect(broker)
    try:
        attempts = {
            "declare": lambda ch: ch.queue_declare(unique, exclusive=True),
            "passive declare": lambda ch: ch.queue_declare(unique, passive=True),
            "declare not exclusive": lambda ch: ch.queue_declare(unique),
            "bind": lambda ch: ch.queue_bind(unique, "amq.direct", "key"),
            "get": lambda ch: ch.basic_get(unique),
            "consume": lambda ch: ch.basic_consume(unique, lambda *args: None),
            "purge": lambda ch: ch.queue_purge(unique),
            "delete": lambda ch: ch.queue_delete(unique),
        }
        outcomes = {name: channel_error(lambda: attempt(other.channel())) for name, attempt in attempts.items()}
        assert outcomes == dict.fromkeys(attempts, (405, locked(unique)))
    finally:
        other.close()
    channel.basic_publish("", unique, b"owner still uses it")
    assert get_all(channel, unique) == [b"owner still uses it"]


def test_exclusive_flag_mismatch_on_the_owning_connection_is_405(channel, unique):
    channel.queue_declare(unique, exclusive=True)
    assert channel_error(lambda: channel.queue_declare(unique)) == (405, locked(unique))


def test_reply_texts_longer_than_a_shortstr_are_cut_with_an_ellipsis(channel):
    name = "q" * 60
    channel.queue_declare(name, exclusive=True)
    code, text = channel_error(lambda: channel.queue_declare(name))
    assert (code, len(text.encode())) == (405, 255)
    assert text == LOCKED_TEXT.format(name)[:252] + "..."


def test_exclusive_queue_goes_with_its_connection(broker, channel, unique):
    owner = connect(broker)
    owner.channel().queue_declare(unique, exclusive=True)
    owner.close()
    assert not queue_exists(channel, unique)


def test_auto_delete_queue_stays_until_its_first_consumer_leaves(channel, unique):
    channel.queue_declare(unique, auto_delete=True)
    assert queue_exists(channel, unique)  # never consumed: stays
    first = channel.basic_consume(unique, lambda *args: None)
    second = channel.basic_consume(unique, lambda *args: None)
    channel.basic_cancel(first)
    assert queue_exists(channel, unique)  # one consumer left
    channel.basic_cancel(second)
    assert not queue_exists(channel, unique)


def test_auto_delete_queue_goes_when_its_consumers_channel_closes(channel, unique):
    consumer_channel = fresh(channel)
    consumer_channel.queue_declare(unique, auto_delete=True)
    consumer_channel.basic_consume(unique, lambda *args: None)
    consumer_channel.close()
    assert not queue_exists(channel, unique)


def test_bind_and_unbind(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.queue_bind(queue, "amq.direct", unique)
    channel.basic_publish("amq.direct", unique, b"bound")
    channel.queue_unbind(queue, "amq.direct", unique)
    channel.basic_publish("amq.direct", unique, b"unbound")
    assert get_all(channel, queue) == [b"bound"]


def test_binding_twice_is_one_binding(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.queue_bind(queue, "amq.direct", unique)
    channel.queue_bind(queue, "amq.direct", unique)
    channel.queue_unbind(queue, "amq.direct", unique)
    channel.basic_publish("amq.direct", unique, b"no binding left")
    assert get_all(channel, queue) == []


def test_bind_to_missing_queue_or_exchange_is_404(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    assert channel_error(lambda: channel.queue_bind(f"{unique}-missing", "amq.direct", "key")) == (
        404, f"NOT_FOUND - no queue '{unique}-missing' in vhost '/'")
    assert channel_error(lambda: fresh(channel).queue_bind(queue, f"{unique}-missing", "key")) == (
        404, f"NOT_FOUND - no exchange '{unique}-missing' in vhost '/'")


def test_unbind_of_a_missing_binding_queue_or_exchange_is_ok(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.queue_unbind(queue, "amq.direct", "never-bound")
    channel.queue_unbind(f"{unique}-missing", "amq.direct", "key")
    channel.queue_unbind(queue, f"{unique}-missing", "key")


def test_unbinding_another_connections_exclusive_queue_is_405_only_where_there_is_a_binding(broker, channel, unique):
    owner = connect(broker)
    owner_channel = owner.channel()
    owner_channel.queue_declare(unique, exclusive=True)
    owner_channel.queue_bind(unique, "amq.direct", "bound")
    channel.queue_unbind(unique, "amq.direct", "not-bound")  # nothing to remove: nothing to refuse
    assert channel_error(lambda: channel.queue_unbind(unique, "amq.direct", "bound")) == (405, locked(unique))
    owner.close()


def test_default_exchange_bindings_cannot_be_changed(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    text = "ACCESS_REFUSED - operation not permitted on the default exchange"
    assert channel_error(lambda: channel.queue_bind(queue, "", "other")) == (403, text)
    assert channel_error(lambda: fresh(channel).queue_unbind(queue, "", queue)) == (403, text)


def test_purge_returns_the_number_of_ready_messages(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.confirm_delivery()
    for index in range(4):
        channel.basic_publish("", queue, str(index).encode())
    assert channel.queue_purge(queue).method.message_count == 4
    assert channel.queue_purge(queue).method.message_count == 0
    assert get_all(channel, queue) == []


def test_purge_keeps_unacked_messages(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.confirm_delivery()
    for body in (b"taken", b"ready-1", b"ready-2"):
        channel.basic_publish("", queue, body)
    taken = channel.basic_get(queue)[0]
    assert channel.queue_purge(queue).method.message_count == 2
    channel.basic_nack(taken.delivery_tag, requeue=True)
    message = channel.basic_get(queue, auto_ack=True)
    assert (message[2], message[0].redelivered) == (b"taken", True)


def test_purge_of_a_missing_queue_is_404(channel, unique):
    assert channel_error(lambda: channel.queue_purge(unique)) == (404, f"NOT_FOUND - no queue '{unique}' in vhost '/'")


def test_delete_returns_the_message_count_and_removes_the_queue(channel, unique):
    channel.queue_declare(unique)
    channel.confirm_delivery()
    channel.basic_publish("", unique, b"a")
    channel.basic_publish("", unique, b"b")
    assert channel.queue_delete(unique).method.message_count == 2
    assert not queue_exists(channel, unique)


def test_delete_of_a_missing_queue_is_ok(channel, unique):
    assert channel.queue_delete(unique).method.message_count == 0


def test_delete_if_empty_refuses_a_queue_with_messages(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"still here")
    assert channel_error(lambda: channel.queue_delete(queue, if_empty=True)) == (
        406, f"PRECONDITION_FAILED - queue '{queue}' in vhost '/' not empty")
    retry = fresh(channel)
    assert get_all(retry, queue) == [b"still here"]
    retry.queue_delete(queue, if_empty=True)
    assert not queue_exists(channel, queue)


def test_delete_if_unused_refuses_a_queue_with_consumers(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    tag = channel.basic_consume(queue, lambda *args: None)
    assert channel_error(lambda: fresh(channel).queue_delete(queue, if_unused=True)) == (
        406, f"PRECONDITION_FAILED - queue '{queue}' in vhost '/' in use")
    channel.basic_cancel(tag)
    channel.queue_delete(queue, if_unused=True)
    assert not queue_exists(channel, queue)


def test_deleting_a_queue_removes_its_bindings(channel, unique):
    channel.queue_declare(unique)
    channel.queue_bind(unique, "amq.direct", unique)
    channel.queue_delete(unique)
    queue = declare_queue(channel, unique, exclusive=True)  # same name, new queue
    channel.basic_publish("amq.direct", unique, b"old binding is gone")
    assert get_all(channel, queue) == []


def test_consumer_count_follows_consumers(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    tags = [channel.basic_consume(queue, lambda *args: None) for _ in range(3)]
    assert channel.queue_declare(queue, passive=True).method.consumer_count == 3
    channel.basic_cancel(tags[0])
    assert channel.queue_declare(queue, passive=True).method.consumer_count == 2


def test_queue_and_exchange_names_may_hold_any_character(channel, unique):
    """RabbitMQ takes any name: the replies that carry one (declare-ok, get-ok) name it as it is."""
    queue, exchange = f'{unique}-q{{<"é">}}', f'{unique}-x{{<"é">}}'
    assert channel.queue_declare(queue, exclusive=True).method.queue == queue
    channel.exchange_declare(exchange, "fanout", auto_delete=True)
    channel.queue_bind(queue, exchange)
    channel.basic_publish(exchange, "", b"m")
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (method.exchange, body) == (exchange, b"m")
    channel.exchange_delete(exchange)
