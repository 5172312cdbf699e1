"""Federation upstreams and sets: RabbitMQ's checks and texts (rabbit_federation_parameters, as RabbitMQ 3.10
answers them), and the upstreams a policy names for a queue or exchange (rabbit_federation_upstream)."""

from __future__ import annotations

import pytest

from broker.federation.upstream import UPSTREAM, UPSTREAM_SET, check_set, check_upstream, upstreams_for
from broker.links.validation import DefinitionError
from broker.model.policy import PolicyError, make_policy

URI = "amqp://guest:guest@127.0.0.1:5672/%2F"


def reasons(check, value) -> list[str]:
    with pytest.raises(DefinitionError) as refused:
        check("u1", value)
    return refused.value.reasons


@pytest.mark.parametrize("value, expected", [
    ({}, ['Key "uri" not found in u1']),
    ({"uri": 5}, ["uri should be list, actually was 5"]),
    ({"uri": URI, "ack-mode": "foo"}, ['ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                                      'actually was <<"foo">>']),
    ({"uri": URI, "ack-mode": 5}, ["ack-mode should be binary, actually was 5"]),
    ({"uri": URI, "prefetch-count": "10"}, ['prefetch-count should be a number, actually was <<"10">>']),
    ({"uri": URI, "expires": None}, ["expires should be a number, actually was null"]),
    ({"uri": URI, "max-hops": True}, ["max-hops should be a number, actually was true"]),
    ({"uri": URI, "trust-user-id": "yes"}, ['trust-user-id should be boolean, actually was <<"yes">>']),
    ({"uri": URI, "exchange": 1}, ["exchange should be binary, actually was 1"]),
    ({"uri": URI, "resource-cleanup-mode": "x"}, ['resource-cleanup-mode should be one of [<<"default">>,'
                                                  '<<"never">>], actually was <<"x">>']),
    ({"uri": URI, "foo": 1, "queue-type": "quorum"}, ['Unrecognised terms [{<<"foo">>,1},{<<"queue-type">>,'
                                                      '<<"quorum">>}] in u1']),
    # every reason, unknown terms first, then from the last key checked to the first, as RabbitMQ lists them
    ({"exchange": 1, "ack-mode": 5, "bad": 0}, ['Unrecognised terms [{<<"bad">>,0}] in u1',
                                                "ack-mode should be binary, actually was 5",
                                                "exchange should be binary, actually was 1",
                                                'Key "uri" not found in u1']),
])
def test_an_upstream_rabbitmq_refuses_is_refused_with_its_texts(value, expected):
    assert reasons(check_upstream, value) == expected


def test_a_set_is_a_list_of_upstreams_each_with_keys_overridden_but_not_its_uri():
    check_set("s1", [])
    check_set("s1", [{"upstream": "a", "exchange": "other", "max-hops": 2}])
    assert reasons(check_set, [{"exchange": "x"}, {"upstream": 5}]) == [
        'Key "upstream" not found in u1', "upstream should be binary, actually was 5"]
    assert reasons(check_set, [{"upstream": "a", "uri": "amqp://x"}]) == [
        'Unrecognised terms [{<<"uri">>,<<"amqp://x">>}] in u1']
    assert reasons(check_set, {"upstream": "a"}) == ['u1 should be a list, actually was #{<<"upstream">> => <<"a">>}']


PARAMETERS = {
    (UPSTREAM, "east"): {"uri": "amqp://east", "max-hops": 2, "prefetch-count": 10},
    (UPSTREAM, "west"): {"uri": ["amqp://west-1", "amqp://west-2"], "exchange": "elsewhere"},
    (UPSTREAM_SET, "both"): [{"upstream": "east", "max-hops": 3}, {"upstream": "west"}, {"upstream": "gone"}],
}


def test_a_policy_names_one_upstream_a_set_every_upstream_or_a_pattern_of_names():
    [east] = upstreams_for(PARAMETERS, {"federation-upstream": "east"}, "exchanges", "x")
    assert (east.name, east.uris, east.exchange, east.max_hops, east.prefetch, east.ack_mode, east.reconnect_delay,
            east.consumer_tag) == ("east", ("amqp://east",), "x", 2, 10, "on-confirm", 5, "federation-link-east")
    both = upstreams_for(PARAMETERS, {"federation-upstream-set": "both"}, "exchanges", "x")
    assert [(upstream.name, upstream.max_hops, upstream.exchange) for upstream in both] == [
        ("east", 3, "x"), ("west", 1, "elsewhere")]  # (the set's override wins; "gone" names no upstream)
    assert [upstream.name for upstream in upstreams_for(PARAMETERS, {"federation-upstream-set": "all"}, "queues",
                                                        "q")] == ["east", "west"]
    assert [upstream.name for upstream in upstreams_for(PARAMETERS, {"federation-upstream-pattern": "^w"},
                                                        "queues", "q")] == ["west"]
    assert upstreams_for(PARAMETERS, {"federation-upstream": "nowhere"}, "queues", "q") == []
    assert upstreams_for(PARAMETERS, {"max-length": 5}, "queues", "q") == []


@pytest.mark.parametrize("definition, problem", [
    ({"federation-upstream": 5}, "5 is not a valid federation upstream name"),
    ({"federation-upstream-set": ["a"]}, '[<<"a">>] is not a valid federation upstream set name'),
    ({"federation-upstream-pattern": 1}, "1 is not a valid federation upstream pattern name"),
    ({"federation-upstream-pattern": "("},
     'could not compile pattern ( to a regular expression. Error: {"missing )",1}'),
    ({"federation-upstream": "a", "federation-upstream-pattern": "b"},
     "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together"),
])
def test_a_policy_with_federation_keys_rabbitmq_refuses_is_refused_with_its_texts(definition, problem):
    with pytest.raises(PolicyError) as refused:
        make_policy("/", "p", "^x$", definition)
    assert refused.value.problem == problem


def test_a_prefetch_a_basic_qos_cannot_carry_is_refused():
    assert reasons(check_upstream, {"uri": URI, "prefetch-count": 70000}) == [
        "prefetch-count should be at most 65535, actually was 70000"]
