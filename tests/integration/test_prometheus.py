"""The Prometheus endpoint: RabbitMQ's metric names, labels and values for known broker states, parsed with
prometheus_client's own parser; Warren's store and recovery metrics; a scrape of 10,000 queues is quick and does
not hold up other clients."""

from __future__ import annotations

import threading
import time
import urllib.request

import pika
import pika.exceptions
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import EVENT_TIMEOUT, beyond_rabbitmq, connect, declare_queue, publish
from tests.waiting import wait_for


def scrape(broker, path: str = "/metrics") -> dict[str, dict[tuple, float]]:
    """metric sample name -> {sorted label items: value}."""
    with urllib.request.urlopen(f"http://{broker.host}:{broker.prometheus_port}{path}", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples[name][tuple(sorted(labels.items()))]


# RabbitMQ refreshes its per-object values every collect_statistics_interval (5 s); Warren's are read at the scrape
STATISTICS_INTERVAL = 5.0


def scrape_until(broker, path: str, condition) -> dict[str, dict[tuple, float]]:
    """Scrape until condition(samples) holds (at once on Warren; within a statistics interval on RabbitMQ)."""
    def shows(samples: dict[str, dict[tuple, float]]) -> bool:
        try:
            return bool(condition(samples))
        except KeyError:  # the series is not there yet
            return False
    return wait_for(lambda: scrape(broker, path), STATISTICS_INTERVAL + EVENT_TIMEOUT,
                    f"the scrape of {path} showing what the test waits for", 0.1, until=shows)


CLASSIC = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}


def test_totals_follow_publishes_deliveries_gets_and_acks(own_broker, unique):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = declare_queue(ch, f"{unique}-q", durable=True)
        empty = declare_queue(ch, f"{unique}-empty")
        publish(ch, queue, [b"m"] * 5, properties=pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", f"{unique}-nowhere", b"dropped")
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"{unique}-nowhere", b"returned", mandatory=True)
        method, _, _ = ch.basic_get(queue)
        ch.basic_ack(method.delivery_tag)
        ch.basic_get(queue, auto_ack=True)
        assert ch.basic_get(empty) == (None, None, None)
        held = []
        ch.basic_consume(queue, lambda _ch, method, _props, _body: held.append(method.delivery_tag))
        deadline = time.monotonic() + EVENT_TIMEOUT
        while len(held) < 3 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        samples = scrape(broker)

    assert value(samples, "rabbitmq_global_messages_received_total", protocol="amqp091") == 7
    assert value(samples, "rabbitmq_global_messages_received_confirm_total", protocol="amqp091") == 7
    assert value(samples, "rabbitmq_global_messages_routed_total", protocol="amqp091") == 5
    assert value(samples, "rabbitmq_global_messages_unroutable_dropped_total", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_global_messages_unroutable_returned_total", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_global_messages_confirmed_total", protocol="amqp091") == 7
    assert value(samples, "rabbitmq_global_messages_delivered_total", **CLASSIC) == 5
    assert value(samples, "rabbitmq_global_messages_delivered_consume_manual_ack_total", **CLASSIC) == 3
    assert value(samples, "rabbitmq_global_messages_delivered_get_manual_ack_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_delivered_get_auto_ack_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_get_empty_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_acknowledged_total", **CLASSIC) == 1
    assert value(samples, "rabbitmq_global_messages_delivered_total", protocol="amqp091",
                 queue_type="rabbit_quorum_queue") == 0
    assert value(samples, "rabbitmq_global_consumers", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_global_publishers", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_queue_messages_ready") == 0
    assert value(samples, "rabbitmq_queue_messages_unacked") == 3
    assert value(samples, "rabbitmq_queue_messages") == 3
    assert value(samples, "rabbitmq_queue_messages_unacked_bytes") == 3
    assert value(samples, "rabbitmq_queue_messages_published_total") == 5
    assert value(samples, "rabbitmq_queues") == 2 and value(samples, "rabbitmq_consumers") == 1
    assert value(samples, "rabbitmq_connections") == 1 and value(samples, "rabbitmq_channels") == 1
    assert value(samples, "rabbitmq_queues_declared_total") == 2
    assert value(samples, "rabbitmq_queues_created_total") == 2
    assert value(samples, "rabbitmq_connections_opened_total") == 1
    assert value(samples, "rabbitmq_auth_attempts_succeeded_total", protocol="amqp091") == 1
    assert value(samples, "rabbitmq_alarms_memory_used_watermark") == 0
    assert value(samples, "rabbitmq_process_resident_memory_bytes") > 0
    [identity] = samples["rabbitmq_identity_info"]
    assert {key for key, _ in identity} == {"rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"}
    # the persistent publishes went through the store's group commit
    assert value(samples, "warren_store_batch_messages_sum") == 5
    assert value(samples, "warren_store_batch_messages_count") >= 1
    assert value(samples, "warren_store_sync_seconds_count") >= 1
    assert value(samples, "warren_store_sync_seconds_bucket", le="+Inf") >= 1

    after = scrape(broker)  # the connection is closed: its consumer and channel are gone, its deliveries requeued
    assert value(after, "rabbitmq_connections_closed_total") == 1
    assert value(after, "rabbitmq_channels_closed_total") == 1
    assert value(after, "rabbitmq_queue_messages_ready") == 3 and value(after, "rabbitmq_queue_messages_unacked") == 0


