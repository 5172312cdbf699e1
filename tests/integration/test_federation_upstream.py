"""Warren as the upstream of RabbitMQ's exchange federation (the reference 3.10 with its federation plugin): the
link declares on Warren an exchange of RabbitMQ's x-federation-upstream type between the federated exchange and
its queue, which forwards what has crossed fewer than max-hops links, so that messages published to Warren's
exchange reach the queues bound to RabbitMQ's."""

from __future__ import annotations

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import connect, message_count
from tests.integration.reference import reference_rabbitmq
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REFERENCE_PORT = 17400  # below the ephemeral range, as the other reference tests' (17360, 17380)
LINKED_WITHIN = 60.0  # seconds RabbitMQ's link may take to start (its policy is applied, then it connects)


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
    management.wait_for(warren, "/api/exchanges/%2F", lambda exchanges: any(
        exchange["type"] == "x-federation-upstream" for exchange in exchanges), LINKED_WITHIN)
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
