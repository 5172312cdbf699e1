"""Federation both ways between Warren and the reference RabbitMQ 3.10 with its federation plugin, exchanges and
queues. As upstream, Warren takes what RabbitMQ's links declare (the x-federation-upstream exchange type, which
forwards what has crossed fewer than max-hops links; a consumer at priority -1); as downstream, Warren's links
declare the same on RabbitMQ. A link comes back after either side restarts, and what was published meanwhile
arrives."""

from __future__ import annotations

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import connect, declare_queue, get_all, message_count
from tests.integration.reference import reference_rabbitmq
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REFERENCE_PORT = 17400  # below the ephemeral range, as the other reference tests' (17360, 17380)
PLAIN_PORT = 17420  # a second reference, without the federation plugin
LINKED_WITHIN = 60.0  # seconds a link may take to start (its policy is applied, then it connects)


@pytest.fixture(scope="module")
def rabbitmq():
    with reference_rabbitmq(REFERENCE_PORT, "--federation") as node:
        management.wait_for_api(node, timeout=60)
        yield node


def test_rabbitmq_federates_an_exchange_of_warren_and_max_hops_holds(rabbitmq, own_broker):
    warren = own_broker()
    with connect(warren) as conn:
        conn.channel().exchange_declare("fed.x", "fanout", durable=True)
    for path, body in (("/api/exchanges/%2F/fed.x", {"type": "fanout", "durable": True}),
                       ("/api/queues/%2F/fed.q", {"durable": True}),
                       ("/api/parameters/federation-upstream/%2F/warren", {"value": {"uri": warren.url,
                                                                                     "max-hops": 1}}),
                       ("/api/policies/%2F/fed", {"pattern": r"^fed\.x$", "definition": {
                           "federation-upstream": "warren"}, "apply-to": "exchanges"})):
        assert management.request(rabbitmq, "PUT", path, body).status in (201, 204), path
    assert management.request(rabbitmq, "POST", "/api/bindings/%2F/e/fed.x/q/fed.q", {"routing_key": ""}
                              ).status == 201
    # (the link declares its exchange on Warren, then binds fed.x to it: a message published before is dropped)
    management.wait_for(warren, "/api/exchanges/%2F/fed.x/bindings/source", lambda bindings: any(
        binding["destination"].startswith("federation: fed.x -> ") for binding in bindings), LINKED_WITHIN)
    hop = {"uri": "amqp://elsewhere", "exchange": "fed.x", "redelivered": False, "cluster-name": "other",
           "vhost": "/"}
    with connect(warren) as conn:
        channel = conn.channel()
        channel.basic_publish("fed.x", "", b"first")
        channel.basic_publish("fed.x", "", b"one hop already", pika.BasicProperties(headers={
            "x-received-from": [hop]}))  # (max-hops 1: it goes no further)
        channel.basic_publish("fed.x", "", b"second")
    with connect(rabbitmq) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, "fed.q"), LINKED_WITHIN, "two messages federated",
                 until=lambda count: count >= 2)
        bodies = []
        while (got := channel.basic_get("fed.q", auto_ack=True))[0] is not None:
            bodies.append(got[2])
    assert bodies == [b"first", b"second"]


def put_all(broker, requests: list[tuple[str, dict]]) -> None:
    for path, body in requests:
        reply = management.request(broker, "PUT", path, body)
        assert reply.status in (201, 204), (path, reply)


def consumed(conn: pika.BlockingConnection, queue: str, count: int) -> list[bytes]:
    """count messages from a consumer of queue (a federated queue takes messages while one waits)."""
    channel = conn.channel()
    received: list[bytes] = []
    channel.basic_consume(queue, lambda ch, method, _, body: (received.append(body), ch.basic_ack(
        method.delivery_tag)))
    wait_for(lambda: (conn.process_data_events(0.01), len(received))[1], LINKED_WITHIN, f"{count} consumed",
             until=lambda n: n >= count)
    channel.close()
    return received


