"""The overview's listeners as RabbitMQ's lists them: the Prometheus endpoint among them (rabbitmq_prometheus
registers its listener as protocol "http/prometheus"), and so in warrenctl status."""

from __future__ import annotations

from tests.integration.management import request
from tests.integration.test_warrenctl import ok


def test_the_overview_lists_the_prometheus_listener(broker):
    reply = request(broker, "GET", "/api/overview")
    assert reply.status == 200
    listeners = {(listener["protocol"], listener["port"]) for listener in reply.body["listeners"]}
    assert ("http/prometheus", broker.prometheus_port) in listeners
    assert {"amqp", "http", "http/prometheus"} <= {protocol for protocol, _ in listeners}


def test_warrenctl_status_shows_the_prometheus_listener(broker):
    out = ok(broker, "status")
    assert f"port: {broker.prometheus_port}, protocol: http/prometheus" in out
