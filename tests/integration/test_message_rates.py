"""Message rates of the management API, as RabbitMQ's (rates_mode basic): the node's and each queue's totals with
their rate per second, sampled every collect_statistics_interval, and the samples behind a chart when asked."""

from __future__ import annotations

import time

from tests.integration.helpers import connect, declare_queue, publish
from tests.integration.management import quote, request, wait_for


def rates_broker(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[management]\ncollect_statistics_interval = 100\n")
    return own_broker("--config", str(config))


def test_the_overview_and_each_queue_report_totals_and_rates(own_broker, tmp_path, unique):
    broker = rates_broker(own_broker, tmp_path)
    assert request(broker, "GET", "/api/overview").body["rates_mode"] == "basic"
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique)
        publish(ch, queue, [b"m"] * 20)
        for _ in range(5):
            method, _, _ = ch.basic_get(queue)
            ch.basic_ack(method.delivery_tag)
        ch.basic_get(queue, auto_ack=True)
        ch.basic_consume(queue, lambda *args: None, auto_ack=True)
        overview = wait_for(broker, "/api/overview", lambda body: body["message_stats"].get("deliver_get") == 20)
        stats = overview["message_stats"]
        assert (stats["publish"], stats["ack"], stats["get"], stats["get_no_ack"], stats["deliver_no_ack"]) == (
            20, 5, 5, 1, 14)
        assert stats["publish_details"]["rate"] >= 0 and set(stats["ack_details"]) == {"rate"}
        path = f"/api/queues/%2F/{quote(queue)}"
        shown = wait_for(broker, path, lambda body: body.get("message_stats", {}).get("deliver_get") == 20)
        assert (shown["message_stats"]["publish"], shown["message_stats"]["ack"]) == (20, 5)
        # steady publishing shows as a rate (a rate spans one interval: a single burst would be gone in 100 ms)
        published, deadline = 20, time.monotonic() + 30
        while request(broker, "GET", path).body["message_stats"]["publish_details"]["rate"] == 0:
            assert time.monotonic() < deadline, "publishing never showed as a rate"
            publish(ch, queue, [b"n"] * 20)
            published += 20
        charted = wait_for(broker, path + "?msg_rates_age=60&msg_rates_incr=1",  # a sample a second
                           lambda body: len(body["message_stats"]["publish_details"]["samples"]) >= 2
                           and body["message_stats"]["publish"] == published)["message_stats"]
        samples = charted["publish_details"]["samples"]
        assert samples[0]["sample"] == published and samples[0]["timestamp"] - samples[1]["timestamp"] >= 900
        assert samples == sorted(samples, key=lambda sample: -sample["timestamp"])
        assert "avg_rate" in charted["publish_details"]


def test_channels_report_publish_deliver_and_ack_rates_and_connections_their_bytes(own_broker, tmp_path, unique):
    broker = rates_broker(own_broker, tmp_path)
    with connect(broker) as conn:
        ch = conn.channel()
        queue = declare_queue(ch, unique)
        publish(ch, queue, [b"m" * 100] * 10)
        for _ in range(4):
            method, _, _ = ch.basic_get(queue)
            ch.basic_ack(method.delivery_tag)
        [channel] = wait_for(broker, "/api/channels",
                             lambda body: len(body) == 1 and body[0].get("message_stats", {}).get("ack") == 4)
        stats = channel["message_stats"]
        assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (10, 4, 4)
        assert set(stats["publish_details"]) == {"rate"}
        [connection] = request(broker, "GET", "/api/connections").body
        assert connection["recv_oct"] > 10 * 100 and connection["send_oct"] > 4 * 100
        assert set(connection["recv_oct_details"]) == {"rate"}


def test_a_bad_rates_period_is_a_400(own_broker, tmp_path):
    broker = rates_broker(own_broker, tmp_path)
    reply = request(broker, "GET", "/api/overview?msg_rates_age=0&msg_rates_incr=5")
    assert reply.status == 400
    assert request(broker, "GET", "/api/overview?msg_rates_age=abc").status == 200  # ignored, as RabbitMQ does
