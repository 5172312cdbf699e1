"""The management API's bindings: create, list, show and delete bindings to queues and exchanges, named by
RabbitMQ's properties keys, checked against the routing AMQP clients see."""

from __future__ import annotations

from tests.integration.helpers import declare_queue, drain, open_channel, wait_for_message_count
from tests.integration.management import add_user, quote, request

REFUSED = (401, {"error": "not_authorised", "reason": "Access refused."})


def bindings_path(source: str, destination: str, kind: str = "q", vhost: str = "/") -> str:
    return f"/api/bindings/{quote(vhost)}/e/{quote(source)}/{kind}/{quote(destination)}"


def publish(broker, exchange: str, routing_key: str, payload: str) -> bool:
    body = {"routing_key": routing_key, "properties": {}, "payload": payload, "payload_encoding": "string"}
    reply = request(broker, "POST", f"/api/exchanges/%2F/{quote(exchange)}/publish", body)
    assert reply.status == 200, reply
    return reply.body["routed"]


def summary(bindings: list[dict]) -> list[tuple]:
    return [(b["source"], b["destination"], b["destination_type"], b["routing_key"], b["arguments"])
            for b in bindings]


def test_bind_a_queue_list_show_and_unbind(broker, unique):
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "topic")
        declare_queue(ch, unique)
        path = bindings_path(unique, unique)
        reply = request(broker, "POST", path, {"routing_key": "a.*", "arguments": {}})
        assert reply.status == 201
        assert publish(broker, unique, "a.b", "routed")
        wait_for_message_count(ch, unique, 1)
        assert [message.body for message in drain(ch, unique)] == [b"routed"]
        [binding] = request(broker, "GET", path).body
        assert binding == {"source": unique, "vhost": "/", "destination": unique, "destination_type": "queue",
                           "routing_key": "a.*", "arguments": {}, "properties_key": "a.%2A"}
        key = quote(binding["properties_key"])  # the key is URL-quoted once more as a path segment
        assert request(broker, "GET", f"{path}/{key}").body == binding
        assert request(broker, "DELETE", f"{path}/{key}").status == 204
        assert request(broker, "GET", f"{path}/{key}").status == 404
        assert request(broker, "GET", path).body == []
        assert not publish(broker, unique, "a.b", "unrouted")


def test_properties_keys(broker, unique):
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "headers")
        declare_queue(ch, unique)
        path = bindings_path(unique, unique)
        empty = request(broker, "POST", path, {})
        keyed = request(broker, "POST", path, {"routing_key": "k"})
        with_arguments = request(broker, "POST", path, {"routing_key": "k", "arguments": {"x-match": "any", "a": 1}})
        assert (empty.status, keyed.status, with_arguments.status) == (201, 201, 201)
        keys = {b["routing_key"] + ("+args" if b["arguments"] else ""): b["properties_key"]
                for b in request(broker, "GET", path).body}
        assert keys["k"] == "k" and keys[""] == "~"
        name, separator, digest = keys["k+args"].partition("~")
        assert (name, separator) == ("k", "~") and digest
        shown = request(broker, "GET", f"{path}/{quote(keys['k+args'])}").body
        assert (shown["routing_key"], shown["arguments"]) == ("k", {"x-match": "any", "a": 1})
        assert request(broker, "DELETE", f"{path}/{quote(keys['k+args'])}").status == 204
        assert request(broker, "DELETE", f"{path}/~").status == 204
        assert summary(request(broker, "GET", path).body) == [(unique, unique, "queue", "k", {})]


def test_bind_an_exchange(broker, unique):
    downstream = unique + "-down"
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "direct")
        ch.exchange_declare(downstream, "fanout")
        declare_queue(ch, unique)
        ch.queue_bind(unique, downstream)
        path = bindings_path(unique, downstream, "e")
        assert request(broker, "POST", path, {"routing_key": "r"}).status == 201
        assert publish(broker, unique, "r", "through")
        wait_for_message_count(ch, unique, 1)
        assert summary(request(broker, "GET", path).body) == [(unique, downstream, "exchange", "r", {})]
        assert summary(request(broker, "GET", f"/api/exchanges/%2F/{quote(unique)}/bindings/source").body) == [
            (unique, downstream, "exchange", "r", {})]
        assert summary(request(broker, "GET", f"/api/exchanges/%2F/{quote(downstream)}/bindings/destination")
                       .body) == [(unique, downstream, "exchange", "r", {})]
        assert request(broker, "DELETE", f"{path}/r").status == 204
        assert not publish(broker, unique, "r", "stopped")
        ch.exchange_delete(downstream)
        ch.exchange_delete(unique)


