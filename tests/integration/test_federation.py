"""Federation, defined through the management API with RabbitMQ's parameters and policy keys: what a federated
exchange or queue receives from its upstream, what the links declare upstream and show in their status. The
upstreams here are the broker under test itself, by its host and port: a federated exchange or queue reads another
exchange or queue of the same vhost, named by the upstream's "exchange" or "queue" key."""

from __future__ import annotations

import hashlib
import threading

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import beyond_rabbitmq, connect, declare_queue, get_all, message_count
from tests.waiting import wait_for

LINK_TIMEOUT = 30.0  # seconds a link may take to start and move a few messages


@pytest.fixture
def unique(unique):
    """A short name prefix unique to the test: the queue a link declares upstream is named after two exchanges."""
    return "f" + hashlib.sha256(unique.encode()).hexdigest()[:12]


@pytest.fixture
def federation(broker):
    """Define upstreams (on the broker itself, in vhost "/" unless told) and policies, in vhost "/" unless told;
    cleared at the end of the test."""
    made: list[str] = []

    def upstream(name: str, value: dict, vhost: str = "/") -> management.Reply:
        made.append(f"/api/parameters/federation-upstream/{management.quote(vhost)}/{management.quote(name)}")
        return management.request(broker, "PUT", made[-1], {"value": {"uri": broker.url, **value}})

    def policy(name: str, pattern: str, definition: dict, apply_to: str = "all",
               vhost: str = "/") -> management.Reply:
        made.append(f"/api/policies/{management.quote(vhost)}/{management.quote(name)}")
        return management.request(broker, "PUT", made[-1], {"pattern": pattern, "definition": definition,
                                                            "apply-to": apply_to})

    yield upstream, policy
    for path in reversed(made):
        management.request(broker, "DELETE", path)


