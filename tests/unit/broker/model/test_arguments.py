"""Expected texts were read from a RabbitMQ 3.10.8 node: pika declared each case and printed the channel.close."""

import datetime
import decimal

import pytest

from broker.model.arguments import (
    ArgumentError,
    check_exchange_equivalent,
    check_queue_equivalent,
    validate_exchange_arguments,
    validate_queue_arguments,
)
from protocol.erlang_terms import amqp_type_name, erlang_term

QUEUE = "queue 'probe-q' in vhost '/'"


def refusal(call, *args) -> ArgumentError:
    with pytest.raises(ArgumentError) as caught:
        call(*args)
    return caught.value


def queue_refusal(arguments: dict) -> str:
    error = refusal(validate_queue_arguments, "probe-q", "/", arguments)
    assert error.reply_code == 406
    return error.reply_text


@pytest.mark.parametrize(
    "arguments, reason",
    [
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
        ({"x-message-ttl": "abc"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": 315360000001}, "{value_too_large,315360000001}"),
        ({"x-message-ttl": True}, '"expected integer, got bool"'),
        ({"x-message-ttl": bytearray(b"ab")}, '"expected integer, got binary"'),
        ({"x-message-ttl": {"a": 1}}, '"expected integer, got table"'),
        ({"x-message-ttl": [1, "a"]}, '"expected integer, got array"'),
        ({"x-message-ttl": None}, '"expected integer, got void"'),
        ({"x-message-ttl": datetime.datetime(2020, 1, 1)}, '"expected integer, got timestamp"'),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-expires": -5}, "{value_negative,-5}"),
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-max-length": decimal.Decimal("1.5")}, '"expected integer, got decimal"'),
        ({"x-max-length-bytes": "1"}, '"expected integer, got longstr"'),
        ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
        ({"x-max-priority": -1}, "{value_negative,-1}"),
        ({"x-dead-letter-routing-key": "rk"}, "routing_key_but_no_dlx_defined"),
        ({"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": 5}, "{unacceptable_type,signedint}"),
        ({"x-overflow": "nope"}, "invalid_overflow"),
        ({"x-overflow": 1}, "{unacceptable_type,signedint}"),
        ({"x-queue-mode": "fast"}, "\"unsupported queue mode 'fast'\""),
        ({"x-queue-mode": 'fa"s\\t'}, '"unsupported queue mode \'fa\\"s\\\\t\'"'),
        ({"x-queue-mode": "café"}, "\"unsupported queue mode 'café'\""),
        ({"x-queue-mode": 1}, "{unacceptable_type,signedint}"),
        ({"x-queue-version": 3}, "\"unsupported queue version '3'\""),
        ({"x-queue-type": "fancy"}, "\"unsupported queue type 'fancy'\""),
        ({"x-queue-type": 1}, "{unacceptable_type,signedint}"),
        ({"x-single-active-consumer": 1}, "{unacceptable_type,signedint}"),
        ({"x-single-active-consumer": "true"}, "{unacceptable_type,longstr}"),
    ],
)
def test_invalid_queue_argument(arguments, reason):
    key = list(arguments)[-1]
    assert queue_refusal(arguments) == f"PRECONDITION_FAILED - invalid arg '{key}' for {QUEUE}: {reason}"


def test_first_failing_argument_in_rabbitmq_order_is_reported():
    expected = f"PRECONDITION_FAILED - invalid arg 'x-expires' for {QUEUE}: {{value_zero,0}}"
    assert queue_refusal({"x-message-ttl": -1, "x-expires": 0}) == expected
    assert queue_refusal({"x-max-length": -1, "x-expires": 0}) == expected


@pytest.mark.parametrize("value, type_name", [(5, "signedint"), (bytearray(b"dlx"), "binary")])
def test_dead_letter_exchange_of_the_wrong_type_is_checked_first(value, type_name):
    assert queue_refusal({"x-message-ttl": -1, "x-dead-letter-exchange": value}) == (
        f"PRECONDITION_FAILED - invalid type '{type_name}' for arg 'x-dead-letter-exchange' in {QUEUE}"
    )


@pytest.mark.parametrize(
    "arguments, key, module",
    [
        ({"x-max-age": "1D"}, "x-max-age", "rabbit_classic_queue"),
        ({"x-quorum-initial-group-size": 3}, "x-quorum-initial-group-size", "rabbit_classic_queue"),
        ({"x-dead-letter-strategy": "at-least-once"}, "x-dead-letter-strategy", "rabbit_classic_queue"),
        ({"x-queue-type": "quorum", "x-max-priority": 5}, "x-max-priority", "rabbit_quorum_queue"),
        ({"x-queue-type": "stream", "x-message-ttl": 5}, "x-message-ttl", "rabbit_stream_queue"),
    ],
)
def test_argument_of_another_queue_type(arguments, key, module):
    assert queue_refusal(arguments) == f"PRECONDITION_FAILED - invalid arg '{key}' for {QUEUE} of queue type {module}"


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"x-foo": 1, "bar": "baz"},
        {"x-message-ttl": 0, "x-expires": 1, "x-max-length": 0, "x-max-length-bytes": 10, "x-max-priority": 255},
        {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "rk", "x-overflow": "reject-publish-dlx"},
        {"x-queue-mode": "lazy", "x-queue-version": 2, "x-single-active-consumer": True, "x-queue-type": "classic"},
        {"x-queue-type": "quorum", "x-delivery-limit": 3, "x-dead-letter-strategy": "at-least-once"},
        {"x-message-ttl": 315360000000},
        {"x-queue-leader-locator": "client-local"},  # on a classic queue, as RabbitMQ 4.0 takes it
        {"x-queue-leader-locator": "min-masters", "x-queue-master-locator": "min-masters"},
        {"x-queue-type": "stream", "x-max-age": "7D", "x-queue-leader-locator": "balanced",
         "x-max-length-bytes": 10, "x-stream-max-segment-size-bytes": 3_000_000_000},
    ],
)
def test_valid_queue_arguments_pass(arguments):
    validate_queue_arguments("q", "/", arguments)


