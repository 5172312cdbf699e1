"""The management API's exchanges: declare, show, list, delete and publish, with RabbitMQ's JSON and status codes,
checked against what AMQP clients see of the same exchanges."""

from __future__ import annotations

import pika
import pytest

from tests.integration.helpers import declare_queue, drain, open_channel, wait_for_message_count
from tests.integration.management import (
    add_user, clear_policy, delete_user, quote, request, set_permissions, set_policy,
)

REFUSED = (401, {"error": "not_authorised", "reason": "Access refused."})


def exchange_path(name: str, vhost: str = "/") -> str:
    return f"/api/exchanges/{quote(vhost)}/{quote(name)}"


def publish_body(routing_key: str, payload: str = "hello", encoding: str = "string", **properties) -> dict:
    return {"routing_key": routing_key, "properties": properties, "payload": payload, "payload_encoding": encoding}


def test_declare_show_and_delete(broker, unique):
    assert request(broker, "PUT", exchange_path(unique), {"type": "topic", "durable": True}).status == 201
    assert request(broker, "PUT", exchange_path(unique), {"type": "topic", "durable": True}).status == 204
    exchange = request(broker, "GET", exchange_path(unique)).body
    assert {key: exchange[key] for key in ("name", "vhost", "type", "durable", "auto_delete", "internal",
                                           "arguments")} == {
        "name": unique, "vhost": "/", "type": "topic", "durable": True, "auto_delete": False, "internal": False,
        "arguments": {}}
    listed = {item["name"]: item["type"] for item in request(broker, "GET", "/api/exchanges/%2F").body}
    assert listed[unique] == "topic" and listed[""] == "direct" and listed["amq.fanout"] == "fanout"
    assert unique in [item["name"] for item in request(broker, "GET", "/api/exchanges").body]
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "topic", passive=True)
    assert request(broker, "DELETE", exchange_path(unique)).status == 204
    assert request(broker, "GET", exchange_path(unique)) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert request(broker, "DELETE", exchange_path(unique)).status == 404


def test_defaults_and_the_default_exchange(broker, unique):
    assert request(broker, "PUT", exchange_path(unique), {}).status == 201
    exchange = request(broker, "GET", exchange_path(unique)).body
    assert (exchange["type"], exchange["durable"], exchange["auto_delete"]) == ("direct", False, False)
    default = request(broker, "GET", exchange_path("amq.default")).body
    assert (default["name"], default["type"], default["durable"]) == ("", "direct", True)
    assert request(broker, "DELETE", exchange_path(unique)).status == 204


def test_refused_declarations(broker, unique):
    assert request(broker, "PUT", exchange_path(unique), {"type": "topic", "durable": True}).status == 201
    assert request(broker, "PUT", exchange_path(unique), {"type": "direct", "durable": True}) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'type' for exchange '{unique}' in vhost '/': received 'direct' but current is "
                  "'topic'"})
    assert request(broker, "PUT", exchange_path(unique + "-2"), {"type": "nope"}) == (
        400, {"error": "bad_request", "reason": "unknown exchange type 'nope'"})
    assert request(broker, "PUT", exchange_path(unique + "-3"), {"durable": "yes"}) == (
        400, {"error": "bad_request", "reason": ["not_boolean", "yes"]})
    assert request(broker, "PUT", exchange_path(unique + "-4"), {"arguments": {"alternate-exchange": True}}) == (400, {
        "error": "bad_request",
        "reason": f"invalid type 'bool' for arg 'alternate-exchange' in exchange '{unique}-4' in vhost '/'"})
    assert request(broker, "PUT", exchange_path("amq.reserved-" + unique), {"type": "direct"}) == REFUSED
    assert request(broker, "PUT", exchange_path("amq.default"), {"type": "direct"}) == REFUSED
    assert request(broker, "DELETE", exchange_path("amq.direct")) == REFUSED
    assert request(broker, "DELETE", exchange_path(unique)).status == 204


def test_delete_if_unused(broker, unique):
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "fanout")
        queue = declare_queue(ch, "", exclusive=True)
        ch.queue_bind(queue, unique)
        assert request(broker, "DELETE", exchange_path(unique) + "?if-unused=true") == (
            400, {"error": "bad_request", "reason": f"exchange '{unique}' in vhost '/' in use"})
        ch.queue_unbind(queue, unique)
        assert request(broker, "DELETE", exchange_path(unique) + "?if-unused=true").status == 204