@pytest.fixture
def vhosts(broker, unique):
    """Make vhosts (guest may use them), deleted at the end of the test; each as (its name, its AMQP URL)."""
    made: list[str] = []

    def make(suffix: str) -> tuple[str, str]:
        name = f"{unique}-{suffix}"
        assert management.request(broker, "PUT", f"/api/vhosts/{name}").status in (201, 204)
        assert management.request(broker, "PUT", f"/api/permissions/{name}/guest", {
            "configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
        made.append(name)
        return name, broker.url.rsplit("/", 1)[0] + "/" + name

    yield make
    for name in made:
        management.request(broker, "DELETE", f"/api/vhosts/{name}")


def federate(federation, unique: str, federated: str, value: dict, kind: str) -> None:
    """An upstream f"{unique}.upstream" (the broker itself and value's keys) federating the exchange or queue named
    federated, through the policy f"{unique}.policy"."""
    upstream, policy = federation
    upstream(f"{unique}.upstream", value)
    policy(f"{unique}.policy", f"^{federated}$", {"federation-upstream": f"{unique}.upstream"}, kind)


def connect_to(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def links(broker, vhost: str = "/") -> list[dict]:
    reply = management.request(broker, "GET", f"/api/federation-links/{management.quote(vhost)}")
    assert reply.status == 200, reply
    return reply.body


def running_link(broker, federated: str) -> dict:
    """The link of the federated exchange or queue, once it runs."""
    return wait_for(lambda: next((link for link in links(broker) if federated in (link.get("exchange"),
                                                                                    link.get("queue"))), None),
                    LINK_TIMEOUT, f"the link of {federated} running",
                    until=lambda link: link is not None and link["status"] == "running")


def upstream_bindings(broker, exchange: str, vhost: str = "/") -> list[dict]:
    reply = management.request(broker, "GET", f"/api/exchanges/{management.quote(vhost)}/"
                                               f"{management.quote(exchange)}/bindings/source")
    assert reply.status == 200, reply
    return reply.body


def mirrored_keys(broker, exchange: str, vhost: str = "/") -> list[str]:
    """The routing keys a link has bound from the upstream exchange to its internal exchange."""
    return sorted(binding["routing_key"] for binding in upstream_bindings(broker, exchange, vhost)
                  if binding["destination"].startswith("federation: "))


def test_an_exchange_receives_what_its_upstream_routes_to_its_bindings_with_an_x_received_from_hop(
        broker, federation, unique):
    upstream, policy = federation
    up, down, queue = f"{unique}.up", f"{unique}.down", f"{unique}.q"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "topic")
        ch.exchange_declare(down, "topic")
        declare_queue(ch, queue)
        ch.queue_bind(queue, down, "a.*")
        assert upstream(f"{unique}.upstream", {"exchange": up}).status == 201
        assert policy(f"{unique}.policy", f"^{down}$", {"federation-upstream": f"{unique}.upstream"},
                      "exchanges").status == 201
        running_link(broker, down)
        wait_for(lambda: mirrored_keys(broker, up), LINK_TIMEOUT, "the binding mirrored", until=lambda keys:
                 keys == ["a.*"])
        properties = pika.BasicProperties(delivery_mode=2, message_id="m-1", headers={"h": 1})
        ch.basic_publish(up, "b.c", b"not bound downstream")
        ch.basic_publish(up, "a.b", b"bound", properties)
        wait_for(lambda: message_count(ch, queue), LINK_TIMEOUT, "the message federated", until=lambda n: n >= 1)
        method, got, body = ch.basic_get(queue, auto_ack=True)
    assert body == b"bound" and (method.exchange, method.routing_key) == (down, "a.b")
    assert (got.delivery_mode, got.message_id, got.headers["h"]) == (2, "m-1", 1)
    [hop] = got.headers["x-received-from"]
    assert {key: hop[key] for key in ("uri", "exchange", "redelivered", "vhost")} == {
        "uri": f"amqp://{broker.host}:{broker.port}/%2F", "exchange": down, "redelivered": False, "vhost": "/"}
    # (RabbitMQ names the federated exchange there, not the upstream's)


def test_bindings_made_and_removed_downstream_are_mirrored_upstream(broker, federation, unique):
    up, down, first, second = f"{unique}.up", f"{unique}.down", f"{unique}.first", f"{unique}.second"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "direct")
        ch.exchange_declare(down, "direct")
        declare_queue(ch, first)
        declare_queue(ch, second)
        federate(federation, unique, down, {"exchange": up}, "exchanges")
        running_link(broker, down)
        ch.queue_bind(first, down, "k1")
        ch.queue_bind(second, down, "k1")  # (one binding upstream for both)
        ch.queue_bind(second, down, "k2")
        wait_for(lambda: mirrored_keys(broker, up), LINK_TIMEOUT, "both keys mirrored",
                 until=lambda keys: keys == ["k1", "k2"])
        ch.queue_unbind(second, down, "k1")
        ch.queue_unbind(second, down, "k2")
        wait_for(lambda: mirrored_keys(broker, up), LINK_TIMEOUT, "k2 unbound upstream, k1 kept",
                 until=lambda keys: keys == ["k1"])
        ch.basic_publish(up, "k2", b"no longer bound")
        ch.basic_publish(up, "k1", b"still bound")
        wait_for(lambda: message_count(ch, first), LINK_TIMEOUT, "k1 federated", until=lambda n: n == 1)
        assert get_all(ch, first) == [b"still bound"] and get_all(ch, second) == []


def test_max_hops_bounds_how_far_a_message_travels_along_a_chain(broker, federation, vhosts, unique):
    """Exchange x of vhost a -> b -> c, each federated from the one before: with max-hops 1 a message published in a
    reaches b but not c; with max-hops 2 it reaches c too (c's queue shows that once a marker published in b later
    has come)."""
    upstream, policy = federation
    (a, a_url), (b, b_url), (c, _) = vhosts("a"), vhosts("b"), vhosts("c")
    channels = {}
    with connect_to(a_url) as conn_a, connect_to(b_url) as conn_b, connect_to(broker.url.rsplit("/", 1)[0] + "/" + c) \
            as conn_c:
        for vhost, conn in ((a, conn_a), (b, conn_b), (c, conn_c)):
            channels[vhost] = ch = conn.channel()
            ch.exchange_declare("x", "fanout")
            declare_queue(ch, "q")
            ch.queue_bind("q", "x")
        for hops in (1, 2):
            upstream("from-a", {"uri": a_url, "max-hops": hops}, vhost=b)
            upstream("from-b", {"uri": b_url, "max-hops": hops}, vhost=c)
            policy("federated", "^x$", {"federation-upstream": "from-a"}, "exchanges", vhost=b)
            policy("federated", "^x$", {"federation-upstream": "from-b"}, "exchanges", vhost=c)
            # (with max-hops 2, the binding mirrored from c to b is mirrored on to a: a binding goes as far back as
            # messages come)
            wait_for(lambda: (mirrored_keys(broker, "x", a), mirrored_keys(broker, "x", b)), LINK_TIMEOUT,
                     "the bindings mirrored", until=lambda keys: keys == (["q"] * hops, ["q"]))
            wait_for(lambda: [link["status"] for vhost in (b, c) for link in links(broker, vhost)], LINK_TIMEOUT,
                     "both links running", until=lambda states: states == ["running", "running"])
            channels[a].basic_publish("x", "", f"from a, max-hops {hops}".encode())
            wait_for(lambda: message_count(channels[b], "q"), LINK_TIMEOUT, "a's message in b", until=lambda n: n == 1)
            channels[b].basic_publish("x", "", b"marker")  # (c gets it after a's message, if a's message comes)
            wait_for(lambda: message_count(channels[c], "q"), LINK_TIMEOUT, "the marker in c",
                     until=lambda n: n == hops)
            assert get_all(channels[b], "q") == [f"from a, max-hops {hops}".encode(), b"marker"]
            assert get_all(channels[c], "q") == ([b"marker"] if hops == 1 else [b"from a, max-hops 2", b"marker"])


def test_two_exchanges_federated_from_each_other_pass_a_message_once(broker, federation, vhosts):
    """Exchange x of vhosts left and right, each federated from the other with max-hops 5: a message comes back to
    the vhost it was published in no more (its x-received-from names that vhost)."""
    upstream, policy = federation
    (left, left_url), (right, right_url) = vhosts("left"), vhosts("right")
    with connect_to(left_url) as conn_left, connect_to(right_url) as conn_right:
        channels = {left: conn_left.channel(), right: conn_right.channel()}
        for ch in channels.values():
            ch.exchange_declare("x", "fanout")
            declare_queue(ch, "q")
            ch.queue_bind("q", "x")
        upstream("other", {"uri": right_url, "max-hops": 5}, vhost=left)
        upstream("other", {"uri": left_url, "max-hops": 5}, vhost=right)
        policy("federated", "^x$", {"federation-upstream": "other"}, "exchanges", vhost=left)
        policy("federated", "^x$", {"federation-upstream": "other"}, "exchanges", vhost=right)
        wait_for(lambda: (mirrored_keys(broker, "x", left), mirrored_keys(broker, "x", right)), LINK_TIMEOUT,
                 "both bindings mirrored", until=lambda keys: keys == (["q"], ["q"]))
        channels[left].basic_publish("x", "", b"first")
        channels[left].basic_publish("x", "", b"second")
        wait_for(lambda: message_count(channels[right], "q"), LINK_TIMEOUT, "both in right", until=lambda n: n == 2)
        channels[right].basic_publish("x", "", b"marker")  # (left gets it after anything a cycle would send back)
        wait_for(lambda: message_count(channels[left], "q"), LINK_TIMEOUT, "the marker in left",
                 until=lambda n: n >= 3)
        assert get_all(channels[left], "q") == [b"first", b"second", b"marker"]
        assert get_all(channels[right], "q") == [b"first", b"second", b"marker"]


def test_a_federated_queue_takes_messages_only_while_a_consumer_waits(broker, federation, unique):
    up, down = f"{unique}.up", f"{unique}.down"
    with connect(broker) as conn:
        ch = conn.channel()
        declare_queue(ch, up, durable=True)
        declare_queue(ch, down, durable=True)
        federate(federation, unique, down, {"queue": up}, "queues")
        link = running_link(broker, down)
        assert (link["type"], link["upstream_queue"], link["consumer_tag"]) == (
            "queue", up, f"federation-link-{unique}.upstream")
        for number in range(20):
            ch.basic_publish("", up, b"%d" % number, pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=5)
        received: list[bytes] = []
        tag = ch.basic_consume(down, lambda channel, method, _, body: (
            received.append(body), channel.basic_ack(method.delivery_tag)))
        conn.process_data_events(0)
        wait_for(lambda: (conn.process_data_events(0.01), len(received))[1], LINK_TIMEOUT, "20 messages federated",
                 until=lambda n: n == 20)
        ch.basic_cancel(tag)
        assert received == [b"%d" % number for number in range(20)]
        wait_for(lambda: [consumer for consumer in management.request(broker, "GET", "/api/consumers/%2F").body
                          if consumer["queue"]["name"] == up], LINK_TIMEOUT, "the link's consumer upstream cancelled",
                 until=lambda consumers: consumers == [])
        ch.basic_publish("", up, b"while no consumer waits", pika.BasicProperties(delivery_mode=2))
        method, got, body = ch.basic_get(up, auto_ack=True)  # (still upstream: nothing downstream wanted it)
        assert body == b"while no consumer waits"
        assert message_count(ch, down) == 0


def test_a_federated_queue_marks_where_a_message_was_published(broker, federation, unique):
    up, down, exchange = f"{unique}.up", f"{unique}.down", f"{unique}.x"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "direct")
        declare_queue(ch, up)
        declare_queue(ch, down)
        ch.queue_bind(up, exchange, "key")
        federate(federation, unique, down, {"queue": up}, "queues")
        running_link(broker, down)
        ch.basic_publish(exchange, "key", b"routed", pika.BasicProperties(headers={"CC": ["other"]}))
        inbox: list = []
        ch.basic_consume(down, lambda channel, method, got, body: inbox.append((method, got, body)), auto_ack=True)
        wait_for(lambda: (conn.process_data_events(0.01), len(inbox))[1], LINK_TIMEOUT, "the message federated")
    method, got, body = inbox[0]
    assert (method.exchange, method.routing_key, body) == ("", down, b"routed")
    headers = got.headers
    assert (headers["x-original-exchange"], headers["x-original-routing-key"], headers["x-original-cc"]) == (
        exchange, "key", ["other"])
    assert "CC" not in headers
    [hop] = headers["x-received-from"]
    assert (hop["queue"], hop["visit-count"], hop["redelivered"]) == (down, 1, False)  # (the federated queue)


