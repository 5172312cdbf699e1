"""x-federation-upstream, the exchange RabbitMQ's exchange federation declares on its upstream: fanout for what has
crossed fewer than x-max-hops links and has not been through the downstream (rabbit_federation_upstream_exchange)."""

from __future__ import annotations

import pytest
from pamqp.commands import Basic

from broker.model import message as messages
from broker.model.arguments.exchange import validate_exchange_arguments
from broker.model.exchange import FederationUpstreamExchange
from broker.model.vhost import OPERATOR_OWNER, VirtualHost
from protocol.codec import encode_header_payload
from protocol.errors import AMQPError

ARGUMENTS = {"x-max-hops": 2, "x-downstream-name": "rabbit@down", "x-downstream-vhost": "/"}


def routed(headers: dict | None) -> list[str]:
    vhost = VirtualHost("/")
    exchange = vhost.declare_exchange("federation: x -> rabbit@down", FederationUpstreamExchange.kind, False, True,
                                      True, True, ARGUMENTS)
    vhost.bind(exchange, vhost.declare_queue("queue", OPERATOR_OWNER, False, True, False, False, {}), "", {})
    header = messages.Header(encode_header_payload(1, Basic.Properties(headers=headers)))
    return [queue.name for queue in exchange.route("", messages.Message(messages.Address("x", ""), header, b"m"))]


def hop(cluster: str, vhost: str = "/") -> dict:
    return {"uri": "amqp://h", "exchange": "x", "redelivered": False, "cluster-name": cluster, "vhost": vhost}


def test_it_forwards_what_has_crossed_fewer_links_than_max_hops_and_not_the_downstream():
    assert routed(None) == ["queue"]
    assert routed({"other": 1}) == ["queue"]
    assert routed({"x-received-from": [hop("a")]}) == ["queue"]
    assert routed({"x-received-from": [hop("a"), hop("b")]}) == []  # (two links crossed: max-hops 2)
    assert routed({"x-received-from": [hop("rabbit@down")]}) == []  # (been through the downstream: a cycle)
    assert routed({"x-received-from": [hop("rabbit@down", "other")]}) == ["queue"]  # (another vhost there)


@pytest.mark.parametrize("arguments, reason", [
    ({}, "Argument x-max-hops missing"), ({"x-max-hops": "1"}, "Argument x-max-hops must be of type long")])
def test_its_declare_needs_max_hops_as_rabbitmqs_does(arguments, reason):
    with pytest.raises(AMQPError) as refused:
        validate_exchange_arguments("e", "/", "x-federation-upstream", arguments)
    assert (refused.value.reply_code, refused.value.text) == (406, f"PRECONDITION_FAILED - {reason}")