def test_rabbitmq_federates_a_queue_of_warren(rabbitmq, own_broker):
    warren = own_broker()
    with connect(warren) as conn:
        declare_queue(conn.channel(), "fed.wq", durable=True)
    put_all(rabbitmq, [("/api/queues/%2F/fed.wq", {"durable": True}),
                       ("/api/parameters/federation-upstream/%2F/warren-q", {"value": {"uri": warren.url}}),
                       ("/api/policies/%2F/fed-q", {"pattern": r"^fed\.wq$", "apply-to": "queues", "definition": {
                           "federation-upstream": "warren-q"}})])
    with connect(warren) as conn:
        channel = conn.channel()
        for number in range(10):
            channel.basic_publish("", "fed.wq", b"%d" % number, pika.BasicProperties(delivery_mode=2))
    with connect(rabbitmq) as conn:
        assert consumed(conn, "fed.wq", 10) == [b"%d" % number for number in range(10)]
    with connect(warren) as conn:
        assert message_count(conn.channel(), "fed.wq") == 0


def test_warren_federates_an_exchange_of_rabbitmq_with_what_rabbitmqs_links_declare(rabbitmq, own_broker):
    warren = own_broker()
    with connect(rabbitmq) as conn:
        conn.channel().exchange_declare("fed.rx", "topic", durable=True)
    with connect(warren) as conn:
        channel = conn.channel()
        channel.exchange_declare("fed.rx", "topic", durable=True)
        declare_queue(channel, "fed.rx.q", durable=True)
        channel.queue_bind("fed.rx.q", "fed.rx", "k.#")
    put_all(warren, [("/api/parameters/federation-upstream/%2F/rabbitmq", {"value": {"uri": rabbitmq.url}}),
                     ("/api/policies/%2F/fed", {"pattern": r"^fed\.rx$", "apply-to": "exchanges", "definition": {
                         "federation-upstream": "rabbitmq"}})])
    queue = "federation: fed.rx -> warren"
    bindings = management.wait_for(rabbitmq, "/api/exchanges/%2F/fed.rx/bindings/source", lambda found: any(
        binding["routing_key"] == "k.#" for binding in found), LINKED_WITHIN)
    [binding] = bindings
    assert binding["destination"] == f"{queue} A" and binding["destination_type"] == "exchange"
    internal = management.request(rabbitmq, "GET", f"/api/exchanges/%2F/{management.quote(queue + ' A')}").body
    assert (internal["type"], internal["internal"], internal["arguments"]["x-max-hops"]) == (
        "x-federation-upstream", True, 1)
    assert management.request(rabbitmq, "GET", f"/api/queues/%2F/{management.quote(queue)}").status == 200
    hop = {"uri": "amqp://elsewhere", "exchange": "fed.rx", "redelivered": False, "cluster-name": "other",
           "vhost": "/"}
    with connect(rabbitmq) as conn:
        channel = conn.channel()
        channel.basic_publish("fed.rx", "other", b"not bound in Warren")
        channel.basic_publish("fed.rx", "k.0", b"one hop already", pika.BasicProperties(headers={
            "x-received-from": [hop]}))  # (max-hops 1: RabbitMQ's upstream exchange drops it)
        channel.basic_publish("fed.rx", "k.1", b"bound", pika.BasicProperties(delivery_mode=2))
    with connect(warren) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, "fed.rx.q"), LINKED_WITHIN, "the message federated")
        method, properties, body = channel.basic_get("fed.rx.q", auto_ack=True)
    assert (body, method.routing_key) == (b"bound", "k.1")
    [hop] = properties.headers["x-received-from"]
    cluster_name = management.request(rabbitmq, "GET", "/api/overview").body["cluster_name"]
    assert (hop["cluster-name"], hop["exchange"], hop["vhost"]) == (cluster_name, "fed.rx", "/")


