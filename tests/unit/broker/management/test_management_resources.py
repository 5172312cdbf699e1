"""The pure parts of the management API's queue, exchange and binding views: RabbitMQ's binding properties keys,
how AMQP field values are shown in a get reply, payload encodings, and a listing's columns. Expected values were
read from RabbitMQ 3.10's API."""

import datetime
from decimal import Decimal

# The modules under test, named once: the rest of the file uses only these names.
from broker.management import messages, resources


def test_properties_keys_quote_the_routing_key_as_rabbitmq():
    assert resources.properties_key("", {}) == "~"
    assert resources.properties_key("a.b", {}) == "a.b"
    assert resources.properties_key("a.* b/c~", {}) == "a.%2A+b%2Fc%7E"


def test_properties_keys_of_bindings_with_arguments_differ_by_arguments_only():
    first = resources.properties_key("k", {"x-match": "any", "a": 1})
    assert first == resources.properties_key("k", {"a": 1, "x-match": "any"})  # order does not matter
    assert first != resources.properties_key("k", {"x-match": "all", "a": 1})
    key, separator, digest = first.partition("~")
    assert (key, separator, len(digest)) == ("k", "~", 6)
    assert resources.properties_key("", {"a": 1}).startswith("~")


def test_field_values_as_rabbitmq_shows_them():
    assert messages.json_value({
        "text": "s", "raw": b"\xff\x01", "utf8": b"ok", "none": None, "flag": False,
        "when": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), "list": [1, b"b"],
        "table": {"x": {"y": 1}},
    }) == {"text": "s", "raw": "Not UTF-8, base64 is: /wE=", "utf8": "ok", "none": "undefined", "flag": False,
           "when": 1577836800, "list": [1, "b"], "table": {"x": {"y": 1}}}


def test_decimals_are_shown_as_rabbitmq_prints_their_scale_and_value():
    assert messages.json_value(Decimal("1.25")) == 2.125
    assert messages.json_value(Decimal("3.5")) == 1.35
    assert messages.json_value(Decimal("-0.007")) == 3.4294967289


def test_payloads_are_text_when_utf8_and_auto_else_base64():
    assert messages.payload_json("héllo".encode(), "auto", None) == {"payload": "héllo", "payload_encoding": "string"}
    assert messages.payload_json("héllo".encode(), "auto", 2) == {"payload": "aMM=", "payload_encoding": "base64"}
    assert messages.payload_json(b"abc", "base64", None) == {"payload": "YWJj", "payload_encoding": "base64"}


def test_columns_keep_the_named_fields():
    item = {"name": "q", "messages": 3, "arguments": {"x-max-length": 5, "x-expires": 9}}
    assert resources.columns_of(item, ["name", "arguments.x-max-length", "missing"]) == {
        "name": "q", "arguments": {"x-max-length": 5}}
