"""Dynamic shovels, defined through the management API with RabbitMQ's keys: what reaches the destination, what the
status shows, and what a failure leaves where (nothing confirmed is lost: an unroutable message stays at the
source). The shovels here connect to the broker under test itself, by its host and port."""

from __future__ import annotations

import json

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import beyond_rabbitmq, connect, declare_queue, get_all, message_count, rabbitmq4
from tests.waiting import wait_for

SHOVEL_TIMEOUT = 30.0  # seconds a shovel may take to connect and move a few hundred messages


@pytest.fixture
def shovels(broker):
    """Define shovels in vhost "/" (cleared at the end of the test); each URI is the broker's own."""
    made: list[str] = []

    def define(name: str, value: dict) -> management.Reply:
        reply = management.request(broker, "PUT", f"/api/parameters/shovel/%2F/{management.quote(name)}",
                                   {"value": {"src-uri": broker.url, "dest-uri": broker.url, **value}})
        made.append(name)
        return reply

    yield define
    for name in made:
        management.request(broker, "DELETE", f"/api/parameters/shovel/%2F/{management.quote(name)}")


def status_of(broker, name: str) -> dict | None:
    reply = management.request(broker, "GET", "/api/shovels/%2F")
    assert reply.status == 200, reply
    return next((entry for entry in reply.body if entry["name"] == name), None)


def deleted_itself(broker, name: str) -> None:
    """Wait until the shovel has moved what src-delete-after says and its parameter is gone."""
    wait_for(lambda: management.request(broker, "GET", f"/api/parameters/shovel/%2F/{name}").status,
             SHOVEL_TIMEOUT, "the shovel deleting itself", until=lambda status: status == 404)


def running(broker, name: str) -> dict:
    return wait_for(lambda: status_of(broker, name), SHOVEL_TIMEOUT, f"shovel {name} running",
                    until=lambda entry: entry is not None and entry["state"] == "running")


def test_a_shovel_moves_every_message_of_a_queue_to_another_with_its_properties_and_body(broker, shovels, unique):
    source, target = f"{unique}.from", f"{unique}.to"
    headers = {"x-death": [{"count": 1, "reason": "rejected", "queue": "q"}], "n": 7, "s": "text"}
    properties = pika.BasicProperties(content_type="application/json", delivery_mode=2, priority=3,
                                      correlation_id="c-1", message_id="m-1", timestamp=1700000000, type="t",
                                      app_id="app", headers=headers)
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source, durable=True)
        declare_queue(ch, target, durable=True)
        for number in range(300):
            ch.basic_publish("", source, b"%d" % number, properties)
        assert shovels(f"{unique}.shovel", {"src-queue": source, "dest-queue": target}).status == 201
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "300 messages moved", until=lambda n: n == 300)
        assert message_count(ch, source) == 0
        received = []
        for _ in range(300):
            method, got, body = ch.basic_get(target, auto_ack=True)
            received.append((got, body))
    assert [body for _, body in received] == [b"%d" % number for number in range(300)]
    for got, _ in received:
        assert (got.content_type, got.delivery_mode, got.priority, got.correlation_id, got.message_id, got.type,
                got.app_id, got.timestamp, got.headers) == (
            "application/json", 2, 3, "c-1", "m-1", "t", "app", 1700000000, headers)


