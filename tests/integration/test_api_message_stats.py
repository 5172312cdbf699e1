"""Publishes and gets through the management API count in the message stats as RabbitMQ 3.10 counts them: its API
publishes mandatory on a channel in confirm mode (publish, confirm, and return_unroutable for a message no queue
takes), and gets with basic.get on a channel (ack_requeue_false without acks: get_no_ack; the other modes with
acks: get; get_empty when the queue runs out; redeliver for a message got before)."""

from __future__ import annotations

import time

from tests import waiting
from tests.integration.management import (
    add_vhost, delete_vhost, quote, request, set_permissions, wait_for,
)

COUNTED = ("publish", "confirm", "return_unroutable", "drop_unroutable", "get", "get_no_ack", "get_empty",
           "deliver_get", "redeliver", "ack", "deliver", "deliver_no_ack")


def node_totals_sampled_after(broker, moment_ms: int) -> dict[str, int]:
    """The overview's message totals from a sample taken after moment_ms (the sampler runs every stats interval)."""
    def sampled_after(body) -> bool:
        stats = body.get("message_stats") or {}
        times = [sample["timestamp"] for key, details in stats.items() if key.endswith("_details")
                 for sample in details.get("samples", [])]
        return bool(times) and max(times) > moment_ms

    body = wait_for(broker, "/api/overview?msg_rates_age=60&msg_rates_incr=1", sampled_after, timeout=40)
    return {key: body["message_stats"].get(key, 0) for key in COUNTED}


def publish(broker, routing_key: str) -> bool:
    reply = request(broker, "POST", "/api/exchanges/%2F/amq.default/publish", {
        "properties": {}, "routing_key": routing_key, "payload": "m", "payload_encoding": "string"})
    assert reply.status == 200, reply
    return reply.body["routed"]


def get(broker, queue: str, count: int, ackmode: str) -> list:
    reply = request(broker, "POST", f"/api/queues/%2F/{quote(queue)}/get",
                    {"count": count, "ackmode": ackmode, "encoding": "auto"})
    assert reply.status == 200, reply
    return reply.body


def test_api_publishes_and_gets_count_on_the_queue_and_the_node(broker, unique):
    before = node_totals_sampled_after(broker, int(time.time() * 1000))
    assert request(broker, "PUT", f"/api/queues/%2F/{quote(unique)}", {}).status in (201, 204)
    assert publish(broker, unique) and publish(broker, unique)
    assert not publish(broker, f"{unique}-nowhere")
    assert len(get(broker, unique, 1, "ack_requeue_true")) == 1  # a get with acks, requeued
    got = get(broker, unique, 5, "ack_requeue_false")  # two without acks (one a redelivery), then empty
    assert [message["redelivered"] for message in got] == [True, False]
    done = int(time.time() * 1000)

    shown = wait_for(broker, f"/api/queues/%2F/{quote(unique)}",
                     lambda body: body.get("message_stats", {}).get("deliver_get") == 3, timeout=40)
    queue_stats = {key: shown["message_stats"].get(key, 0) for key in ("publish", "get", "get_no_ack", "get_empty",
                                                                        "redeliver", "ack")}
    assert queue_stats == {"publish": 2, "get": 1, "get_no_ack": 2, "get_empty": 1, "redeliver": 1, "ack": 0}

    expected = {"publish": 3, "confirm": 3, "return_unroutable": 1, "drop_unroutable": 0, "get": 1, "get_no_ack": 2,
                "get_empty": 1, "deliver_get": 3, "redeliver": 1, "ack": 0, "deliver": 0, "deliver_no_ack": 0}
    # RabbitMQ's overview takes a few seconds more than its sample times say to show its channels' stats
    def counted() -> dict[str, int]:
        after = node_totals_sampled_after(broker, done)
        return {key: after[key] - before[key] for key in COUNTED}
    waiting.wait_for(counted, 30, f"the node's totals counting {expected}", 1, until=lambda found: found == expected)
    request(broker, "DELETE", f"/api/queues/%2F/{quote(unique)}")


def test_the_aliveness_test_counts_its_publish_and_its_get(broker, unique):
    """RabbitMQ's aliveness test publishes to its queue and gets the message without an ack."""
    add_vhost(broker, unique)
    try:
        set_permissions(broker, unique, "guest")
        assert request(broker, "GET", f"/api/aliveness-test/{quote(unique)}") == (200, {"status": "ok"})
        shown = wait_for(broker, f"/api/queues/{quote(unique)}/aliveness-test",
                         lambda body: body.get("message_stats", {}).get("deliver_get") == 1, timeout=40)
        assert {key: shown["message_stats"].get(key, 0) for key in ("publish", "get_no_ack", "get")} == {
            "publish": 1, "get_no_ack": 1, "get": 0}
    finally:
        delete_vhost(broker, unique)