@pytest.mark.parametrize("max_age", ["0D", "D", "7d", "7", 7])
def test_invalid_stream_max_age(max_age):
    reason = "{unacceptable_type,signedint}" if isinstance(max_age, int) else "invalid_max_age"
    assert queue_refusal({"x-queue-type": "stream", "x-max-age": max_age}).endswith(f": {reason}")


def test_alternate_exchange_must_be_a_string():
    error = refusal(validate_exchange_arguments, "eq-x2", "/", "direct", {"alternate-exchange": 5})
    assert (error.reply_code, error.reply_text) == (
        406,
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'alternate-exchange' in exchange 'eq-x2' in vhost '/'",
    )
    validate_exchange_arguments("x", "/", "direct", {"alternate-exchange": "ae", "x-anything": [1]})


def queue(durable=False, exclusive=False, auto_delete=False, arguments=None, **extra):
    return dict(durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments=arguments or {}, **extra)


EQ_QUEUE = "queue 'eq-q' in vhost '/'"


@pytest.mark.parametrize(
    "existing, requested, explanation",
    [
        (queue(), queue(durable=True), "inequivalent arg 'durable' for {}: received 'true' but current is 'false'"),
        (queue(durable=True), queue(), "inequivalent arg 'durable' for {}: received 'false' but current is 'true'"),
        (
            queue(),
            queue(auto_delete=True),
            "inequivalent arg 'auto_delete' for {}: received 'true' but current is 'false'",
        ),
        (
            queue(durable=True, auto_delete=True),
            queue(),
            "inequivalent arg 'durable' for {}: received 'false' but current is 'true'",
        ),
        (
            queue(durable=True, arguments={"x-message-ttl": 1}),
            queue(arguments={"x-message-ttl": 2}),
            "inequivalent arg 'durable' for {}: received 'false' but current is 'true'",
        ),
        (
            queue(arguments={"x-message-ttl": 1000}),
            queue(arguments={"x-message-ttl": 2000}),
            "inequivalent arg 'x-message-ttl' for {}: received '2000' but current is '1000'",
        ),
        (
            queue(),
            queue(arguments={"x-message-ttl": 10}),
            "inequivalent arg 'x-message-ttl' for {}: received the value '10' of type 'signedint' but current is none",
        ),
        (
            queue(arguments={"x-message-ttl": 1000}),
            queue(),
            "inequivalent arg 'x-message-ttl' for {}: received none but current is the value '1000' of type 'signedint'",
        ),
        (
            queue(arguments={"x-max-length": 5}),
            queue(arguments={"x-max-length": 2**33}),
            "inequivalent arg 'x-max-length' for {}: received '8589934592' but current is '5'",
        ),
        (
            queue(arguments={"x-dead-letter-exchange": "d"}),
            queue(arguments={"x-dead-letter-exchange": bytearray(b"e")}),
            "inequivalent arg 'x-dead-letter-exchange' for {}: received 'e' but current is 'd'",
        ),
        (
            queue(arguments={"x-single-active-consumer": True}),
            queue(arguments={"x-single-active-consumer": False}),
            "inequivalent arg 'x-single-active-consumer' for {}: received 'false' but current is 'true'",
        ),
        (
            queue(arguments={"x-single-active-consumer": True}),
            queue(),
            "inequivalent arg 'x-single-active-consumer' for {}: received none but current is the value 'true' of type 'bool'",
        ),
        (
            queue(arguments={"x-queue-mode": "lazy"}),
            queue(arguments={"x-queue-mode": "default"}),
            "inequivalent arg 'x-queue-mode' for {}: received 'default' but current is 'lazy'",
        ),
        (
            queue(arguments={"x-message-ttl": 1000}),
            queue(arguments={"x-message-ttl": 1000, "x-expires": 0}),
            "inequivalent arg 'x-expires' for {}: received the value '0' of type 'signedint' but current is none",
        ),
        (
            queue(),
            queue(arguments={"x-message-ttl": {"a": 1}}),
            "inequivalent arg 'x-message-ttl' for {}: received the value '[{<<\"a\">>,signedint,1}]' of type 'table' but current is none",
        ),
        (
            queue(),
            queue(arguments={"x-message-ttl": [1, "a"]}),
            "inequivalent arg 'x-message-ttl' for {}: received the value '[{signedint,1},{longstr,<<\"a\">>}]' of type 'array' but current is none",
        ),
        (
            queue(),
            queue(arguments={"x-message-ttl": None}),
            "inequivalent arg 'x-message-ttl' for {}: received the value 'undefined' of type 'void' but current is none",
        ),
        (
            queue(),
            queue(arguments={"x-message-ttl": datetime.datetime(2020, 1, 1)}),
            "inequivalent arg 'x-message-ttl' for {}: received the value '1577836800' of type 'timestamp' but current is none",
        ),
        (
            queue(),
            queue(arguments={"x-queue-mode": "café"}),
            "inequivalent arg 'x-queue-mode' for {}: received the value 'café' of type 'longstr' but current is none",
        ),
    ],
)
def test_inequivalent_queue_redeclaration(existing, requested, explanation):
    error = refusal(check_queue_equivalent, "eq-q", "/", existing, requested)
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - " + explanation.replace("{}", EQ_QUEUE))


