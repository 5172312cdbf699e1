"""The management API's queues: declare, show, list, delete, purge and get, with RabbitMQ's JSON and status codes,
checked against what AMQP clients see of the same queues."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse

import pika
import pytest

from tests.integration.helpers import (
    EVENT_TIMEOUT, connect, consume, declare_queue, drain, enqueue, message_count, open_channel, publish, rabbitmq4,
    wait_for_message_count,
)
from tests.integration.management import (
    Reply, add_user, add_vhost, clear_policy, delete_user, delete_vhost, quote, request, set_permissions, set_policy,
    wait_for_api,
)
from tests.tmpfs import fill, tmpfs
from tests.waiting import wait_for

# RabbitMQ's API shows queue counts from statistics emitted every 5 seconds: counts are polled this long.
STATS_TIMEOUT = 15.0


def queue_path(name: str, vhost: str = "/") -> str:
    return f"/api/queues/{quote(vhost)}/{quote(name)}"


def queue_with(broker, name: str, **expected) -> dict:
    """The queue's JSON once its fields have the expected values (RabbitMQ's statistics lag behind)."""
    def shows(reply: Reply) -> bool:
        assert reply.status == 200, reply
        return all(reply.body.get(key) == value for key, value in expected.items())
    return wait_for(lambda: request(broker, "GET", queue_path(name)), STATS_TIMEOUT, f"{name} with {expected}", 0.2,
                    until=shows).body


def get_messages(broker, name: str, count: int, ackmode: str, encoding: str = "auto", **extra) -> list[dict]:
    reply = request(broker, "POST", f"{queue_path(name)}/get",
                    {"count": count, "ackmode": ackmode, "encoding": encoding, **extra})
    assert reply.status == 200, reply
    return reply.body


def test_declare_show_and_delete(broker, unique):
    assert request(broker, "PUT", queue_path(unique), {"durable": True, "arguments": {"x-max-length": 10}}).status \
        == 201
    assert request(broker, "PUT", queue_path(unique), {"durable": True, "arguments": {"x-max-length": 10}}).status \
        == 204
    queue = queue_with(broker, unique, state="running")
    assert {key: queue[key] for key in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type",
                                        "state")} == {
        "name": unique, "vhost": "/", "durable": True, "auto_delete": False, "exclusive": False,
        "arguments": {"x-max-length": 10}, "type": "classic", "state": "running"}
    assert isinstance(queue["node"], str) and queue["consumer_details"] == []
    listed = request(broker, "GET", "/api/queues/%2F").body
    assert unique in [item["name"] for item in listed]
    assert unique in [item["name"] for item in request(broker, "GET", "/api/queues").body]
    assert request(broker, "DELETE", queue_path(unique)).status == 204
    assert request(broker, "GET", queue_path(unique)) == (404, {"error": "Object Not Found", "reason": "Not Found"})
    assert request(broker, "DELETE", queue_path(unique)).status == 404


def test_declared_queue_is_the_amqp_queue(broker, unique):
    assert request(broker, "PUT", queue_path(unique), {"auto_delete": "false"}).status == 201
    with open_channel(broker) as ch:
        publish(ch, unique, [b"one"])
        wait_for_message_count(ch, unique, 1)


def test_inequivalent_redeclare_and_bad_values(broker, unique):
    assert request(broker, "PUT", queue_path(unique), {"durable": True}).status == 201
    assert request(broker, "PUT", queue_path(unique), {"durable": False}) == (400, {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{unique}' in vhost '/': received 'false' but current is "
                  "'true'"})
    assert request(broker, "PUT", queue_path(unique + "-2"), {"durable": 5}) == (
        400, {"error": "bad_request", "reason": ["not_boolean", 5]})
    assert request(broker, "PUT", queue_path(unique + "-3"), {"arguments": {"x-max-length": "abc"}}) == (400, {
        "error": "bad_request",
        "reason": f"invalid arg 'x-max-length' for queue '{unique}-3' in vhost '/': \"expected integer, got "
                  "longstr\""})
    assert request(broker, "PUT", queue_path(unique + "-4"), {"arguments": {"x-anything": None}}) == (
        400, {"error": "bad_request", "reason": "null_not_allowed"})
    assert request(broker, "PUT", queue_path("amq.reserved-" + unique), {}) == (
        401, {"error": "not_authorised", "reason": "Access refused."})
    assert request(broker, "DELETE", queue_path(unique)).status == 204


def test_counts_follow_amqp_traffic(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique, durable=True)
        publish(ch, unique, [b"a" * 10, b"b" * 20], properties=pika.BasicProperties(delivery_mode=2))
        publish(ch, unique, [b"c" * 30])
        method, _, _ = ch.basic_get(unique)  # held unacked while the counts are read
        queue = queue_with(broker, unique, messages=3, messages_ready=2, messages_unacknowledged=1, message_bytes=60)
        assert queue["message_bytes_unacknowledged"] == 10
        assert queue["message_bytes_ready"] == 50 and queue["consumers"] == 0
        assert isinstance(queue["memory"], int) and queue["memory"] > 0
        ch.basic_ack(method.delivery_tag)
        queue_with(broker, unique, messages=2, messages_unacknowledged=0)
        ch.queue_delete(unique)


def test_the_bytes_of_a_priority_queue_deeper_than_the_walk_count_every_message(broker, unique):
    """A priority queue keeps every ready message in memory; its counts walk 10,000 of them at most (a walk of
    millions held the broker's other clients) and take the rest as those: exact for messages of one size."""
    with connect(broker) as connection:
        ch = connection.channel()
        declare_queue(ch, unique, arguments={"x-max-priority": 5})
        enqueue(connection, unique, [b"x" * 16] * 12_000, properties=pika.BasicProperties(delivery_mode=1))
        queue = queue_with(broker, unique, messages=12_000, messages_ready=12_000)
        assert queue["message_bytes_ready"] == 12_000 * 16 and queue["message_bytes"] == 12_000 * 16
        ch.queue_delete(unique)


def test_consumer_details(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        ch.basic_qos(prefetch_count=7)
        tag, _ = consume(ch, unique, arguments={"x-priority": 3})
        queue = queue_with(broker, unique, consumers=1)
        [consumer] = queue["consumer_details"]
        assert {key: consumer[key] for key in ("consumer_tag", "exclusive", "ack_required", "prefetch_count",
                                               "arguments", "queue")} == {
            "consumer_tag": tag, "exclusive": False, "ack_required": True, "prefetch_count": 7,
            "arguments": {"x-priority": 3}, "queue": {"name": unique, "vhost": "/"}}
        assert consumer["channel_details"]["number"] == ch.channel_number
        assert consumer["channel_details"]["user"] == "guest"
        assert request(broker, "DELETE", queue_path(unique) + "?if-unused=true") == (
            400, {"error": "bad_request", "reason": f"queue '{unique}' in vhost '/' in use"})


def test_purge(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        publish(ch, unique, [b"1", b"2", b"3"])
        wait_for_message_count(ch, unique, 3)
        assert request(broker, "DELETE", queue_path(unique) + "?if-empty=true") == (
            400, {"error": "bad_request", "reason": f"queue '{unique}' in vhost '/' not empty"})
        assert request(broker, "DELETE", queue_path(unique) + "/contents").status == 204
        assert message_count(ch, unique) == 0
        assert request(broker, "DELETE", queue_path(unique) + "?if-empty=true").status == 204


def test_get_with_requeue_puts_messages_back_redelivered(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        publish(ch, unique, [b"first", b"second", b"third"])
        wait_for_message_count(ch, unique, 3)
        got = get_messages(broker, unique, 2, "ack_requeue_true")
        assert [(m["payload"], m["payload_encoding"], m["redelivered"], m["message_count"], m["routing_key"],
                 m["exchange"], m["payload_bytes"]) for m in got] == [
            ("first", "string", False, 2, unique, "", 5), ("second", "string", False, 1, unique, "", 6)]
        assert [(m.body, m.redelivered) for m in drain(ch, unique)] == [
            (b"first", True), (b"second", True), (b"third", False)]


def test_get_ack_and_reject_modes(broker, unique):
    dead = unique + "-dead"
    with open_channel(broker) as ch:
        declare_queue(ch, dead)
        declare_queue(ch, unique, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        publish(ch, unique, [b"acked", b"rejected", b"requeued", b"kept"])
        wait_for_message_count(ch, unique, 4)
        assert [m["payload"] for m in get_messages(broker, unique, 1, "ack_requeue_false")] == ["acked"]
        assert [m["payload"] for m in get_messages(broker, unique, 1, "reject_requeue_false")] == ["rejected"]
        assert [m["payload"] for m in get_messages(broker, unique, 1, "reject_requeue_true")] == ["requeued"]
        assert [(m.body, m.redelivered) for m in drain(ch, unique)] == [(b"requeued", True), (b"kept", False)]
        [dead_lettered] = drain(ch, dead)
        assert dead_lettered.body == b"rejected"
        assert dead_lettered.properties.headers["x-death"][0]["reason"] == "rejected"


def test_get_encodings_truncation_and_properties(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        properties = pika.BasicProperties(content_type="text/plain", delivery_mode=2, priority=3,
                                          correlation_id="c1", message_id="m1", timestamp=1700000000,
                                          headers={"n": 1, "s": "x", "list": [1, "y"], "raw": b"\xff\x01"})
        publish(ch, unique, ["héllo wörld".encode()], properties=properties)
        publish(ch, unique, [b"\x00\x01\xff"])
        wait_for_message_count(ch, unique, 2)
        first, second = get_messages(broker, unique, -1, "ack_requeue_true", truncate=8)
        assert (first["payload"], first["payload_encoding"], first["payload_bytes"]) == ("héllo w", "string", 13)
        assert first["properties"] == {
            "content_type": "text/plain", "delivery_mode": 2, "priority": 3, "correlation_id": "c1",
            "message_id": "m1", "timestamp": 1700000000,
            "headers": {"n": 1, "s": "x", "list": [1, "y"], "raw": "Not UTF-8, base64 is: /wE="}}
        assert (second["payload"], second["payload_encoding"], second["properties"]) == ("AAH/", "base64", [])
        [again, _] = get_messages(broker, unique, 2, "ack_requeue_false", encoding="base64")
        assert (again["payload"], again["redelivered"]) == ("aMOpbGxvIHfDtnJsZA==", True)


def test_get_refusals(broker, unique):
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
        assert request(broker, "POST", f"{queue_path(unique)}/get", {**body, "encoding": "x"}) == (
            400, {"error": "bad_request", "reason": "Unsupported encoding. Please use auto or base64."})
        assert request(broker, "POST", f"{queue_path(unique)}/get", {"ackmode": "ack_requeue_true",
                                                                    "encoding": "auto"}) == (
            400, {"error": "bad_request", "reason": "[{key_missing,count}]"})
        assert request(broker, "POST", f"{queue_path(unique + '-missing')}/get", body) == (
            404, {"error": "not_found", "reason": f"NOT_FOUND - no queue '{unique}-missing' in vhost '/'"})
        assert get_messages(broker, unique, 1, "ack_requeue_true") == []


@pytest.fixture
def limited_user(broker, unique):
    """A management user who may configure, write and read only names starting with "ok-"."""
    name = unique + "-user"
    add_user(broker, name, "secret", "management")
    set_permissions(broker, "/", name, "^ok-", "^ok-", "^ok-")
    yield name
    delete_user(broker, name)


def test_changes_need_the_amqp_permissions(broker, unique, limited_user):
    refused = (401, {"error": "not_authorised", "reason": "Access refused."})
    as_user = {"user": limited_user, "password": "secret"}
    with open_channel(broker) as ch:
        declare_queue(ch, unique)
        publish(ch, unique, [b"x"])
        wait_for_message_count(ch, unique, 1)
        assert request(broker, "PUT", queue_path(unique + "-new"), {}, **as_user) == refused
        assert request(broker, "DELETE", queue_path(unique), **as_user) == refused
        assert request(broker, "DELETE", queue_path(unique) + "/contents", **as_user) == refused
        reply = request(broker, "POST", f"{queue_path(unique)}/get",
                        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}, **as_user)
        assert reply == (401, {"error": "not_authorised",
                               "reason": f"ACCESS_REFUSED - access to queue '{unique}' in vhost '/' refused for "
                                         f"user '{limited_user}'"})
        assert request(broker, "GET", queue_path(unique), **as_user).status == 200  # reading needs no permission
        assert message_count(ch, unique) == 1
        own = "ok-" + unique
        assert request(broker, "PUT", queue_path(own), {}, **as_user).status == 201
        assert request(broker, "DELETE", queue_path(own), **as_user).status == 204


def test_durable_queue_and_its_messages_survive_a_restart(own_broker, unique):
    broker = own_broker()
    assert request(broker, "PUT", queue_path(unique), {"durable": True}).status == 201
    message = {"routing_key": unique, "properties": {"delivery_mode": 2}, "payload": "kept",
               "payload_encoding": "string"}
    assert request(broker, "POST", "/api/exchanges/%2F/amq.default/publish", message).body == {"routed": True}
    broker.kill()  # the message was on disk before the publish was answered
    broker.start()
    wait_for_api(broker, EVENT_TIMEOUT)
    assert [m["payload"] for m in get_messages(broker, unique, 1, "ack_requeue_false")] == ["kept"]


def test_pages_of_the_listing(broker, unique):
    names = [f"{unique}-{letter}" for letter in "abc"]
    for name in names:
        assert request(broker, "PUT", queue_path(name), {}).status == 201
    page = request(broker, "GET", f"/api/queues/%2F?page=2&page_size=2&name={quote(unique.upper())}").body
    assert {key: page[key] for key in ("filtered_count", "item_count", "page", "page_count", "page_size")} == {
        "filtered_count": 3, "item_count": 1, "page": 2, "page_count": 2, "page_size": 2}
    assert [item["name"] for item in page["items"]] == names[2:] and page["total_count"] >= 3
    regex = quote(f"^{unique}-[ab]$")
    page = request(broker, "GET", f"/api/queues?page=1&name={regex}&use_regex=true").body
    assert ([item["name"] for item in page["items"]], page["page_size"]) == (names[:2], 100)
    assert request(broker, "GET", f"/api/queues?page=3&page_size=2&name={unique}") == (400, {
        "error": "page_out_of_range", "reason": "Page out of range, page: 3 page size: 2, len: 3"})
    assert request(broker, "GET", "/api/queues?page=1&page_size=501") == (400, {
        "error": "invalid_pagination_parameters",
        "reason": "Invalid pagination parameters: page number 1, page size 501"})
    for name in names:
        assert request(broker, "DELETE", queue_path(name)).status == 204


def rabbitmqadmin(broker, *arguments: str) -> str:
    """Run Debian's rabbitmqadmin against the broker's API; its output."""
    address = urllib.parse.urlparse(broker.management_url)
    done = subprocess.run(["rabbitmqadmin", "-H", address.hostname, "-P", str(address.port), "-u", "guest", "-p",
                           "guest", *arguments], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("rabbitmqadmin") is None, reason="rabbitmqadmin (Debian's rabbitmq-server) is "
                                                                  "not installed")
def test_rabbitmqadmin_declares_publishes_gets_purges_and_deletes(broker, unique):
    assert rabbitmqadmin(broker, "declare", "queue", f"name={unique}", "durable=true").strip() == "queue declared"
    rabbitmqadmin(broker, "declare", "exchange", f"name={unique}", "type=fanout")
    rabbitmqadmin(broker, "declare", "binding", f"source={unique}", f"destination={unique}", "routing_key=rk")
    bindings = json.loads(rabbitmqadmin(broker, "-f", "raw_json", "list", "bindings"))
    assert {"source": unique, "destination": unique, "routing_key": "rk"}.items() <= next(
        binding for binding in bindings if binding["source"] == unique).items()
    assert rabbitmqadmin(broker, "publish", f"exchange={unique}", "routing_key=x", "payload=hi").strip() == \
        "Message published"
    queue_with(broker, unique, messages=1)
    [got] = json.loads(rabbitmqadmin(broker, "-f", "raw_json", "get", f"queue={unique}", "ackmode=ack_requeue_true"))
    assert (got["payload"], got["exchange"], got["routing_key"]) == ("hi", unique, "x")
    listed = json.loads(rabbitmqadmin(broker, "-f", "raw_json", "list", "queues", "name", "messages"))
    assert {"name": unique, "messages": 1} in listed
    rabbitmqadmin(broker, "purge", "queue", f"name={unique}")
    queue_with(broker, unique, messages=0)
    rabbitmqadmin(broker, "delete", "binding", f"source={unique}", "destination_type=queue",
                  f"destination={unique}", "properties_key=rk")
    rabbitmqadmin(broker, "delete", "exchange", f"name={unique}")
    rabbitmqadmin(broker, "delete", "queue", f"name={unique}")
    assert request(broker, "GET", queue_path(unique)).status == 404


def test_who_sees_the_queues_of_a_vhost(broker, unique, limited_user):
    vhost, admin = unique + "-vhost", unique + "-admin"
    add_vhost(broker, vhost)
    set_permissions(broker, vhost, "guest")
    add_user(broker, admin, "secret", "administrator")
    try:
        assert request(broker, "PUT", queue_path("hidden", vhost), {}).status == 201
        hidden = (401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})
        as_user = {"user": limited_user, "password": "secret"}
        assert vhost not in {queue["vhost"] for queue in request(broker, "GET", "/api/queues", **as_user).body}
        assert request(broker, "GET", queue_path("hidden", vhost), **as_user) == hidden
        assert request(broker, "GET", f"/api/queues/{quote(vhost)}", **as_user) == hidden
        assert request(broker, "PUT", queue_path("other", vhost), {}, **as_user) == hidden
        # an administrator sees every vhost, but changes things only where it has permissions
        as_admin = {"user": admin, "password": "secret"}
        assert ("hidden", vhost) in {(queue["name"], queue["vhost"])
                                     for queue in request(broker, "GET", "/api/queues", **as_admin).body}
        assert request(broker, "GET", queue_path("hidden", vhost), **as_admin).status == 200
        assert request(broker, "PUT", queue_path("other", vhost), {}, **as_admin) == (
            401, {"error": "not_authorised", "reason": "Access refused."})
    finally:
        delete_user(broker, admin)
        delete_vhost(broker, vhost)


def test_a_declare_the_disk_cannot_take_is_a_500_and_taken_back(own_broker, tmp_path):
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        broker = own_broker(data_dir=disk / "data")
        wait_for_api(broker, EVENT_TIMEOUT)
        fill(disk)
        padding = {"x-padding": "p" * 10000}  # larger than what is left of the last page of a file
        assert request(broker, "PUT", queue_path("full"), {"durable": True, "arguments": padding}) == (
            500, {"error": "internal_error", "reason": "the change could not be written to disk"})
        os.unlink(disk / "filler")
        assert request(broker, "GET", queue_path("full")).status == 404
        broker.stop()


@rabbitmq4  # 3.x applies no policy with a queue-leader-locator to a classic queue
def test_leader_locators_of_a_policy_are_shown(broker, unique):
    set_policy(broker, "/", unique, f"^{unique}$", {"queue-leader-locator": "client-local",
                                                    "queue-master-locator": "min-masters"}, apply_to="queues")
    try:
        assert request(broker, "PUT", queue_path(unique), {}).status == 201
        queue = queue_with(broker, unique, policy=unique)
        assert queue["effective_policy_definition"] == {"queue-leader-locator": "client-local",
                                                        "queue-master-locator": "min-masters"}
    finally:
        clear_policy(broker, "/", unique)
        request(broker, "DELETE", queue_path(unique))


@rabbitmq4
def test_an_operator_policy_takes_the_master_locator_but_not_the_leader_locator(broker, unique):
    set_policy(broker, "/", unique, ".*", {"queue-master-locator": "balanced"}, kind="operator-policies")
    clear_policy(broker, "/", unique, kind="operator-policies")
    reply = request(broker, "PUT", f"/api/operator-policies/%2F/{quote(unique)}",
                    {"pattern": ".*", "definition": {"queue-leader-locator": "balanced"}})
    assert reply == (400, {"error": "bad_request", "reason": 'Validation failed\n\n[{<<"queue-leader-locator">>,'
                                                     '<<"balanced">>}] are not recognised policy settings\n'})


def test_policies_that_apply_are_shown(broker, unique):
    set_policy(broker, "/", unique, f"^{unique}$", {"max-length": 5}, apply_to="queues")
    set_policy(broker, "/", unique, f"^{unique}$", {"max-length": 3}, apply_to="queues", kind="operator-policies")
    try:
        assert request(broker, "PUT", queue_path(unique), {}).status == 201
        queue = queue_with(broker, unique, policy=unique)
        assert (queue["operator_policy"], queue["effective_policy_definition"]) == (unique, {"max-length": 3})
    finally:
        clear_policy(broker, "/", unique)
        clear_policy(broker, "/", unique, kind="operator-policies")
        request(broker, "DELETE", queue_path(unique))