def test_publish_reaches_amqp_consumers(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        ch.exchange_declare(unique, "direct")
        ch.queue_bind(unique, unique, "key")
        sent = publish_body("key", "héllo", content_type="text/plain", delivery_mode=2, priority=2,
                            message_id="m1", timestamp=1700000000, headers={"n": 7, "s": "x", "l": [1, "a"]})
        assert request(broker, "POST", exchange_path(unique) + "/publish", sent) == (200, {"routed": True})
        binary = publish_body(unique, "AAH/", "base64")
        assert request(broker, "POST", exchange_path("amq.default") + "/publish", binary) == (200, {"routed": True})
        assert request(broker, "POST", exchange_path(unique) + "/publish", publish_body("nowhere")) == (
            200, {"routed": False})
        wait_for_message_count(ch, unique, 2)
        first, second = drain(ch, unique)
        assert (first.body, first.exchange, first.routing_key) == ("héllo".encode(), unique, "key")
        properties: pika.BasicProperties = first.properties
        assert (properties.content_type, properties.delivery_mode, properties.priority, properties.message_id,
                properties.timestamp) == ("text/plain", 2, 2, "m1", 1700000000)
        assert properties.headers == {"n": 7, "s": "x", "l": [1, "a"]}
        assert (second.body, second.exchange) == (b"\x00\x01\xff", "")


def test_publish_with_sender_selected_distribution(broker, unique):
    copy, blind = unique + "-cc", unique + "-bcc"
    with open_channel(broker) as ch:
        for queue in (unique, copy, blind):
            declare_queue(ch, queue)
        sent = publish_body(unique, "copied", headers={"CC": [copy], "BCC": [blind], "kept": "yes"})
        assert request(broker, "POST", exchange_path("amq.default") + "/publish", sent) == (200, {"routed": True})
        for queue in (unique, copy, blind):
            wait_for_message_count(ch, queue, 1)
            [message] = drain(ch, queue)
            assert (message.body, message.routing_key) == (b"copied", unique)
            assert message.properties.headers == {"CC": [copy], "kept": "yes"}
            ch.queue_delete(queue)


def test_publish_refusals(broker, unique):
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "direct", internal=True)
    path = exchange_path(unique) + "/publish"
    assert request(broker, "POST", path, publish_body("k")) == (400, {
        "error": "bad_request",
        "reason": f"403 ACCESS_REFUSED - cannot publish to internal exchange '{unique}' in vhost '/'"})
    assert request(broker, "POST", exchange_path(unique + "-missing") + "/publish", publish_body("k")) == (400, {
        "error": "bad_request", "reason": f"404 NOT_FOUND - no exchange '{unique}-missing' in vhost '/'"})
    default = exchange_path("amq.default") + "/publish"
    assert request(broker, "POST", default, publish_body("k", user_id="someone-else")) == (400, {
        "error": "bad_request",
        "reason": "406 PRECONDITION_FAILED - user_id property set to 'someone-else' but authenticated user was "
                  "'guest'"})
    assert request(broker, "POST", default, publish_body("k", expiration="abc")) == (400, {
        "error": "bad_request", "reason": "406 PRECONDITION_FAILED - invalid expiration 'abc': no_integer"})
    assert request(broker, "POST", default, publish_body("k", "x", "base64")) == (
        400, {"error": "bad_request", "reason": ["not_base64", "x"]})
    assert request(broker, "POST", default, publish_body("k", "x", "zz")) == (
        400, {"error": "bad_request", "reason": ["unsupported_encoding", "zz"]})
    assert request(broker, "POST", default, publish_body("k", delivery_mode="2")) == (
        400, {"error": "bad_request", "reason": ["not_int", "delivery_mode"]})
    assert request(broker, "POST", default, {"routing_key": "k", "payload": "x", "payload_encoding": "string"}) == (
        400, {"error": "bad_request", "reason": "[{key_missing,properties}]"})
    assert request(broker, "POST", default, publish_body("k", headers={"a": None})) == (
        400, {"error": "bad_request", "reason": "null_not_allowed"})
    assert request(broker, "DELETE", exchange_path(unique)).status == 204


def test_publish_needs_write_permission(broker, unique):
    user = unique + "-user"
    add_user(broker, user, "secret", "management")
    set_permissions(broker, "/", user, ".*", "^ok-", ".*")
    try:
        reply = request(broker, "POST", exchange_path("amq.default") + "/publish", publish_body("k"), user=user,
                        password="secret")
        assert reply == (400, {
            "error": "bad_request",
            "reason": f"403 ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user "
                      f"'{user}'"})
        assert request(broker, "PUT", exchange_path("ok-" + unique), {}, user=user, password="secret").status == 201
        assert request(broker, "POST", exchange_path("ok-" + unique) + "/publish", publish_body("k"), user=user,
                       password="secret") == (200, {"routed": False})
        assert request(broker, "DELETE", exchange_path("ok-" + unique), user=user, password="secret").status == 204
    finally:
        delete_user(broker, user)


def test_publish_refuses_values_amqp_cannot_carry(broker):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ keeps such values in memory and sends them on malformed")
    default = exchange_path("amq.default") + "/publish"
    assert request(broker, "POST", default, publish_body("k", priority=1000)) == (
        400, {"error": "bad_request", "reason": "priority must be between 0 and 255, got 1000"})
    assert request(broker, "POST", default, publish_body("k", headers={"n": 1 << 64})) == (
        400, {"error": "bad_request", "reason": f"integer {1 << 64} does not fit in a 64-bit field value"})


def test_the_policy_that_applies_is_shown(broker, unique):
    set_policy(broker, "/", unique, f"^{unique}$", {"alternate-exchange": "amq.direct"}, apply_to="exchanges")
    try:
        assert request(broker, "PUT", exchange_path(unique), {"type": "direct"}).status == 201
        assert request(broker, "GET", exchange_path(unique)).body["policy"] == unique
        assert "policy" not in request(broker, "GET", exchange_path("amq.direct")).body
    finally:
        clear_policy(broker, "/", unique)
        request(broker, "DELETE", exchange_path(unique))