def test_an_upstream_that_cannot_be_reached_shows_the_link_in_error_saying_why(broker, federation, unique):
    down = f"{unique}.down"
    with connect(broker) as conn:
        conn.channel().exchange_declare(down, "fanout")
    wrong = broker.url.replace("guest:guest", "guest:wrong")
    federate(federation, unique, down, {"uri": wrong, "reconnect-delay": 1}, "exchanges")
    link = wait_for(lambda: next((link for link in links(broker) if link.get("exchange") == down), None),
                    LINK_TIMEOUT, "the link failing", until=lambda link: link is not None and link["status"] == "error")
    assert "ACCESS_REFUSED" in link["error"] or "403" in link["error"], link
    assert "wrong" not in str(link)  # (no credentials shown)


def test_the_status_shows_a_running_link_in_rabbitmqs_keys_and_it_restarts_on_request(broker, federation, unique):
    up, down = f"{unique}.up", f"{unique}.down"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(down, "fanout")
    federate(federation, unique, down, {"exchange": up}, "exchanges")
    link = running_link(broker, down)
    assert {key: link[key] for key in ("exchange", "upstream_exchange", "type", "vhost", "upstream", "status",
                                       "uri")} == {
        "exchange": down, "upstream_exchange": up, "type": "exchange", "vhost": "/",
        "upstream": f"{unique}.upstream", "status": "running", "uri": f"amqp://{broker.host}:{broker.port}/%2F"}
    assert {"node", "id", "local_connection", "timestamp"} <= set(link)
    everywhere = management.request(broker, "GET", "/api/federation-links")
    assert everywhere.status == 200 and any(entry["id"] == link["id"] for entry in everywhere.body)
    restart = management.request(
        broker, "DELETE", f"/api/federation-links/vhost/%2F/{link['id']}/{management.quote(link['node'])}/restart")
    assert restart.status == 204, restart
    assert running_link(broker, down)["id"] == link["id"]


