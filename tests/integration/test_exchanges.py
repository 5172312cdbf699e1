"""exchange.declare / delete / bind / unbind as RabbitMQ answers them, including its reply texts."""

from __future__ import annotations

import pytest

from tests.integration.helpers import channel_error, declare_queue, fresh, get_all, rabbitmq4


def exists(channel, exchange: str) -> bool:
    probe = fresh(channel)
    try:
        probe.exchange_declare(exchange, passive=True)
    except Exception as error:  # pika raises ChannelClosedByBroker(404, ...)
        assert getattr(error, "reply_code", None) == 404, error
        return False
    probe.close()
    return True


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type_and_find_it_passively(channel, unique, kind):
    name = f"{unique}-{kind}"
    channel.exchange_declare(name, kind, durable=True)
    try:
        channel.exchange_declare(name, kind, durable=True)  # an identical redeclare is fine
        channel.exchange_declare(name, passive=True)  # passive ignores type and flags
        channel.exchange_declare(name, "fanout" if kind != "fanout" else "direct", passive=True)
    finally:
        channel.exchange_delete(name)
    assert not exists(channel, name)


def test_passive_declare_of_a_missing_exchange_is_404(channel, unique):
    assert channel_error(lambda: channel.exchange_declare(unique, passive=True)) == (
        404, f"NOT_FOUND - no exchange '{unique}' in vhost '/'")


@pytest.mark.parametrize("name, kind", [
    ("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"), ("amq.headers", "headers"),
    ("amq.match", "headers"),
])
def test_predeclared_amq_exchanges_exist_and_are_durable(channel, name, kind):
    channel.exchange_declare(name, passive=True)
    channel.exchange_declare(name, kind, durable=True)  # redeclaring with their own properties is allowed


def test_predeclared_exchange_redeclared_differently_is_406(channel):
    assert channel_error(lambda: channel.exchange_declare("amq.direct", "fanout", durable=True)) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'amq.direct' in vhost '/': "
             "received 'fanout' but current is 'direct'")


def test_amq_prefix_is_reserved(channel, unique):
    name = f"amq.{unique}"
    assert channel_error(lambda: channel.exchange_declare(name, "direct")) == (
        403, f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'")
    assert channel_error(lambda: fresh(channel).exchange_declare(name, passive=True)) == (
        404, f"NOT_FOUND - no exchange '{name}' in vhost '/'")


def test_default_exchange_cannot_be_declared_deleted_or_bound(channel):
    text = "ACCESS_REFUSED - operation not permitted on the default exchange"
    assert channel_error(lambda: channel.exchange_declare("", "direct")) == (403, text)
    assert channel_error(lambda: fresh(channel).exchange_declare("", passive=True)) == (403, text)
    assert channel_error(lambda: fresh(channel).exchange_delete("")) == (403, text)
    assert channel_error(lambda: fresh(channel).exchange_bind("amq.direct", "", "key")) == (403, text)
    assert channel_error(lambda: fresh(channel).exchange_bind("", "amq.direct", "key")) == (403, text)


def test_predeclared_exchanges_cannot_be_deleted(channel):
    assert channel_error(lambda: channel.exchange_delete("amq.topic")) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.topic' in vhost '/' not allowed")


@pytest.mark.parametrize("flag, current, received", [
    ("durable", "false", "true"),
    ("auto_delete", "true", "false"),
    ("internal", "false", "true"),
])
def test_inequivalent_flag_on_redeclare_is_406(channel, unique, flag, current, received):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    flags = {"auto_delete": True, flag: received == "true"}
    assert channel_error(lambda: channel.exchange_declare(unique, "direct", **flags)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg '{flag}' for exchange '{unique}' in vhost '/': "
             f"received '{received}' but current is '{current}'")
    fresh(channel).exchange_delete(unique)


def test_inequivalent_type_on_redeclare_is_406(channel, unique):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    assert channel_error(lambda: channel.exchange_declare(unique, "topic", auto_delete=True)) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{unique}' in vhost '/': "
             "received 'topic' but current is 'direct'")
    fresh(channel).exchange_delete(unique)


def test_only_alternate_exchange_counts_among_arguments_on_redeclare(channel, unique):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    channel.exchange_declare(unique, "direct", auto_delete=True, arguments={"x-anything": "ignored"})
    assert channel_error(lambda: channel.exchange_declare(
        unique, "direct", auto_delete=True, arguments={"alternate-exchange": "elsewhere"})) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{unique}' in vhost '/': "
             "received the value 'elsewhere' of type 'longstr' but current is none")
    fresh(channel).exchange_delete(unique)


def test_alternate_exchange_argument_must_be_a_string(channel, unique):
    assert channel_error(lambda: channel.exchange_declare(
        unique, "direct", auto_delete=True, arguments={"alternate-exchange": 5})) == (
        406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' "
             f"in exchange '{unique}' in vhost '/'")


