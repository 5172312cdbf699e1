"""Policies: validation with RabbitMQ 3.10's texts (checked against its PUT /api/policies replies), matching,
choosing one per object, merging with operator policies and queue arguments, and live re-application.
Modules under test: broker.model.policy, broker.model.vhost (policies), broker.model.queue (apply_policies),
broker.model.durability (restore)."""

import asyncio
import functools
import logging

import pytest
from pamqp.commands import Basic

from broker.model import policy as policies
from broker.model.durability import restore
from broker.model.message import Address, Header, Message
from broker.model.node import Node
from broker.model.queue import TRIM_SLICE
from broker.model.policy import PolicyError, choose, effective_settings, make_policy, merged_definition
from broker.model.vhost import VirtualHost
from protocol.codec import encode_header_payload
from protocol.errors import AMQPError
from storage.recovery import Recovered
from tests.waiting import two_loop_turns


def refusal(pattern=".*", definition=None, priority=0, apply_to="all", operator=False) -> str:
    with pytest.raises(PolicyError) as raised:
        make_policy("/", "p", pattern, {"max-length": 1} if definition is None else definition, priority, apply_to,
                    operator)
    return str(raised.value)


@pytest.mark.parametrize("definition, text", [
    ({"foo": 1}, '[{<<"foo">>,1}] are not recognised policy settings'),
    ({"foo": 1, "bar": 2, "max-length": 1}, '[{<<"bar">>,2},{<<"foo">>,1}] are not recognised policy settings'),
    ({"max-length": "x"}, '<<"x">> is not a valid maximum length'),
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"max-length": True}, "true is not a valid maximum length"),
    ({"max-length": 1e3}, "1.0e3 is not a valid maximum length"),
    ({"max-length": "é€"}, "<<195,169,226,130,172>> is not a valid maximum length"),
    ({"max-length": [1, {"a": None}]}, '[1,#{<<"a">> => null}] is not a valid maximum length'),
    ({"message-ttl": 1.5}, "1.5 is not a valid message TTL"),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"dead-letter-exchange": 5}, "5 is not a valid dead letter exchange name"),
    ({"alternate-exchange": True}, "true is not a valid alternate exchange name"),
    ({"overflow": "x"}, '<<"x">> is not a valid overflow value'),
    ({"message-ttl": "a", "max-length": "b"}, '<<"b">> is not a valid maximum length'),  # keys in sorted order
    ({}, "no policy provided"),
])
def test_a_bad_definition_is_refused_with_rabbitmqs_text(definition, text):
    assert refusal(definition=definition) == f"Validation failed\n\n{text}\n"


@pytest.mark.parametrize("fields, text", [
    ({"priority": "5"}, 'priority should be a number, actually was <<"5">>'),
    ({"priority": None}, "priority should be a number, actually was null"),
    ({"pattern": 5}, "pattern should be a binary but was 5"),
    ({"pattern": "*"}, 'pattern should be regular expression but is invalid: {"nothing to repeat",0}'),
    ({"pattern": "("}, 'pattern should be regular expression but is invalid: {"missing )",1}'),
    ({"pattern": ")"}, 'pattern should be regular expression but is invalid: {"unmatched parentheses",\n'
                       + " " * 54 + "0}"),
    ({"apply_to": "bogus"}, "apply-to 'bogus' unrecognised; should be 'queues', 'exchanges' or 'all'"),
])
def test_bad_fields_are_refused_with_rabbitmqs_text(fields, text):
    assert refusal(**fields) == f"Validation failed\n\n{text}\n"


def test_operator_policies_only_take_limits():
    assert refusal(definition={"dead-letter-exchange": "x"}, operator=True) == (
        'Validation failed\n\n[{<<"dead-letter-exchange">>,<<"x">>}] are not recognised policy settings\n')
    assert make_policy("/", "op", ".*", {"max-length": 3, "message-ttl": 5, "expires": 9, "max-length-bytes": 1},
                       operator=True).definition["max-length"] == 3


def test_a_policy_error_is_a_value_error():
    assert issubclass(PolicyError, ValueError)


def test_a_fractional_priority_is_accepted_as_rabbitmq_does():
    assert make_policy("/", "p", ".*", {"max-length": 1}, 1.5).priority == 1.5


def test_the_pattern_is_searched_for_and_apply_to_restricts_the_kind():
    policy = make_policy("/", "p", "^orders\\.", {"max-length": 1}, apply_to="queues")
    assert policy.applies_to("queues", "orders.eu")
    assert not policy.applies_to("queues", "eu.orders.x")
    assert not policy.applies_to("exchanges", "orders.eu")
    anywhere = make_policy("/", "p", "ord", {"max-length": 1})
    assert anywhere.applies_to("queues", "my-orders") and anywhere.applies_to("exchanges", "orders")