def test_a_link_removed_with_its_policy_deletes_what_it_declared_upstream(broker, federation, unique):
    up, down = f"{unique}.up", f"{unique}.down"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(down, "fanout")
    federate(federation, unique, down, {"exchange": up}, "exchanges")
    running_link(broker, down)

    def declared() -> list[str]:
        names = [item["name"] for kind in ("queues", "exchanges")
                 for item in management.request(broker, "GET", f"/api/{kind}/%2F").body]
        return [name for name in names if name.startswith(f"federation: {up} -> ")]

    assert len(declared()) == 2  # (its queue and its internal exchange)
    assert management.request(broker, "DELETE", f"/api/policies/%2F/{unique}.policy").status == 204
    wait_for(declared, LINK_TIMEOUT, "the upstream queue and exchange deleted", until=lambda names: names == [])
    assert links(broker) == [] or all(link.get("exchange") != down for link in links(broker))


def test_an_upstream_set_federates_from_each_of_its_upstreams_with_their_overrides(broker, federation, unique):
    upstream, policy = federation
    first, second, down, queue = f"{unique}.first", f"{unique}.second", f"{unique}.down", f"{unique}.q"
    with connect(broker) as conn:
        ch = conn.channel()
        for name in (first, second, down):
            ch.exchange_declare(name, "fanout")
        declare_queue(ch, queue)
        ch.queue_bind(queue, down)
        upstream(f"{unique}.upstream", {"exchange": "unused"})
        set_path = f"/api/parameters/federation-upstream-set/%2F/{unique}.set"
        assert management.request(broker, "PUT", set_path, {"value": [
            {"upstream": f"{unique}.upstream", "exchange": first},
            {"upstream": f"{unique}.upstream", "exchange": second},
            {"upstream": f"{unique}.missing"}]}).status == 201
        try:
            policy(f"{unique}.policy", f"^{down}$", {"federation-upstream-set": f"{unique}.set"}, "exchanges")
            wait_for(lambda: sorted(link["upstream_exchange"] for link in links(broker)
                                    if link.get("exchange") == down and link["status"] == "running"),
                     LINK_TIMEOUT, "a link per upstream of the set", until=lambda names: names == [first, second])
            ch.basic_publish(first, "", b"from first")
            ch.basic_publish(second, "", b"from second")
            wait_for(lambda: message_count(ch, queue), LINK_TIMEOUT, "both federated", until=lambda n: n == 2)
            assert sorted(get_all(ch, queue)) == [b"from first", b"from second"]
        finally:
            management.request(broker, "DELETE", f"/api/policies/%2F/{unique}.policy")
            management.request(broker, "DELETE", set_path)