@pytest.mark.parametrize(
    "existing, requested",
    [
        (queue(exclusive=True, durable=True), queue(exclusive=True, durable=False)),
        (queue(exclusive=True, durable=True), queue(exclusive=True, durable=True)),
        (queue(arguments={"x-message-ttl": 1000}), queue(arguments={"x-message-ttl": 1000})),
        (
            queue(arguments={"x-dead-letter-exchange": "d"}),
            queue(arguments={"x-dead-letter-exchange": bytearray(b"d")}),
        ),
        (queue(), queue(arguments={"x-queue-type": "classic"})),
        (queue(arguments={"x-queue-type": "classic"}), queue()),
        (queue(arguments={"x-foo": 1}), queue(arguments={"x-foo": 2})),
        (queue(arguments={"x-max-length": 5}), queue(arguments={"x-max-length": 5, "other": "ignored"})),
    ],
)
def test_equivalent_queue_redeclaration(existing, requested):
    check_queue_equivalent("eq-q", "/", existing, requested)


LOCKED = (
    "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'eq-q' in vhost '/'. It could be originally "
    "declared on another connection or the exclusive property value does not match that of the original declaration."
)


@pytest.mark.parametrize(
    "existing, requested",
    [
        (queue(exclusive=True), queue(exclusive=False)),
        (queue(exclusive=False), queue(exclusive=True)),
        (queue(exclusive=True, owner="conn-1"), queue(exclusive=True, owner="conn-2")),
        (queue(exclusive=True, durable=True, owner="conn-1"), queue(exclusive=False, owner=None)),
    ],
)
def test_exclusivity_mismatch_is_resource_locked(existing, requested):
    error = refusal(check_queue_equivalent, "eq-q", "/", existing, requested)
    assert (error.reply_code, error.reply_text) == (405, LOCKED)


