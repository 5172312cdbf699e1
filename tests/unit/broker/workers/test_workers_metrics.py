"""Several workers' Prometheus texts as one node's (broker.workers.metrics), and their overviews added up
(broker.workers.api.summed)."""

from broker.workers.api import summed
from broker.workers.metrics import merged


def family(name: str, kind: str, *series: str) -> str:
    return f"# HELP {name} {name} here\n# TYPE {name} {kind}\n" + "".join(line + "\n" for line in series)


def test_the_node_totals_are_added_up_and_each_queue_kept_from_its_worker():
    first = (family("rabbitmq_connections", "gauge", "rabbitmq_connections 2.0")
             + family("rabbitmq_queue_messages", "gauge", 'rabbitmq_queue_messages{vhost="/",queue="a"} 1.0')
             + family("rabbitmq_global_messages_routed", "counter",
                      'rabbitmq_global_messages_routed_total{protocol="amqp091"} 10.0'))
    second = (family("rabbitmq_connections", "gauge", "rabbitmq_connections 3.0")
              + family("rabbitmq_queue_messages", "gauge", 'rabbitmq_queue_messages{vhost="v1",queue="b # HELP x"} 5.0')
              + family("rabbitmq_global_messages_routed", "counter",
                       'rabbitmq_global_messages_routed_total{protocol="amqp091"} 5.0'))
    assert merged([first, second]) == (
        family("rabbitmq_connections", "gauge", "rabbitmq_connections 5.0")
        + family("rabbitmq_queue_messages", "gauge", 'rabbitmq_queue_messages{vhost="/",queue="a"} 1.0',
                 'rabbitmq_queue_messages{vhost="v1",queue="b # HELP x"} 5.0')
        + family("rabbitmq_global_messages_routed", "counter",
                 'rabbitmq_global_messages_routed_total{protocol="amqp091"} 15.0'))


def test_what_describes_the_node_is_not_added_up():
    texts = [family("rabbitmq_identity_info", "untyped", f'rabbitmq_identity_info{{rabbitmq_node="warren-{n}@h"}} 1.0')
             + family("rabbitmq_disk_space_available_bytes", "gauge", f"rabbitmq_disk_space_available_bytes {free}")
             + family("rabbitmq_erlang_uptime_seconds", "gauge", f"rabbitmq_erlang_uptime_seconds {uptime}")
             for n, free, uptime in ((0, "100.0", "5.0"), (1, "99.0", "7.0"))]
    assert merged(texts) == (
        family("rabbitmq_identity_info", "untyped", 'rabbitmq_identity_info{rabbitmq_node="warren-0@h"} 1.0')
        + family("rabbitmq_disk_space_available_bytes", "gauge", "rabbitmq_disk_space_available_bytes 100.0")
        + family("rabbitmq_erlang_uptime_seconds", "gauge", "rabbitmq_erlang_uptime_seconds 7.0"))


def test_the_memory_limit_is_the_workers_shares_added_up():
    texts = [family("rabbitmq_resident_memory_limit_bytes", "gauge", f"rabbitmq_resident_memory_limit_bytes {share}")
             for share in ("500.0", "500.0")]
    assert merged(texts) == family("rabbitmq_resident_memory_limit_bytes", "gauge",
                                   "rabbitmq_resident_memory_limit_bytes 1000.0")


def test_a_family_only_one_worker_has_and_one_without_series_are_kept():
    first = family("rabbitmq_channel_consumers", "gauge")
    second = (family("rabbitmq_channel_consumers", "gauge", 'rabbitmq_channel_consumers{channel="c (1)"} 2.0')
              + family("rabbitmq_queues", "gauge", "rabbitmq_queues 4.0"))
    assert merged([first, second]) == (
        family("rabbitmq_channel_consumers", "gauge", 'rabbitmq_channel_consumers{channel="c (1)"} 2.0')
        + family("rabbitmq_queues", "gauge", "rabbitmq_queues 4.0"))


def test_overviews_add_up_figures_and_samples_at_the_older_time():
    one = {"connections": 1, "publish_details": {"rate": 1.5, "samples": [{"sample": 10, "timestamp": 2000},
                                                                           {"sample": 4, "timestamp": 1000}]},
           "flag": True}
    other = {"connections": 2, "publish_details": {"rate": 0.5, "samples": [{"sample": 1, "timestamp": 1990},
                                                                             {"sample": 1, "timestamp": 1010}]},
             "flag": True, "queues": 3}
    assert summed(one, other) == {
        "connections": 3, "flag": True, "queues": 3,
        "publish_details": {"rate": 2.0, "samples": [{"sample": 11, "timestamp": 1990},
                                                     {"sample": 5, "timestamp": 1000}]}}
