"""Expected outcomes of the explicit cases were observed on a RabbitMQ 3.10.8 node (pika bindings and publishes)."""

import datetime
import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.model.routing.headers import headers_match, validate_x_match


@pytest.mark.parametrize(
    "binding, headers, matched",
    [
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": "1"}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": False}, {"a": 0}, False),
        ({"a": bytearray(b"v")}, {"a": "v"}, True),
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {}, False),
        ({"a": None}, {"b": 1}, False),
        ({"a": 1}, {"a": None}, False),
        ({"a": datetime.datetime(1970, 1, 1, 0, 0, 5)}, {"a": 5}, True),
        ({"a": 5}, {"a": 2**35}, False),
        ({"a": 2**35}, {"a": 2**35}, True),
        ({"x-match": "any"}, {"a": 1}, False),
        ({"x-match": "all"}, {"a": 1}, True),
        ({"x-match": "all"}, None, True),
        ({"x-match": "any", "x-foo": 1}, {"x-foo": 1}, False),
        ({"x-match": "any-with-x", "x-foo": 1}, {"x-foo": 1}, True),
        ({"x-match": "all", "x-foo": 1}, {}, True),
        ({"x-match": "all-with-x", "x-foo": 1}, {}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "all", "a": 1, "b": 2}, {"b": 2}, False),
        ({"a": {"k": 1}}, {"a": {"k": 1}}, True),
        ({"a": [1, "x"]}, {"a": [1, "x"]}, True),
        ({"a": decimal.Decimal("1.5")}, {"a": decimal.Decimal("1.5")}, True),
    ],
)
def test_observed_on_rabbitmq(binding, headers, matched):
    assert headers_match(binding, headers) is matched


@pytest.mark.parametrize(
    "binding, headers, matched",
    [
        # Erlang's == ignores the AMQP type: numbers compare by value, strings by bytes
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": "v"}, {"a": b"v"}, True),
        # a decimal is {Scale, Unscaled}: 1.5 and 1.50 differ, and no decimal equals a number
        ({"a": decimal.Decimal("1.5")}, {"a": decimal.Decimal("1.50")}, False),
        ({"a": decimal.Decimal(1)}, {"a": 1}, False),
        ({"a": True}, {"a": 1}, False),
        # nested tables and arrays compare element types and order
        ({"a": {"k": 1}}, {"a": {"k": 1.0}}, False),
        ({"a": {"k": 1, "j": 2}}, {"a": {"j": 2, "k": 1}}, False),
        ({"a": [1, 2]}, {"a": [2, 1]}, False),
        # any value that is not one of the four kinds means all
        ({"x-match": "ALL", "a": 1, "b": 2}, {"a": 1}, False),
        ({"x-match": 1, "a": 1}, {"a": 1}, True),
        ({"x-match": b"any", "a": 1, "b": 2}, {"a": 1}, True),
        ({"x-match": "any-with-x", "x-a": None, "b": 2}, {"x-a": "present"}, True),
        ({"x-match": "all-with-x", "x-a": 1, "b": 2}, {"x-a": 1, "b": 2, "c": 3}, True),
    ],
)
def test_value_comparison_and_match_kinds(binding, headers, matched):
    assert headers_match(binding, headers) is matched


@pytest.mark.parametrize(
    "value, text",
    [
        (
            "foo",
            'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x',
        ),
        (
            "ALL",
            'PRECONDITION_FAILED - Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x',
        ),
        (1, "PRECONDITION_FAILED - Invalid x-match field type signedint (value 1); expected longstr"),
        (
            bytearray(b"all"),
            'PRECONDITION_FAILED - Invalid x-match field type binary (value <<"all">>); expected longstr',
        ),
        (True, "PRECONDITION_FAILED - Invalid x-match field type bool (value true); expected longstr"),
    ],
)
def test_invalid_x_match_texts_observed_on_rabbitmq(value, text):
    assert validate_x_match({"x-match": value, "a": 1}) == text


@pytest.mark.parametrize(
    "arguments",
    [{}, {"a": 1}, {"x-match": "all"}, {"x-match": "any"}, {"x-match": "all-with-x"}, {"x-match": "any-with-x"}],
)
def test_valid_x_match(arguments):
    assert validate_x_match(arguments) is None


def rabbitmq_headers_match(args: dict, data: dict | None) -> bool:
    """rabbit_exchange_type_headers:headers_match/5 transcribed: a merge of both tables sorted by key."""
    kind = {"all": "all", "any": "any", "all-with-x": "all_with_x", "any-with-x": "any_with_x"}.get(
        args.get("x-match"), "all"
    )
    pattern = sorted(args.items())
    data_items = sorted((data or {}).items())
    all_match, any_match = True, False
    while True:
        if not all_match and kind in ("all", "all_with_x"):
            return False
        if any_match and kind in ("any", "any_with_x"):
            return True
        if not pattern:
            return all_match if kind in ("all", "all_with_x") else any_match
        pk, pv = pattern[0]
        if pk == "x-match" or (pk.startswith("x-") and kind not in ("all_with_x", "any_with_x")):
            pattern = pattern[1:]
            continue
        if not data_items:
            pattern, all_match = [], False
            continue
        dk, dv = data_items[0]
        if pk > dk:
            data_items = data_items[1:]
        elif pk < dk:
            pattern, all_match = pattern[1:], False
        else:
            if pv is None or (type(pv) is type(dv) and pv == dv):
                any_match = True
            else:
                all_match = False
            pattern, data_items = pattern[1:], data_items[1:]


keys = st.sampled_from(["a", "b", "c", "x-a", "x-b", "x-match"])
values = st.one_of(st.none(), st.integers(0, 2), st.sampled_from(["s", "t"]), st.booleans())
tables = st.dictionaries(keys, values, max_size=5)


@settings(max_examples=500, deadline=None)
@given(
    binding=tables,
    kind=st.sampled_from([None, "all", "any", "all-with-x", "any-with-x", "other"]),
    headers=st.one_of(st.none(), tables),
)
def test_agrees_with_rabbitmq_merge_algorithm(binding, kind, headers):
    binding = {k: v for k, v in binding.items() if k != "x-match"}
    if kind is not None:
        binding["x-match"] = kind
    assert headers_match(binding, headers) is rabbitmq_headers_match(binding, headers)