def exchange(type="direct", durable=False, auto_delete=False, internal=False, arguments=None):
    return {
        "type": type,
        "durable": durable,
        "auto_delete": auto_delete,
        "internal": internal,
        "arguments": arguments or {},
    }


@pytest.mark.parametrize(
    "existing, requested, explanation",
    [
        (
            exchange(),
            exchange(type="topic"),
            "inequivalent arg 'type' for {}: received 'topic' but current is 'direct'",
        ),
        (
            exchange(),
            exchange(durable=True),
            "inequivalent arg 'durable' for {}: received 'true' but current is 'false'",
        ),
        (
            exchange(),
            exchange(auto_delete=True),
            "inequivalent arg 'auto_delete' for {}: received 'true' but current is 'false'",
        ),
        (
            exchange(),
            exchange(internal=True),
            "inequivalent arg 'internal' for {}: received 'true' but current is 'false'",
        ),
        (
            exchange(arguments={"alternate-exchange": "a"}),
            exchange(arguments={"alternate-exchange": "b"}),
            "inequivalent arg 'alternate-exchange' for {}: received 'b' but current is 'a'",
        ),
        (
            exchange(),
            exchange(arguments={"alternate-exchange": "b"}),
            "inequivalent arg 'alternate-exchange' for {}: received the value 'b' of type 'longstr' but current is none",
        ),
        (
            exchange(),
            exchange(arguments={"alternate-exchange": 5}),
            "inequivalent arg 'alternate-exchange' for {}: received the value '5' of type 'signedint' but current is none",
        ),
        (
            exchange(type="direct"),
            exchange(type="x-consistent-hash"),
            "inequivalent arg 'type' for {}: received ''x-consistent-hash'' but current is 'direct'",
        ),
    ],
)
def test_inequivalent_exchange_redeclaration(existing, requested, explanation):
    error = refusal(check_exchange_equivalent, "eq-x", "/", existing, requested)
    assert (error.reply_code, error.reply_text) == (
        406,
        "PRECONDITION_FAILED - " + explanation.replace("{}", "exchange 'eq-x' in vhost '/'"),
    )


def test_equivalent_exchange_redeclaration_ignores_other_arguments():
    check_exchange_equivalent("x", "/", exchange(arguments={"x-foo": 1}), exchange(arguments={"x-foo": 2}))
    check_exchange_equivalent(
        "x", "/", exchange(arguments={"alternate-exchange": "a"}), exchange(arguments={"alternate-exchange": "a"})
    )


@pytest.mark.parametrize(
    "value, type_name",
    [
        (True, "bool"),
        (2**31 - 1, "signedint"),
        (-(2**31), "signedint"),
        (2**31, "long"),
        (1.5, "double"),
        (decimal.Decimal("1.5"), "decimal"),
        ("s", "longstr"),
        (b"\xff", "longstr"),
        (bytearray(b"x"), "binary"),
        (datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), "timestamp"),
        ({}, "table"),
        ([], "array"),
        (None, "void"),
    ],
)
def test_type_names(value, type_name):
    assert amqp_type_name(value) == type_name


@pytest.mark.parametrize(
    "value, printed",
    [
        # floats as Erlang's io_lib prints them, checked with erl
        (1.0, "1.0"),
        (0.1, "0.1"),
        (100.0, "100.0"),
        (123456.0, "123456.0"),
        (1000.0, "1.0e3"),
        (1e15, "1.0e15"),
        (0.0001, "0.0001"),
        (1e-05, "1.0e-5"),
        (0.00012, "1.2e-4"),
        (12500.0, "1.25e4"),
        (9007199254740991.0, "9007199254740991.0"),
        (9007199254740992.0, "9.007199254740992e15"),
        (12345678901234567.0, "1.2345678901234568e16"),
        (-2.5, "-2.5"),
        (decimal.Decimal("1.50"), "{2,150}"),
        (b"a\x81b", "<<97,129,98>>"),
        ('a"b', '<<"a\\"b">>'),
        (bytearray(b"x"), '<<"x">>'),
    ],
)
def test_erlang_rendering(value, printed):
    assert erlang_term(value) == printed