def test_warren_federates_a_queue_of_rabbitmq(rabbitmq, own_broker):
    warren = own_broker()
    with connect(rabbitmq) as conn:
        channel = conn.channel()
        declare_queue(channel, "fed.rq", durable=True)
        for number in range(10):
            channel.basic_publish("", "fed.rq", b"%d" % number, pika.BasicProperties(delivery_mode=2))
    with connect(warren) as conn:
        declare_queue(conn.channel(), "fed.rq", durable=True)
    put_all(warren, [("/api/parameters/federation-upstream/%2F/rabbitmq-q", {"value": {"uri": rabbitmq.url}}),
                     ("/api/policies/%2F/fed-q", {"pattern": r"^fed\.rq$", "apply-to": "queues", "definition": {
                         "federation-upstream": "rabbitmq-q"}})])
    with connect(warren) as conn:
        assert consumed(conn, "fed.rq", 10) == [b"%d" % number for number in range(10)]
    with connect(rabbitmq) as conn:
        assert message_count(conn.channel(), "fed.rq") == 0


def test_a_link_comes_back_after_either_side_restarts_and_what_was_published_meanwhile_arrives(
        rabbitmq, own_broker, tmp_path):
    """Warren federates an exchange of RabbitMQ. Warren stops; what is published to RabbitMQ meanwhile waits in the
    link's queue there and arrives once Warren is back (a message on its way as Warren stopped may come twice: a
    link acks its upstream only once the message is safe, and never the other way round). Then RabbitMQ restarts,
    and the link connects again."""
    warren = own_broker(data_dir=tmp_path / "warren")
    with connect(rabbitmq) as conn:
        conn.channel().exchange_declare("fed.restarts", "fanout", durable=True)
    with connect(warren) as conn:
        channel = conn.channel()
        channel.exchange_declare("fed.restarts", "fanout", durable=True)
        declare_queue(channel, "fed.restarts.q", durable=True)
        channel.queue_bind("fed.restarts.q", "fed.restarts")
    put_all(warren, [("/api/parameters/federation-upstream/%2F/restarting", {"value": {
        "uri": rabbitmq.url, "reconnect-delay": 1}}), ("/api/policies/%2F/fed-restarts", {
            "pattern": r"^fed\.restarts$", "apply-to": "exchanges", "definition": {
                "federation-upstream": "restarting"}})])

    def publish_to_rabbitmq(body: bytes) -> None:
        with connect(rabbitmq) as conn:
            channel = conn.channel()
            channel.confirm_delivery()
            channel.basic_publish("fed.restarts", "", body, pika.BasicProperties(delivery_mode=2))

    def link_running() -> None:
        management.wait_for(warren, "/api/federation-links/%2F", lambda found: [
            link["status"] for link in found] == ["running"], LINKED_WITHIN)

    link_running()
    publish_to_rabbitmq(b"before")
    warren.stop()
    publish_to_rabbitmq(b"while Warren was down")
    warren.start()
    link_running()
    received: list[bytes] = []
    with connect(warren) as conn:
        channel = conn.channel()
        wait_for(lambda: received.extend(get_all(channel, "fed.restarts.q")) or received, LINKED_WITHIN,
                 "what was published meanwhile federated", until=lambda got: b"while Warren was down" in got)
    assert set(received) == {b"before", b"while Warren was down"}
    assert received.count(b"while Warren was down") == 1 and received[-1] == b"while Warren was down"
    rabbitmq.restart()
    management.wait_for_api(rabbitmq, timeout=60)
    link_running()
    publish_to_rabbitmq(b"after RabbitMQ restarted")
    with connect(warren) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, "fed.restarts.q"), LINKED_WITHIN, "federated after the restart")
        assert get_all(channel, "fed.restarts.q") == [b"after RabbitMQ restarted"]