@rabbitmq4  # (the counters came with 4.1, blocked_status with 3.12)
def test_the_status_shows_a_running_shovel_as_rabbitmq_4_does(broker, shovels, unique):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        ch.basic_publish("", source, b"one")
        shovels(name, {"src-queue": source, "dest-queue": target})
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
    entry = running(broker, name)
    host = f"amqp://{broker.host}:{broker.port}/%2F"
    assert {key: entry[key] for key in ("name", "vhost", "type", "state", "blocked_status", "src_uri", "dest_uri",
                                        "src_queue", "dest_queue", "src_protocol", "dest_protocol", "forwarded",
                                        "remaining", "remaining_unacked", "pending")} == {
        "name": name, "vhost": "/", "type": "dynamic", "state": "running", "blocked_status": "running",
        "src_uri": host, "dest_uri": host, "src_queue": source, "dest_queue": target, "src_protocol": "amqp091",
        "dest_protocol": "amqp091", "forwarded": 1, "remaining": "unlimited", "remaining_unacked": "unlimited",
        "pending": 0}
    assert "guest" not in str(entry)  # (no credentials shown)
    parameter = management.request(broker, "GET", f"/api/parameters/shovel/%2F/{name}")
    assert parameter.status == 200 and parameter.body["component"] == "shovel"
    assert parameter.body["value"]["src-queue"] == source


def test_a_definition_rabbitmq_refuses_is_refused_with_its_reasons(broker, shovels, unique):
    reply = shovels(f"{unique}.shovel", {"ack-mode": "sometimes", "dest-queue": "q"})
    assert reply.status == 400
    assert reply.body["reason"] == (  # (escaped, as RabbitMQ's parameter view escapes its refusals)
        "Validation failed\n\nMust specify 'src-exchange' or 'src-queue'\nack-mode should be one of "
        "[&lt;&lt;\"no-ack\"&gt;&gt;,&lt;&lt;\"on-publish\"&gt;&gt;,&lt;&lt;\"on-confirm\"&gt;&gt;], actually was "
        "&lt;&lt;\"sometimes\"&gt;&gt;\n")
    reply = shovels(f"{unique}.shovel", {"src-queue": "a", "src-exchange": "b", "dest-queue": "q"})
    assert reply.status == 400 and "Cannot specify 'src-exchange' and 'src-queue'" in reply.body["reason"]


@beyond_rabbitmq  # (RabbitMQ 3.x/4.x publish without mandatory: the destination drops it, the source acks it)
def test_a_message_the_destination_cannot_route_stays_at_the_source_and_moves_once_it_can(broker, shovels, unique):
    source, exchange, target, name = f"{unique}.from", f"{unique}.nowhere", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        ch.exchange_declare(exchange, "direct")
        ch.basic_publish("", source, b"kept")
        shovels(name, {"src-queue": source, "dest-exchange": exchange, "dest-exchange-key": "k",
                       "reconnect-delay": 1})
        entry = wait_for(lambda: status_of(broker, name), SHOVEL_TIMEOUT, "the shovel failing",
                         until=lambda entry: entry is not None and entry["state"] == "terminated")
        assert "312 NO_ROUTE" in entry["reason"], entry
        # back in its queue, not dropped (ready, or delivered again to the shovel's next try)
        assert management.request(broker, "GET", f"/api/queues/%2F/{source}").body["messages"] == 1
        ch.queue_bind(target, exchange, "k")
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
        assert get_all(ch, target) == [b"kept"] and message_count(ch, source) == 0
        ch.exchange_delete(exchange)


def test_delete_after_queue_length_moves_what_the_queue_held_then_the_shovel_goes(broker, shovels, unique):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        for number in range(50):
            ch.basic_publish("", source, b"%d" % number)
        shovels(name, {"src-queue": source, "dest-queue": target, "src-delete-after": "queue-length"})
        deleted_itself(broker, name)
        assert message_count(ch, target) == 50
        ch.basic_publish("", source, b"after")
        assert status_of(broker, name) is None and message_count(ch, source) == 1