def test_per_object_metrics_label_each_queue_with_its_vhost_and_name(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        first = declare_queue(ch, f"{unique}-a")
        second = declare_queue(ch, f"{unique}-b")
        publish(ch, first, [b"12345"] * 2)
        publish(ch, second, [b"x"])
        ch.queue_declare(first, passive=True)  # the publishes were handled
        samples = scrape_until(broker, "/metrics/per-object", lambda samples: (
            value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue=first) == 2
            and value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue=second) == 1))
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue=first) == 2
    assert value(samples, "rabbitmq_queue_messages_ready_bytes", vhost="/", queue=first) == 10
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue=second) == 1
    assert value(samples, "rabbitmq_queue_messages_published_total", vhost="/", queue=first) == 2
    assert value(samples, "rabbitmq_queue_consumers", vhost="/", queue=second) == 0


@beyond_rabbitmq
def test_per_object_label_values_are_escaped_as_the_text_format_asks(broker, unique):
    """Quotes and backslashes in a queue's name are escaped in its labels, so the scrape parses (RabbitMQ 3.10 writes
    them as they are, which makes its whole /metrics/per-object unparsable; a new line is escaped too, see
    tests/unit/broker/management/test_prometheus_labels.py: RabbitMQ 3.10 never answers the declare of a queue whose name has one)."""
    with connect(broker) as conn:
        ch = conn.channel()
        quoted = declare_queue(ch, f'{unique}-"quoted" \\ back')
        publish(ch, quoted, [b"q"] * 3)
        ch.queue_declare(quoted, passive=True)  # the publishes were handled
        samples = scrape(broker, "/metrics/per-object")
        ch.queue_delete(quoted)
    assert value(samples, "rabbitmq_queue_messages_ready", vhost="/", queue=quoted) == 3


def test_dead_lettered_messages_are_counted_by_reason_and_strategy(own_broker, unique):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        target = declare_queue(ch, f"{unique}-dlq")
        with_dlx = declare_queue(ch, f"{unique}-src", arguments={"x-dead-letter-exchange": "",
                                                                   "x-dead-letter-routing-key": target})
        expiring = declare_queue(ch, f"{unique}-ttl", arguments={"x-message-ttl": 0})
        publish(ch, with_dlx, [b"a", b"b"])
        publish(ch, expiring, [b"c"])
        for _ in range(2):
            method, _, _ = ch.basic_get(with_dlx)
            ch.basic_reject(method.delivery_tag, requeue=False)
        ch.queue_declare(target, passive=True)
        samples = scrape(broker)
    assert value(samples, "rabbitmq_global_messages_dead_lettered_rejected_total", queue_type="rabbit_classic_queue",
                 dead_letter_strategy="at_most_once") == 2
    assert value(samples, "rabbitmq_global_messages_dead_lettered_expired_total", queue_type="rabbit_classic_queue",
                 dead_letter_strategy="disabled") == 1