def test_queue_and_vhost_listings(broker, unique):
    with open_channel(broker) as ch:
        ch.exchange_declare(unique, "direct")
        declare_queue(ch, unique)
        ch.queue_bind(unique, unique, "one")
        ch.queue_bind(unique, "amq.direct", unique)
        assert summary(request(broker, "GET", f"/api/queues/%2F/{quote(unique)}/bindings").body) == [
            ("", unique, "queue", unique, {}), ("amq.direct", unique, "queue", unique, {}),
            (unique, unique, "queue", "one", {})]
        listed = summary(request(broker, "GET", "/api/bindings/%2F").body)
        assert (unique, unique, "queue", "one", {}) in listed and ("", unique, "queue", unique, {}) in listed
        assert (unique, unique, "queue", "one", {}) in summary(request(broker, "GET", "/api/bindings").body)
        implicit = bindings_path("amq.default", unique)
        assert summary(request(broker, "GET", implicit).body) == [("", unique, "queue", unique, {})]
        assert request(broker, "GET", f"{implicit}/{quote(unique)}").body["source"] == ""
        assert request(broker, "DELETE", f"{implicit}/{quote(unique)}") == REFUSED
        assert ("", unique, "queue", unique, {}) in summary(
            request(broker, "GET", "/api/exchanges/%2F/amq.default/bindings/source").body)
        ch.queue_delete(unique)
        ch.exchange_delete(unique)


def test_refused_bindings(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        assert request(broker, "POST", bindings_path(unique + "-missing", unique), {"routing_key": "k"}) == (
            404, {"error": "not_found", "reason": f"no exchange '{unique}-missing' in vhost '/'"})
        assert request(broker, "POST", bindings_path("amq.direct", unique + "-missing"), {"routing_key": "k"}) == (
            404, {"error": "not_found", "reason": f"no queue '{unique}-missing' in vhost '/'"})
        assert request(broker, "POST", bindings_path("amq.default", unique), {"routing_key": "k"}) == REFUSED
        assert request(broker, "GET", bindings_path("amq.direct", unique) + "/nothing").status == 404
        ch.queue_delete(unique)


def test_the_bindings_of_what_does_not_exist_are_listed_as_rabbitmq_lists_them(broker, unique):
    """No bindings for a missing exchange; a missing queue's implicit one to the default exchange alone; none at all
    in a missing vhost, where the vhost's own listings answer 404; a user without permissions in an existing vhost
    still refused there."""
    missing = f"{unique}-missing"
    implicit = ("", missing, "queue", missing, {})
    for direction in ("source", "destination"):
        assert request(broker, "GET", f"/api/exchanges/%2F/{quote(missing)}/bindings/{direction}") == (200, [])
    assert summary(request(broker, "GET", f"/api/queues/%2F/{quote(missing)}/bindings").body) == [implicit]
    assert summary(request(broker, "GET", bindings_path("amq.default", missing)).body) == [implicit]
    assert request(broker, "GET", f"{bindings_path('amq.default', missing)}/{quote(missing)}").status == 404
    assert request(broker, "GET", bindings_path("amq.direct", missing)) == (200, [])
    add_user(broker, unique, "secret", "management")
    try:
        for path in (f"/api/queues/{quote(missing)}/q/bindings", f"/api/exchanges/{quote(missing)}/x/bindings/source",
                     f"/api/exchanges/{quote(missing)}/x/bindings/destination", bindings_path("x", "q", vhost=missing)):
            assert request(broker, "GET", path) == (200, [])
            assert request(broker, "GET", path, user=unique, password="secret") == (200, [])
        assert request(broker, "GET", f"/api/bindings/{quote(missing)}").status == 404
        assert request(broker, "GET", f"/api/queues/%2F/{quote(missing)}/bindings", user=unique,
                       password="secret") == (401, {"error": "not_authorised",
                                                    "reason": "User not authorised to access virtual host"})
    finally:
        request(broker, "DELETE", f"/api/users/{quote(unique)}")
