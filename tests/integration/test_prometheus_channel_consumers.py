"""rabbitmq_channel_consumers (a panel of RabbitMQ's Grafana dashboard) as RabbitMQ's rabbitmq_prometheus gives it:
a gauge of the consumers on the channels, summed in /metrics and per channel in /metrics/per-object."""

from __future__ import annotations

from tests.integration.helpers import connect, declare_queue
from tests.integration.management import wait_for
from tests.integration.test_prometheus import fetch, scrape_until


def total(samples) -> float:
    return sum(samples["rabbitmq_channel_consumers"].values())


def test_channel_consumers_are_counted_per_channel_and_in_total(broker, unique):
    exposition = fetch(broker, "/metrics")
    assert "# TYPE rabbitmq_channel_consumers gauge\n" in exposition
    assert "# HELP rabbitmq_channel_consumers Consumers on a channel\n" in exposition
    before = total(scrape_until(broker, "/metrics", lambda samples: "rabbitmq_channel_consumers" in samples))
    with connect(broker) as conn:
        first, second = conn.channel(), conn.channel()
        queue = declare_queue(first, unique)
        first.basic_consume(queue, lambda *args: None)
        first.basic_consume(queue, lambda *args: None)
        second.basic_consume(queue, lambda *args: None, auto_ack=True)
        scrape_until(broker, "/metrics", lambda samples: total(samples) == before + 3)
        per_channel = scrape_until(broker, "/metrics/per-object",
                                   lambda samples: sorted(samples["rabbitmq_channel_consumers"].values())[-2:] == [1, 2]
                                   and total(samples) == before + 3)["rabbitmq_channel_consumers"]
        assert all(labels[0][0] == "channel" for labels in per_channel)
        if not broker.external:  # Warren labels a channel with its name in the management API (RabbitMQ: its pid)
            names = {channel["name"]: channel["consumer_count"] for channel in wait_for(
                broker, "/api/channels", lambda body: sum(channel["consumer_count"] for channel in body) >= 3)}
            assert {labels[0][1]: value for labels, value in per_channel.items()} == names
    scrape_until(broker, "/metrics", lambda samples: total(samples) == before)