@rabbitmq4
def test_unknown_type_closes_the_channel_with_406(channel, unique):
    # RabbitMQ 4.x (rabbit_exchange:check_type) raises precondition_failed, a channel error; 3.x closed the whole
    # connection with 503 "COMMAND_INVALID - unknown exchange type '...'". Today's clients expect the 4.x behaviour.
    assert channel_error(lambda: channel.exchange_declare(unique, "x-no-such-type")) == (
        406, "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'")
    assert fresh(channel).is_open


def test_delete_of_a_missing_exchange_is_ok(channel, unique):
    channel.exchange_delete(unique)
    channel.exchange_delete(unique, if_unused=True)


def test_delete_if_unused_refuses_an_exchange_with_bindings(channel, unique):
    channel.exchange_declare(unique, "direct")
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, unique, "key")
    assert channel_error(lambda: channel.exchange_delete(unique, if_unused=True)) == (
        406, f"PRECONDITION_FAILED - exchange '{unique}' in vhost '/' in use")
    retry = fresh(channel)
    retry.queue_unbind(queue, unique, "key")
    retry.exchange_delete(unique, if_unused=True)
    assert not exists(channel, unique)


def test_delete_if_unused_ignores_bindings_where_the_exchange_is_the_destination(channel, unique):
    channel.exchange_declare(unique, "fanout")
    channel.exchange_bind(unique, "amq.fanout")
    channel.exchange_delete(unique, if_unused=True)
    assert not exists(channel, unique)


def test_delete_removes_bindings_and_unconditional_delete_works_with_bindings(channel, unique):
    channel.exchange_declare(unique, "fanout")
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, unique)
    channel.exchange_delete(unique)
    channel.exchange_declare(unique, "fanout", auto_delete=True)  # recreated: the old binding is gone
    channel.basic_publish(unique, "", b"lost")
    assert get_all(channel, queue) == []
    channel.exchange_delete(unique)


def test_exchange_to_exchange_binding_routes_and_unbinding_stops_it(channel, unique):
    source, destination = f"{unique}-src", f"{unique}-dst"
    channel.exchange_declare(source, "topic")
    channel.exchange_declare(destination, "fanout")
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, destination)
    channel.exchange_bind(destination, source, "orders.*")
    channel.basic_publish(source, "orders.new", b"matched")
    channel.basic_publish(source, "invoices.new", b"not matched")
    assert get_all(channel, queue) == [b"matched"]
    channel.exchange_unbind(destination, source, "orders.*")
    channel.basic_publish(source, "orders.new", b"after unbind")
    assert get_all(channel, queue) == []
    channel.exchange_delete(source)
    channel.exchange_delete(destination)


def test_exchange_bind_to_a_missing_exchange_is_404(channel, unique):
    assert channel_error(lambda: channel.exchange_bind("amq.direct", unique, "key")) == (
        404, f"NOT_FOUND - no exchange '{unique}' in vhost '/'")
    assert channel_error(lambda: fresh(channel).exchange_bind(unique, "amq.direct", "key")) == (
        404, f"NOT_FOUND - no exchange '{unique}' in vhost '/'")


def test_exchange_unbind_of_a_missing_binding_or_exchange_is_ok(channel, unique):
    channel.exchange_unbind("amq.fanout", "amq.direct", unique)
    channel.exchange_unbind("amq.fanout", unique, "key")


def test_auto_delete_exchange_stays_until_it_had_a_binding(channel, unique):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    assert exists(channel, unique)  # never bound: still there
    channel.exchange_delete(unique)


def test_auto_delete_exchange_goes_when_its_last_queue_binding_is_removed(channel, unique):
    channel.exchange_declare(unique, "direct", auto_delete=True)
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, unique, "a")
    channel.queue_bind(queue, unique, "b")
    channel.queue_unbind(queue, unique, "a")
    assert exists(channel, unique)  # one binding left
    channel.queue_unbind(queue, unique, "b")
    assert not exists(channel, unique)


def test_auto_delete_exchange_goes_when_its_bound_queue_is_deleted(channel, unique):
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, unique)
    channel.queue_delete(queue)
    assert not exists(channel, unique)


def test_auto_delete_exchange_goes_when_its_last_exchange_binding_is_removed(channel, unique):
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    channel.exchange_bind("amq.fanout", unique)  # unique is the source
    channel.exchange_unbind("amq.fanout", unique)
    assert not exists(channel, unique)


def test_auto_delete_exchange_is_not_removed_by_bindings_where_it_is_the_destination(channel, unique):
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    channel.exchange_bind(unique, "amq.fanout")  # unique is the destination
    channel.exchange_unbind(unique, "amq.fanout")
    assert exists(channel, unique)
    channel.exchange_delete(unique)


def test_internal_exchange_routes_what_other_exchanges_forward(channel, unique):
    internal = f"{unique}-internal"
    channel.exchange_declare(internal, "fanout", auto_delete=True, internal=True)
    channel.exchange_declare(unique, "fanout", auto_delete=True)
    channel.exchange_bind(internal, unique)
    queue = declare_queue(channel, exclusive=True)
    channel.queue_bind(queue, internal)
    channel.basic_publish(unique, "", b"forwarded")
    assert get_all(channel, queue) == [b"forwarded"]
    channel.exchange_delete(unique)
    channel.exchange_delete(internal)