def test_the_highest_priority_wins_and_a_tie_goes_to_the_greatest_name():
    low = make_policy("/", "zz", ".*", {"max-length": 1}, 1)
    high = make_policy("/", "aa", ".*", {"max-length": 2}, 5)
    other = make_policy("/", "mm", "^nomatch$", {"max-length": 3}, 9)
    assert choose([low, high, other], "queues", "q") is high
    tie = [make_policy("/", name, ".*", {"max-length": 1}, 3) for name in ("aa-t", "zz-t", "mm-t")]
    assert choose(tie, "queues", "q").name == "zz-t"
    assert choose([other], "queues", "q") is None


def test_an_operator_policy_caps_the_policys_limits():
    policy = make_policy("/", "p", ".*", {"max-length": 10, "expires": 100000, "message-ttl": 1000})
    operator = make_policy("/", "op", ".*", {"max-length": 3, "message-ttl": 5000}, operator=True)
    assert merged_definition(policy, operator) == {"expires": 100000, "max-length": 3, "message-ttl": 1000}
    assert merged_definition(None, operator) == {"max-length": 3, "message-ttl": 5000}
    assert merged_definition(None, None) == {}


def test_queue_arguments_win_for_names_and_the_lower_limit_wins():
    definition = {"max-length": 2, "message-ttl": 60000, "overflow": "drop-head", "dead-letter-exchange": "pol"}
    arguments = {"x-max-length": 10, "x-message-ttl": 1000, "x-overflow": "reject-publish",
                 "x-dead-letter-exchange": "arg"}
    assert effective_settings(arguments, definition, "queues") == {
        "dead-letter-exchange": "arg", "message-ttl": 1000, "max-length": 2, "overflow": "reject-publish"}
    assert effective_settings({"alternate-exchange": "arg"}, {"alternate-exchange": "pol"}, "exchanges") == {
        "alternate-exchange": "arg"}
    assert effective_settings({}, {"alternate-exchange": "pol", "max-length": 1}, "exchanges") == {
        "alternate-exchange": "pol"}


def test_leader_locators_as_rabbitmq_4_takes_them():
    """rabbit_queue_location: the policy's locator wins over the queue's argument; the 3.x name
    (queue-master-locator, deprecated in 4.0) may come from an operator policy too, whose value then applies."""
    assert effective_settings({"x-queue-leader-locator": "client-local"}, {"queue-leader-locator": "balanced"},
                              "queues") == {"queue-leader-locator": "balanced"}
    policy = make_policy("/", "p", ".*", {"queue-master-locator": "client-local"})
    operator = make_policy("/", "op", ".*", {"queue-master-locator": "min-masters"}, operator=True)
    assert merged_definition(policy, operator) == {"queue-master-locator": "min-masters"}
    assert refusal(definition={"queue-leader-locator": "balanced"}, operator=True) == (
        'Validation failed\n\n[{<<"queue-leader-locator">>,<<"balanced">>}] are not recognised policy settings\n')
    assert refusal(definition={"queue-leader-locator": "min-masters"}) == (
        'Validation failed\n\n<<"min-masters">> is not a valid queue leader locator value\n')


def test_every_key_has_a_refusal_text_and_operator_keys_cap_or_say_how_they_merge():
    for key, spec in policies.KEYS.items():
        assert spec.refusal.startswith("is not a valid"), key
        assert not spec.operator or spec.lowest_wins or spec.merge is not None, key


def test_delivery_limit_and_delayed_retry_merge_as_rabbitmq_4():
    """rabbit_policies / rabbit_quorum_queue merge strategies: a negative delivery limit (none) gives way to a
    limit; an operator's delayed-retry type wins, its minimum raises, its maximum caps."""
    policy = policies.make_policy("/", "p", ".*", {"delivery-limit": -1, "delayed-retry-type": "all",
                                                   "delayed-retry-min": 100, "delayed-retry-max": 5000})
    operator = policies.make_policy("/", "o", ".*", {"delivery-limit": 7, "delayed-retry-type": "failed",
                                                     "delayed-retry-min": 500, "delayed-retry-max": 1000},
                                    operator=True)
    assert policies.merged_definition(policy, operator) == {
        "delayed-retry-max": 1000, "delayed-retry-min": 500, "delayed-retry-type": "failed", "delivery-limit": 7}
    merged = policies.merged_definition(policy, None)
    assert effective_settings({"x-delivery-limit": 3, "x-delayed-retry-type": "returned", "x-delayed-retry-min": 50},
                              merged, "queues") == {
        "delivery-limit": 3, "delayed-retry-type": "all", "delayed-retry-min": 50, "delayed-retry-max": 5000}