def test_an_exchange_source_moves_what_is_published_there_with_forward_headers(broker, shovels, unique):
    exchange, target, name = f"{unique}.events", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", auto_delete=True)
        declare_queue(ch, target)
        shovels(name, {"src-exchange": exchange, "src-exchange-key": "a.*", "dest-queue": target,
                       "dest-add-forward-headers": True, "dest-add-timestamp-header": True})
        running(broker, name)
        for key in ("a.one", "b.two", "a.three"):
            ch.basic_publish(exchange, key, key.encode())
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "two messages moved", until=lambda n: n == 2)
        got = [ch.basic_get(target, auto_ack=True) for _ in range(2)]
    assert [body for _, _, body in got] == [b"a.one", b"a.three"]
    headers = got[0][1].headers
    host = f"amqp://{broker.host}:{broker.port}/%2F"
    cluster_name = management.request(broker, "GET", "/api/cluster-name").body["name"]
    assert headers["x-shovelled"] == [{
        "shovelled-by": cluster_name, "shovel-type": "dynamic", "shovel-name": name, "shovel-vhost": "/",
        "src-uri": host, "dest-uri": host, "src-exchange": exchange, "src-exchange-key": "a.*",
        "dest-queue": target}]
    assert isinstance(headers["x-shovelled-timestamp"], int)


def test_a_shovel_is_kept_across_a_restart_and_runs_again(own_broker, unique):
    broker = own_broker()
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source, durable=True)
        declare_queue(ch, target, durable=True)
    reply = management.request(broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": broker.url, "dest-uri": broker.url, "src-queue": source, "dest-queue": target}})
    assert reply.status == 201
    running(broker, name)
    broker.restart()
    management.wait_for_api(broker)
    running(broker, name)
    with connect(broker) as conn:
        ch = conn.channel()
        ch.basic_publish("", source, b"after the restart", pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
    exported = management.request(broker, "GET", "/api/definitions").body
    assert [item["name"] for item in exported["parameters"] if item.get("component") == "shovel"] == [name]


def test_a_destination_killed_mid_way_loses_nothing_the_source_held(own_broker, tmp_path, unique):
    """Between two brokers, on-confirm: the destination killed -9 while the shovel moves 3,000 persistent messages,
    then started again on its port: every message arrives (some twice: those it had confirmed were not acked at
    the source yet), and the source ends empty."""
    source_broker = own_broker(data_dir=tmp_path / "source")
    target_broker = own_broker(data_dir=tmp_path / "target")
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    sent = [b"%d" % number for number in range(3000)]
    with connect(target_broker) as conn:
        declare_queue(conn.channel(), target, durable=True)
    with connect(source_broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source, durable=True)
        ch.confirm_delivery()
        for body in sent:
            ch.basic_publish("", source, body, pika.BasicProperties(delivery_mode=2))
    reply = management.request(source_broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": source_broker.url, "dest-uri": target_broker.url, "src-queue": source, "dest-queue": target,
        "src-prefetch-count": 100, "reconnect-delay": 1}})
    assert reply.status == 201
    with connect(target_broker) as conn:
        ch = conn.channel()
        moved = wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "some messages moved", step=0.001,
                         until=lambda n: n >= 300)
    target_broker.kill()
    assert moved < len(sent)  # (the kill came mid-way)
    target_broker.start()
    with connect(source_broker) as conn:
        ch = conn.channel()
        wait_for(lambda: management.request(source_broker, "GET", f"/api/queues/%2F/{source}").body["messages"],
                 60, "the source emptied", until=lambda n: n == 0)
    with connect(target_broker) as conn:
        received = get_all(conn.channel(), target)
    assert set(received) == set(sent)
    assert len(received) - len(sent) <= 100  # duplicates: at most what was in flight (the prefetch)


def test_a_shovel_in_imported_definitions_runs_and_a_bad_one_refuses_the_import(broker, unique):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    value = {"src-uri": broker.url, "dest-uri": broker.url, "src-queue": source, "dest-queue": target}
    bad = {"vhost": "/", "component": "shovel", "name": f"{unique}.bad", "value": {**value, "src-exchange": "x"}}
    reply = management.request(broker, "POST", "/api/definitions", {"parameters": [bad]})
    assert reply.status == 400 and "Cannot specify 'src-exchange' and 'src-queue'" in reply.body["reason"], reply
    assert management.request(broker, "GET", f"/api/parameters/shovel/%2F/{unique}.bad").status == 404
    good = {"vhost": "/", "component": "shovel", "name": name, "value": value}
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        ch.basic_publish("", source, b"imported")
        try:
            assert management.request(broker, "POST", "/api/definitions", {"parameters": [good]}).status in (201, 204)
            wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
        finally:
            management.request(broker, "DELETE", f"/api/parameters/shovel/%2F/{name}")