def test_paged_messages_and_the_last_recovery_are_reported(own_broker, unique, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[server]\nqueue_messages_in_memory = 10\n")
    broker = own_broker("--config", str(config))
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        queue = declare_queue(ch, f"{unique}-deep", durable=True)
        publish(ch, queue, [b"p" * 100] * 50, properties=pika.BasicProperties(delivery_mode=2))
    samples = scrape(broker, "/metrics/per-object")
    paged = value(samples, "rabbitmq_queue_messages_paged_out", vhost="/", queue=queue)
    assert 0 < paged <= 40
    assert value(samples, "rabbitmq_queue_messages_paged_out_bytes", vhost="/", queue=queue) == paged * 100
    assert value(samples, "rabbitmq_queue_messages_ready_ram", vhost="/", queue=queue) == 50 - paged
    assert value(samples, "rabbitmq_queue_messages_persistent", vhost="/", queue=queue) == 50

    broker.restart()
    samples = scrape(broker)
    assert value(samples, "warren_recovery_messages") == 50
    assert value(samples, "warren_recovery_seconds") > 0
    assert value(samples, "warren_store_bytes") > 50 * 100


def fetch(broker, path: str) -> str:
    with urllib.request.urlopen(f"http://{broker.host}:{broker.prometheus_port}{path}", timeout=30) as response:
        return response.read().decode()


def scrape_while_another_client_works(broker, ch, path: str, queue: str) -> tuple[float, float, str]:
    """(seconds the scrape took, the longest round trip another client made meanwhile, the scraped text)."""
    round_trips: list[float] = []
    done = threading.Event()
    result: dict = {}

    def scrape_once() -> None:
        started = time.perf_counter()
        result["text"] = fetch(broker, path)
        result["seconds"] = time.perf_counter() - started
        done.set()

    scraper = threading.Thread(target=scrape_once)
    scraper.start()
    while not done.is_set():
        started = time.perf_counter()
        ch.queue_declare(queue, passive=True)
        round_trips.append(time.perf_counter() - started)
    scraper.join()
    return result["seconds"], max(round_trips), result["text"]


@pytest.mark.alone
@pytest.mark.slow
def test_a_scrape_of_ten_thousand_queues_is_quick_and_other_clients_are_not_held_up(own_broker, unique):
    broker = own_broker()
    count = 10_000
    with connect(broker) as conn:
        ch = conn.channel()
        for n in range(count):
            ch.queue_declare(f"{unique}-{n}", arguments={"x-max-length": 100})
        publish(ch, f"{unique}-0", [b"m"] * 10)
        ch.queue_declare(f"{unique}-0", passive=True)
        # the management API samples every queue's counters every 5 s: never all 10,000 at one stretch
        round_trips = []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            started = time.perf_counter()
            ch.queue_declare(f"{unique}-0", passive=True)
            round_trips.append(time.perf_counter() - started)
        assert max(round_trips) < 0.05, f"longest round trip over a sampling {max(round_trips) * 1000:.1f} ms"
        seconds, longest, text = scrape_while_another_client_works(broker, ch, "/metrics", f"{unique}-0")
        assert "rabbitmq_queues 10000.0" in text
        assert seconds < 1.0, f"/metrics took {seconds:.2f} s"
        assert longest < 0.05, f"longest round trip during /metrics {longest * 1000:.1f} ms"
        # one series per queue and metric (170,000 lines): slower, formatted off the event loop all the same
        seconds, longest, text = scrape_while_another_client_works(broker, ch, "/metrics/per-object",
                                                                   f"{unique}-0")
        assert text.count("rabbitmq_queue_messages_ready{") == count
        assert seconds < 1.0, f"/metrics/per-object took {seconds:.2f} s"  # 0.15 to 0.3 s measured
        assert longest < 0.05, f"longest round trip during /metrics/per-object {longest * 1000:.1f} ms"