def test_definitions_rabbitmq_refuses_are_refused_with_its_reasons(broker, federation, unique):
    _, policy = federation
    path = f"/api/parameters/federation-upstream/%2F/{unique}.upstream"
    reply = management.request(broker, "PUT", path, {"value": {"ack-mode": "sometimes", "max-hops": "two"}})
    assert reply.status == 400
    reason = reply.body["reason"]
    assert reason.startswith("Validation failed\n\n") and "Key \"uri\" not found in " in reason, reason
    assert "max-hops should be a number, actually was &lt;&lt;\"two\"&gt;&gt;" in reason, reason
    assert "ack-mode should be one of" in reason, reason
    reply = policy(f"{unique}.policy", "^x$", {"federation-upstream": "a", "federation-upstream-set": "b"})
    assert reply.status == 400
    assert "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together" \
        in reply.body["reason"], reply
    reply = policy(f"{unique}.policy", "^x$", {"federation-upstream": 5})
    assert reply.status == 400 and "5 is not a valid federation upstream name" in reply.body["reason"], reply


def test_a_definitions_import_with_upstreams_and_their_policy_starts_the_link_and_the_export_keeps_them(
        broker, unique):
    up, down = f"{unique}.up", f"{unique}.down"
    document = {
        "parameters": [
            {"vhost": "/", "component": "federation-upstream", "name": f"{unique}.upstream",
             "value": {"uri": broker.url, "exchange": up, "ack-mode": "on-confirm"}},
            {"vhost": "/", "component": "federation-upstream-set", "name": f"{unique}.set",
             "value": [{"upstream": f"{unique}.upstream"}]}],
        "policies": [{"vhost": "/", "name": f"{unique}.policy", "pattern": f"^{down}$", "apply-to": "exchanges",
                      "definition": {"federation-upstream-set": f"{unique}.set"}, "priority": 0}],
        "exchanges": [{"vhost": "/", "name": name, "type": "fanout", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}} for name in (up, down)]}
    try:
        assert management.request(broker, "POST", "/api/definitions", document).status in (200, 201, 204)
        assert running_link(broker, down)["upstream_exchange"] == up
        exported = management.request(broker, "GET", "/api/definitions").body
        assert {(parameter["component"], parameter["name"]) for parameter in exported["parameters"]} >= {
            ("federation-upstream", f"{unique}.upstream"), ("federation-upstream-set", f"{unique}.set")}
    finally:
        for path in (f"/api/policies/%2F/{unique}.policy", f"/api/parameters/federation-upstream-set/%2F/{unique}.set",
                     f"/api/parameters/federation-upstream/%2F/{unique}.upstream", f"/api/exchanges/%2F/{up}",
                     f"/api/exchanges/%2F/{down}"):
            management.request(broker, "DELETE", path)