def test_rabbitmqs_link_comes_back_after_warren_restarts(rabbitmq, own_broker, tmp_path):
    """RabbitMQ federates an exchange of Warren. Warren restarts: the link's durable queue and exchange on Warren
    come back with it, bound as before, and RabbitMQ's link connects again: what is published to Warren arrives."""
    warren = own_broker(data_dir=tmp_path / "warren")
    with connect(warren) as conn:
        conn.channel().exchange_declare("fed.wr", "fanout", durable=True)
    put_all(rabbitmq, [("/api/exchanges/%2F/fed.wr", {"type": "fanout", "durable": True}),
                       ("/api/queues/%2F/fed.wr.q", {"durable": True}),
                       ("/api/parameters/federation-upstream/%2F/warren-restarting", {"value": {
                           "uri": warren.url, "reconnect-delay": 1}}),
                       ("/api/policies/%2F/fed-wr", {"pattern": r"^fed\.wr$", "apply-to": "exchanges",
                                                     "definition": {"federation-upstream": "warren-restarting"}})])
    assert management.request(rabbitmq, "POST", "/api/bindings/%2F/e/fed.wr/q/fed.wr.q", {"routing_key": ""}
                              ).status == 201
    management.wait_for(warren, "/api/exchanges/%2F/fed.wr/bindings/source", lambda found: len(found) == 1,
                        LINKED_WITHIN)
    warren.restart()
    management.wait_for(warren, "/api/exchanges/%2F/fed.wr/bindings/source", lambda found: len(found) == 1,
                        LINKED_WITHIN)  # (the binding to the link's exchange, durable, restored)
    with connect(warren) as conn:
        conn.channel().basic_publish("fed.wr", "", b"after Warren restarted", pika.BasicProperties(delivery_mode=2))
    with connect(rabbitmq) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, "fed.wr.q"), LINKED_WITHIN, "federated after the restart")
        assert get_all(channel, "fed.wr.q") == [b"after Warren restarted"]


def test_warren_federates_an_exchange_of_a_rabbitmq_without_its_federation_plugin(own_broker):
    """An upstream without the x-federation-upstream exchange type (RabbitMQ 3.10 closes the connection that asks
    for it): the link falls back to a fanout internal exchange, as RabbitMQ's does, and checks max-hops itself."""
    with reference_rabbitmq(PLAIN_PORT) as plain:
        warren = own_broker()
        with connect(plain) as conn:
            conn.channel().exchange_declare("fed.plain", "direct", durable=True)
        with connect(warren) as conn:
            channel = conn.channel()
            channel.exchange_declare("fed.plain", "direct", durable=True)
            declare_queue(channel, "fed.plain.q", durable=True)
            channel.queue_bind("fed.plain.q", "fed.plain", "k")
        put_all(warren, [("/api/parameters/federation-upstream/%2F/plain", {"value": {"uri": plain.url}}),
                         ("/api/policies/%2F/fed-plain", {"pattern": r"^fed\.plain$", "apply-to": "exchanges",
                                                          "definition": {"federation-upstream": "plain"}})])
        management.wait_for(warren, "/api/federation-links/%2F", lambda found: [
            link["status"] for link in found] == ["running"], LINKED_WITHIN)
        internal = management.request(plain, "GET", "/api/exchanges/%2F/" + management.quote(
            "federation: fed.plain -> warren A")).body
        assert internal["type"] == "fanout"
        hop = {"uri": "amqp://elsewhere", "exchange": "fed.plain", "redelivered": False, "cluster-name": "other",
               "vhost": "/"}
        with connect(plain) as conn:
            channel = conn.channel()
            channel.basic_publish("fed.plain", "k", b"one hop already", pika.BasicProperties(headers={
                "x-received-from": [hop]}))  # (max-hops 1: the link drops it)
            channel.basic_publish("fed.plain", "k", b"federated")
        with connect(warren) as conn:
            channel = conn.channel()
            wait_for(lambda: message_count(channel, "fed.plain.q"), LINKED_WITHIN, "the message federated")
            assert get_all(channel, "fed.plain.q") == [b"federated"]