@pytest.mark.parametrize("definition, problem", [
    ({"delayed-retry-type": "all"}, "delayed-retry-min is required when delayed-retry-type is all"),
    ({"delayed-retry-min": 10, "delayed-retry-max": 5},
     "delayed-retry-max (5) must not be smaller than delayed-retry-min (10)"),
    ({"delayed-retry-type": "never"}, '<<"never">> is not a valid delayed retry type. Must be one of: all, failed, '
                                      'returned, disabled'),
    ({"delayed-retry-min": 0}, "0 is not a valid delayed retry minimum delay. Must be a positive integer"),
    ({"delivery-limit": "5"}, '<<"5">> is not a valid delivery limit'),
])
def test_delivery_limit_and_delayed_retry_refusals(definition, problem):
    with pytest.raises(policies.PolicyError) as caught:
        policies.make_policy("/", "p", ".*", definition)
    assert caught.value.problem == problem


# --- on a vhost ---------------------------------------------------------------------------------------------
class Owner:
    exclusive_queues: set = set()


@pytest.fixture
def vhost():
    return VirtualHost("/")


def in_loop(test):
    """Run a test inside an event loop (queues start their timers on the running loop)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        async def body():
            return test(*args, **kwargs)
        return asyncio.run(body())
    return run


def declare(vhost, name, arguments=None):
    return vhost.declare_queue(name, Owner(), False, False, False, False, arguments or {})


@in_loop
def test_a_policy_applies_to_new_and_existing_queues_and_goes_when_cleared(vhost):
    before = declare(vhost, "orders.1")
    vhost.set_policy("limit", "^orders", {"max-length": 5, "dead-letter-exchange": "dlx"})
    after = declare(vhost, "orders.2")
    for queue in (before, after):
        assert queue.policy.name == "limit"
        assert queue.limit.max_length == 5 and queue.dead_letter_exchange == "dlx"
        assert queue.effective_policy_definition() == {"dead-letter-exchange": "dlx", "max-length": 5}
    assert declare(vhost, "other").policy is None
    vhost.clear_policy("limit")
    assert before.policy is None and before.limit is None and before.dead_letter_exchange is None


@in_loop
def test_a_policy_applied_in_steps_stops_where_a_later_change_comes_and_that_one_applies_to_every_queue(vhost):
    queues = [declare(vhost, f"orders.{number}") for number in range(4)]
    vhost.set_policy("limit", "^orders", {"max-length": 5}, reapply=False)
    applying = vhost.applying_policy_choices(vhost.policy_snapshot().choose())
    next(applying)  # (an API request lets the event loop turn between steps)
    assert [queue.policy is not None for queue in queues] == [True, False, False, False]
    vhost.set_policy("limit", "^orders", {"max-length": 9}, reapply=False)
    assert list(applying) == [] and [queue.policy is not None for queue in queues] == [True, False, False, False]
    vhost.reapply_policies()
    assert [queue.limit.max_length for queue in queues] == [9, 9, 9, 9]


@in_loop
def test_clearing_an_unknown_policy_is_not_found(vhost):
    with pytest.raises(AMQPError) as raised:
        vhost.clear_policy("nope")
    assert raised.value.reply_code == 404
    with pytest.raises(AMQPError):
        vhost.clear_policy("nope", operator=True)


def message(body: bytes) -> Message:
    return Message(Address("", "q"), Header(encode_header_payload(len(body), Basic.Properties())), body)


@in_loop
def test_a_lower_max_length_drops_the_oldest_to_the_dead_letter_exchange(vhost):
    queue = declare(vhost, "q")
    dead = declare(vhost, "dead")
    for body in (b"1", b"22", b"333", b"4444"):
        vhost.publish_to([queue], message(body))
    vhost.set_policy("dlx", "^q$", {"dead-letter-exchange": "", "dead-letter-routing-key": "dead"})
    vhost.set_policy("dlx", "^q$", {"dead-letter-exchange": "", "dead-letter-routing-key": "dead",
                                    "max-length": 1})
    assert [entry.message.body for entry in queue.entries] == [b"4444"]
    assert [entry.message.body for entry in dead.entries] == [b"1", b"22", b"333"]
    assert queue.ready_bytes == 4
    vhost.set_policy("bytes", "^q$", {"max-length-bytes": 2}, priority=1)  # outranks the other: no DLX now
    assert not queue.entries and len(dead.entries) == 3


def test_a_lower_max_length_over_many_messages_drops_them_a_slice_every_other_loop_turn(vhost):
    async def scenario() -> list[int]:
        queue = declare(vhost, "q")
        dead = declare(vhost, "dead")
        many = 2 * TRIM_SLICE + 10
        for number in range(many):
            vhost.publish_to([queue], message(b"%d" % number))
        vhost.set_policy("limit", "^q$", {"max-length": 5, "dead-letter-exchange": "",
                                          "dead-letter-routing-key": "dead"})
        left = [len(queue.entries)]
        while len(queue.entries) > 5:
            await two_loop_turns()
            left.append(len(queue.entries))
        assert [entry.message.body for entry in dead.entries] == [b"%d" % number for number in range(many - 5)]
        assert [entry.message.body for entry in queue.entries] == [b"%d" % number for number in range(many - 5, many)]
        assert queue.ready_bytes == sum(len(b"%d" % number) for number in range(many - 5, many))
        return left
    left = asyncio.run(scenario())  # (a slice at once, then one every other loop turn: TRIM_SLICE, or fewer once 5 ms passed)
    assert len(left) >= 3 and left[0] >= TRIM_SLICE + 10 and left[-1] == 5
    assert all(0 < earlier - later <= TRIM_SLICE for earlier, later in zip(left, left[1:])), left


@in_loop
def test_a_reject_publish_queue_keeps_what_it_has_under_a_lower_limit(vhost):
    queue = declare(vhost, "q", {"x-overflow": "reject-publish"})
    for body in (b"1", b"2", b"3"):
        vhost.publish_to([queue], message(body))
    vhost.set_policy("limit", "^q$", {"max-length": 1})
    assert len(queue.entries) == 3
    assert vhost.publish_to([queue], message(b"4")) == (False, True)  # refused


@in_loop
def test_a_message_ttl_policy_applies_to_messages_enqueued_from_then_on(vhost):
    queue = declare(vhost, "q")
    vhost.publish_to([queue], message(b"old"))
    vhost.set_policy("ttl", "^q$", {"message-ttl": 60000})
    vhost.publish_to([queue], message(b"new"))
    assert [bool(entry.expires_at) for entry in queue.entries] == [False, True]


@in_loop
def test_an_expires_policy_starts_a_lease_and_clearing_it_stops_it(vhost):
    queue = declare(vhost, "q")
    vhost.set_policy("exp", "^q$", {"expires": 60000})
    assert queue.unused_ttl == 60000 and queue.unused_timer is not None
    vhost.clear_policy("exp")
    assert queue.unused_ttl is None and queue.unused_timer is None


@in_loop
def test_a_policy_sets_an_exchanges_alternate_exchange_unless_its_argument_does(vhost):
    own = vhost.declare_exchange("ae-own", "fanout", False, False, False, False, {"alternate-exchange": "mine"})
    plain = vhost.declare_exchange("ae-plain", "fanout", False, False, False, False, {})
    vhost.set_policy("ae", "^ae-", {"alternate-exchange": "theirs"}, apply_to="exchanges")
    assert own.alternate_exchange == "mine" and own.policy.name == "ae"
    assert plain.alternate_exchange == "theirs"
    assert vhost.default_exchange.policy is None
    vhost.clear_policy("ae")
    assert plain.alternate_exchange is None


@in_loop
def test_a_queue_redeclared_with_other_arguments_than_its_policy_is_equivalent(vhost):
    declare(vhost, "q", {"x-max-length": 10})
    vhost.set_policy("limit", "^q$", {"max-length": 2})
    assert declare(vhost, "q", {"x-max-length": 10}).limit.max_length == 2


@in_loop
def test_a_bad_policy_changes_nothing(vhost):
    queue = declare(vhost, "q")
    with pytest.raises(PolicyError):
        vhost.set_policy("bad", ".*", {"max-length": -1})
    assert vhost.policies == {} and queue.policy is None


# --- restored from the definitions log ----------------------------------------------------------------------
def stored_policy(name: str, **changes) -> dict:
    return {"vhost": "/", "name": name, "pattern": "^q", "apply-to": "queues", "definition": {"max-length": 1},
            "priority": 0, **changes}


def test_policies_are_restored_before_the_queues_and_a_bad_one_is_logged_and_skipped(caplog):
    stored = Recovered([], [{"vhost": "/", "name": "q1", "durable": True, "auto_delete": False, "arguments": {}}],
                       [], {}, 10, {})
    stored.policies = [stored_policy("good"), stored_policy("bad", definition={"max-length": -1}),
                       stored_policy("elsewhere", vhost="gone")]
    stored.operator_policies = [stored_policy("cap", definition={"max-length": 0}, priority=1)]

    async def run():
        node = Node()
        vhost = node.vhosts["/"] = VirtualHost("/", None, node)
        with caplog.at_level(logging.ERROR):
            restore(node, stored)
        return vhost
    vhost = asyncio.run(run())
    assert list(vhost.policies) == ["good"] and list(vhost.operator_policies) == ["cap"]
    queue = vhost.queues["q1"]
    assert queue.policy.name == "good" and queue.operator_policy.name == "cap" and queue.limit.max_length == 0
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 2
    assert "'bad'" in errors[0] and errors[0].endswith("-1 is not a valid maximum length")
    assert "'elsewhere'" in errors[1] and "vhost is gone" in errors[1]