def test_a_downstream_killed_mid_way_loses_nothing_its_upstream_held(own_broker, tmp_path):
    """Between two brokers, on-confirm: the downstream killed -9 while 3,000 persistent messages come through its
    exchange link, then started again: every message arrives (some twice: those it had made safe but not acked
    upstream yet), and the link's queue upstream ends empty."""
    upstream_broker = own_broker(data_dir=tmp_path / "upstream")
    downstream = own_broker(data_dir=tmp_path / "downstream")
    sent = [b"%d" % number for number in range(3000)]
    with connect(upstream_broker) as conn:
        conn.channel().exchange_declare("x", "fanout", durable=True)
    with connect(downstream) as conn:
        ch = conn.channel()
        ch.exchange_declare("x", "fanout", durable=True)
        declare_queue(ch, "q", durable=True)
        ch.queue_bind("q", "x")
    for path, body in (("/api/parameters/federation-upstream/%2F/up", {"value": {
            "uri": upstream_broker.url, "prefetch-count": 100, "reconnect-delay": 1}}),
            ("/api/policies/%2F/federated", {"pattern": "^x$", "apply-to": "exchanges", "definition": {
                "federation-upstream": "up"}})):
        assert management.request(downstream, "PUT", path, body).status == 201
    link_queue = f"/api/queues/%2F/{management.quote('federation: x -> warren')}"
    wait_for(lambda: management.request(upstream_broker, "GET", link_queue).status, LINK_TIMEOUT,
             "the link's queue upstream", until=lambda status: status == 200)
    wait_for(lambda: mirrored_keys(upstream_broker, "x"), LINK_TIMEOUT, "the binding mirrored")

    def publish() -> None:
        with connect(upstream_broker) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for body in sent:
                ch.basic_publish("x", "", body, pika.BasicProperties(delivery_mode=2))

    publisher = threading.Thread(target=publish)
    publisher.start()
    with connect(downstream) as conn:
        ch = conn.channel()
        moved = wait_for(lambda: message_count(ch, "q"), LINK_TIMEOUT, "some messages federated", step=0.001,
                         until=lambda n: n >= 300)
    downstream.kill()
    publisher.join()
    assert moved < len(sent)  # (the kill came mid-way)
    downstream.start()
    wait_for(lambda: management.request(upstream_broker, "GET", link_queue).body["messages"], 60,
             "the link's queue upstream emptied", until=lambda n: n == 0)
    with connect(downstream) as conn:
        received = get_all(conn.channel(), "q")
    assert set(received) == set(sent)