def test_a_uri_without_a_host_names_this_node(broker, shovels, unique):
    """RabbitMQ's amqp:// (its direct connection to the local node): Warren connects to its own port, as the URI's
    user (guest/guest when it names none)."""
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        ch.basic_publish("", source, b"local")
        assert shovels(name, {"src-uri": "amqp://", "dest-uri": "amqp:///%2F", "src-queue": source,
                              "dest-queue": target}).status == 201
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
    assert {key: running(broker, name)[key] for key in ("src_uri", "dest_uri")} == {
        "src_uri": "amqp://", "dest_uri": "amqp:///%2F"}


def test_an_exchange_source_keeps_what_is_routed_while_the_destination_is_down(own_broker, tmp_path, unique):
    """An exchange source is read through a durable queue of the shovel's own (RabbitMQ's is server-named and
    exclusive, so what the exchange routes while the shovel reconnects is lost): nothing published while the
    destination is down is lost; the queue goes with the shovel."""
    source_broker = own_broker(data_dir=tmp_path / "source")
    target_broker = own_broker(data_dir=tmp_path / "target")
    exchange, target, name = f"{unique}.events", f"{unique}.to", f"{unique}.shovel"
    with connect(target_broker) as conn:
        declare_queue(conn.channel(), target, durable=True)
    with connect(source_broker) as conn:
        conn.channel().exchange_declare(exchange, "fanout", durable=True)
    management.request(source_broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": source_broker.url, "src-exchange": exchange, "dest-uri": target_broker.url, "dest-queue": target,
        "reconnect-delay": 1}})
    running(source_broker, name)
    target_broker.kill()
    with connect(source_broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for number in range(100):
            ch.basic_publish(exchange, "", b"%d" % number, pika.BasicProperties(delivery_mode=2))
    target_broker.start()
    with connect(target_broker) as conn:
        ch = conn.channel()
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "100 messages moved", until=lambda n: n == 100)
        assert get_all(ch, target) == [b"%d" % number for number in range(100)]
    queues = {queue["name"] for queue in management.request(source_broker, "GET", "/api/queues/%2F").body}
    [kept] = [queue for queue in queues if queue.startswith(f"shovel-{name}-")]
    assert management.request(source_broker, "DELETE", f"/api/shovels/vhost/%2F/{name}").status == 204
    wait_for(lambda: management.request(source_broker, "GET", f"/api/queues/%2F/{kept}").status, SHOVEL_TIMEOUT,
             "the shovel's queue deleted", until=lambda status: status == 404)


def test_a_shovel_in_the_boot_definitions_runs_from_the_start(own_broker, tmp_path, unique):
    """RabbitMQ's static shovels live in advanced.config; its docs now advise dynamic shovels in the definitions
    imported at boot, as Warren's load_definitions does (at every start, so the shovel comes back if deleted)."""
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    definitions = tmp_path / "definitions.json"
    definitions.write_text(json.dumps({
        "queues": [{"name": queue, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
                   for queue in (source, target)],
        "parameters": [{"vhost": "/", "component": "shovel", "name": name, "value": {
            "src-uri": "amqp://", "src-queue": source, "dest-uri": "amqp://", "dest-queue": target}}]}))
    config = tmp_path / "warren.toml"
    config.write_text(f'[server]\nload_definitions = "{definitions}"\n')
    broker = own_broker("--config", str(config))
    running(broker, name)
    with connect(broker) as conn:
        ch = conn.channel()
        ch.basic_publish("", source, b"from the start")
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)