def test_the_queue_an_exchange_link_declares_upstream_has_the_upstreams_expires_and_message_ttl(
        broker, federation, unique):
    up, down = f"{unique}.up", f"{unique}.down"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(down, "fanout")
    federate(federation, unique, down, {"exchange": up, "expires": 3600000, "message-ttl": 60000}, "exchanges")
    running_link(broker, down)
    [queue] = [queue for queue in management.request(broker, "GET", "/api/queues/%2F").body
               if queue["name"].startswith(f"federation: {up} -> ")]
    assert queue["durable"] and queue["arguments"] == {
        "x-expires": 3600000, "x-message-ttl": 60000, "x-internal-purpose": "federation"}


def test_a_link_whose_internal_exchange_is_deleted_upstream_starts_again(own_broker, tmp_path):
    """RabbitMQ's check: every [federation] internal_exchange_check_interval, a running exchange link looks that
    its internal exchange is still there upstream; one deleted there starts the link again, which declares it anew
    (a link must not show running while nothing can reach its queue)."""
    config = tmp_path / "warren.toml"
    config.write_text("[federation]\ninternal_exchange_check_interval = 200\n")
    broker = own_broker("--config", str(config))
    with connect(broker) as conn:
        ch = conn.channel()
        for name in ("up", "down"):
            ch.exchange_declare(name, "fanout")
        declare_queue(ch, "q")
        ch.queue_bind("q", "down")
        for path, body in (("/api/parameters/federation-upstream/%2F/self", {"value": {
                "uri": broker.url, "exchange": "up", "reconnect-delay": 1}}),
                           ("/api/policies/%2F/federated", {"pattern": "^down$", "apply-to": "exchanges",
                                                            "definition": {"federation-upstream": "self"}})):
            assert management.request(broker, "PUT", path, body).status == 201
        first = running_link(broker, "down")
        [internal] = [binding["destination"] for binding in upstream_bindings(broker, "up")]
        ch.exchange_delete(internal)
        wait_for(broker.log, LINK_TIMEOUT, "the check seeing it", until=lambda log: "is gone upstream" in log)
        wait_for(lambda: [binding["destination"] for binding in upstream_bindings(broker, "up")], LINK_TIMEOUT,
                 "the link set up again", until=lambda names: len(names) == 1)
        assert running_link(broker, "down")["id"] == first["id"]
        ch.basic_publish("up", "", b"federated again")
        wait_for(lambda: message_count(ch, "q"), LINK_TIMEOUT, "the message federated")