def test_a_destination_that_blocks_its_publishers_holds_the_shovel_which_says_so(own_broker, tmp_path, unique):
    """connection.blocked from the destination (here its memory alarm, on from its start) is honoured: the shovel
    reads no more from the source than it has in flight, and its state says "blocked"."""
    config = tmp_path / "low-memory.toml"
    config.write_text("[server]\nmemory_limit = 1\n")  # any broker is above one byte: the alarm is on from the start
    target_broker = own_broker("--config", str(config), data_dir=tmp_path / "target")
    source_broker = own_broker(data_dir=tmp_path / "source")
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(target_broker) as conn:
        declare_queue(conn.channel(), target, durable=True)
    with connect(source_broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source, durable=True)
        for number in range(5000):
            ch.basic_publish("", source, b"%d" % number, pika.BasicProperties(delivery_mode=2))
    management.request(source_broker, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": source_broker.url, "src-queue": source, "dest-uri": target_broker.url, "dest-queue": target,
        "src-prefetch-count": 100}})
    entry = wait_for(lambda: status_of(source_broker, name), SHOVEL_TIMEOUT, "the shovel blocked",
                     until=lambda entry: entry is not None and entry["state"] == "blocked")
    assert entry["blocked_status"] == "blocked"
    queue = management.request(source_broker, "GET", f"/api/queues/%2F/{source}").body
    moved = management.request(target_broker, "GET", f"/api/queues/%2F/{target}").body["messages"]
    # none lost (the publish that met the alarm may have gone through, its ack at the source still to come: then it
    # is counted on both sides), and few in flight
    assert (queue["messages"] + moved >= 5000, queue["messages_unacknowledged"] <= 100, moved <= 100) == (
        True, True, True), (queue["messages"], queue["messages_unacknowledged"], moved)


def test_a_uri_of_this_node_may_name_only_a_vhost_the_user_setting_it_may_use(broker, unique):
    """As RabbitMQ's check of a direct URI (amqp:// and the like): a policymaker of "/" cannot have a shovel read
    a vhost it has no permissions in."""
    user, other = f"{unique}.user", f"{unique}.vhost"
    management.add_user(broker, user, "secret", "policymaker")
    management.set_permissions(broker, "/", user)
    management.add_vhost(broker, other)
    try:
        reply = management.request(broker, "PUT", f"/api/parameters/shovel/%2F/{management.quote(unique)}", {
            "value": {"src-uri": f"amqp:///{management.quote(other)}", "src-queue": "q", "dest-uri": "amqp://",
                      "dest-queue": "q"}}, user=user, password="secret")
        assert reply.status == 400 and f'user "{user}" may not connect to vhost "{other}"' in reply.body["reason"]
    finally:
        management.delete_vhost(broker, other)
        management.delete_user(broker, user)


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_the_other_ack_modes_move_every_message_and_a_count_to_delete_after_stops_there(broker, shovels, unique,
                                                                                          ack_mode):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        for number in range(100):
            ch.basic_publish("", source, b"%d" % number)
        assert shovels(name, {"src-queue": source, "dest-queue": target, "ack-mode": ack_mode,
                              "src-delete-after": "queue-length" if ack_mode == "no-ack" else 60}).status == 201
        deleted_itself(broker, name)
        moved = 100 if ack_mode == "no-ack" else 60
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, f"{moved} moved", until=lambda n: n == moved)
        assert get_all(ch, target) == [b"%d" % number for number in range(moved)]
        assert get_all(ch, source) == [b"%d" % number for number in range(moved, 100)]


@rabbitmq4  # (src-predeclared came with 4.0)
def test_a_predeclared_queue_that_is_missing_terminates_the_shovel_until_it_is_declared(broker, shovels, unique):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, target)
        shovels(name, {"src-queue": source, "src-predeclared": True, "dest-queue": target, "reconnect-delay": 1})
        entry = wait_for(lambda: status_of(broker, name), SHOVEL_TIMEOUT, "the shovel failing",
                         until=lambda entry: entry is not None and entry["state"] == "terminated")
        assert "404 NOT_FOUND" in entry["reason"] and source in entry["reason"], entry
        declare_queue(ch, source)
        ch.basic_publish("", source, b"once declared")
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)


@rabbitmq4  # (before 4.2 a shovel that cannot connect shows "starting", or nothing, not why)
def test_bad_credentials_leave_the_shovel_terminated_saying_why(broker, shovels, unique):
    name = f"{unique}.shovel"
    wrong = broker.url.replace("guest:guest", "guest:wrong")
    shovels(name, {"src-uri": wrong, "src-queue": f"{unique}.from", "dest-queue": f"{unique}.to",
                   "reconnect-delay": 1})
    entry = wait_for(lambda: status_of(broker, name), SHOVEL_TIMEOUT, "the shovel failing",
                     until=lambda entry: entry is not None and entry["state"] == "terminated")
    assert "403 ACCESS_REFUSED" in entry["reason"] and "wrong" not in entry["reason"], entry


def test_a_changed_definition_restarts_the_shovel_with_it(broker, shovels, unique):
    source, first, second, name = f"{unique}.from", f"{unique}.first", f"{unique}.second", f"{unique}.shovel"
    with connect(broker) as conn:
        ch = conn.channel()
        for queue in (source, first, second):
            declare_queue(ch, queue)
        assert shovels(name, {"src-queue": source, "dest-queue": first}).status == 201
        ch.basic_publish("", source, b"one")
        wait_for(lambda: message_count(ch, first), SHOVEL_TIMEOUT, "one moved to first", until=lambda n: n == 1)
        assert shovels(name, {"src-queue": source, "dest-queue": second}).status == 204
        wait_for(lambda: (status_of(broker, name) or {}).get("dest_queue"), SHOVEL_TIMEOUT,
                 "the shovel running with its new definition", until=lambda queue: queue == second)
        ch.basic_publish("", source, b"two")
        wait_for(lambda: message_count(ch, second), SHOVEL_TIMEOUT, "two moved to second", until=lambda n: n == 1)
        assert message_count(ch, first) == 1


def test_a_message_of_200_kib_crosses_in_several_frames_whole(broker, shovels, unique):
    source, target, name = f"{unique}.from", f"{unique}.to", f"{unique}.shovel"
    body = bytes(range(256)) * 800
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, source)
        declare_queue(ch, target)
        ch.basic_publish("", source, body)
        shovels(name, {"src-queue": source, "dest-queue": target})
        wait_for(lambda: message_count(ch, target), SHOVEL_TIMEOUT, "the message moved", until=lambda n: n == 1)
        assert get_all(ch, target) == [body]


def test_a_shovel_in_the_config_file_runs_from_the_start_and_a_bad_one_stops_the_start(own_broker, tmp_path, unique):
    """RabbitMQ's static shovels: a [[shovels]] table (a name, a vhost, the keys of a dynamic shovel) is defined at
    every start; one that RabbitMQ would refuse keeps the broker from starting, saying why."""
    config = tmp_path / "warren.toml"
    config.write_text(f"""
[[shovels]]
name = "from-the-config"
vhost = "/"
src-uri = "amqp://"
src-queue = "{unique}.from"
dest-uri = "amqp://"
dest-queue = "{unique}.to"
reconnect-delay = 1
""")
    broker = own_broker("--config", str(config))
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, f"{unique}.from", durable=True)
        declare_queue(ch, f"{unique}.to", durable=True)
        ch.basic_publish("", f"{unique}.from", b"moved")
        wait_for(lambda: message_count(ch, f"{unique}.to"), SHOVEL_TIMEOUT, "the message moved",
                 until=lambda n: n == 1)
    assert running(broker, "from-the-config")["dest_queue"] == f"{unique}.to"
    broker.stop()
    config.write_text(config.read_text().replace('reconnect-delay = 1', 'ack-mode = "sometimes"'))
    with pytest.raises(RuntimeError):
        broker.start()
    assert "ack-mode should be one of" in broker.log() and "from-the-config" in broker.log()