@beyond_rabbitmq  # (RabbitMQ's link is nacked and requeues at once, for ever: its status shows nothing)
def test_a_message_a_full_queue_refuses_goes_back_upstream_until_the_queue_takes_it(broker, federation, unique):
    """A queue here with reject-publish turns a republished message away: the link acks nothing more, its run ends
    saying why, what it had not acked goes back upstream, and it comes again after reconnect-delay, until the queue
    has room (RabbitMQ's link gets a nack, and requeues at once)."""
    up, down, queue = f"{unique}.up", f"{unique}.down", f"{unique}.q"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(down, "fanout")
        declare_queue(ch, queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.queue_bind(queue, down)
        federate(federation, unique, down, {"exchange": up, "reconnect-delay": 1}, "exchanges")
        running_link(broker, down)
        wait_for(lambda: mirrored_keys(broker, up), LINK_TIMEOUT, "the binding mirrored")
        ch.basic_publish(up, "", b"first")
        ch.basic_publish(up, "", b"second")
        wait_for(lambda: next(link for link in links(broker) if link.get("exchange") == down), LINK_TIMEOUT,
                 "the link saying a queue refused", until=lambda link: "refused" in link.get("error", ""))
        received: list[bytes] = []
        wait_for(lambda: received.extend(get_all(ch, queue)) or received, LINK_TIMEOUT, "both taken in turn",
                 until=lambda got: {b"first", b"second"} <= set(got))


def test_an_internal_exchange_is_not_federated(broker, federation, unique):
    upstream, policy = federation
    up, internal, plain = f"{unique}.up", f"{unique}.internal", f"{unique}.plain"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(internal, "fanout", internal=True)
        ch.exchange_declare(plain, "fanout")
    upstream(f"{unique}.upstream", {"exchange": up})
    policy(f"{unique}.policy", f"^{unique}\\.(internal|plain)$", {"federation-upstream": f"{unique}.upstream"},
           "exchanges")
    running_link(broker, plain)  # (the same policy federates the other one)
    assert [link for link in links(broker) if link.get("exchange") == internal] == []


def test_an_upstream_changed_to_other_queue_arguments_declares_its_queue_anew(broker, federation, unique):
    """The queue a link declares upstream holds the upstream's expires and message-ttl: changing them deletes the
    old queue before the new link declares its own (the declare would otherwise be refused as inequivalent)."""
    upstream, _ = federation
    up, down = f"{unique}.up", f"{unique}.down"
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare(up, "fanout")
        ch.exchange_declare(down, "fanout")

    def link_queue_arguments() -> list[dict]:
        return [queue["arguments"] for queue in management.request(broker, "GET", "/api/queues/%2F").body
                if queue["name"].startswith(f"federation: {up} -> ")]

    federate(federation, unique, down, {"exchange": up, "message-ttl": 60000}, "exchanges")
    running_link(broker, down)
    assert [arguments.get("x-message-ttl") for arguments in link_queue_arguments()] == [60000]
    upstream(f"{unique}.upstream", {"exchange": up, "message-ttl": 120000})
    wait_for(link_queue_arguments, LINK_TIMEOUT, "the queue declared anew",
             until=lambda found: [arguments.get("x-message-ttl") for arguments in found] == [120000])
    assert running_link(broker, down)["status"] == "running"


def test_a_policy_removed_and_set_again_at_once_leaves_a_link_that_works_from_the_start(own_broker):
    """The removed link's clean-up upstream (its queue and exchanges deleted) runs before the new link sets up the
    same names: the new one neither loses its consumer to it nor fails."""
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("up", "fanout")
        ch.exchange_declare("down", "fanout")
        declare_queue(ch, "q")
        ch.queue_bind("q", "down")
        for path, body in (("/api/parameters/federation-upstream/%2F/self", {"value": {"uri": broker.url,
                                                                                      "exchange": "up"}}),
                           ("/api/policies/%2F/federated", {"pattern": "^down$", "apply-to": "exchanges",
                                                            "definition": {"federation-upstream": "self"}})):
            assert management.request(broker, "PUT", path, body).status == 201
        for _ in range(5):
            running_link(broker, "down")
            assert management.request(broker, "DELETE", "/api/policies/%2F/federated").status == 204
            assert management.request(broker, "PUT", "/api/policies/%2F/federated", {
                "pattern": "^down$", "apply-to": "exchanges", "definition": {"federation-upstream": "self"}}
                                      ).status == 201
        running_link(broker, "down")
        wait_for(lambda: mirrored_keys(broker, "up"), LINK_TIMEOUT, "the binding mirrored", until=lambda keys: keys == [
            "q"])
        ch.basic_publish("up", "", b"federated")
        wait_for(lambda: message_count(ch, "q"), LINK_TIMEOUT, "the message federated")
    assert "federation link of exchange 'down' in vhost '/' (upstream 'self'):" not in broker.log()  # (no failure)
