"""MQTT connections and their sessions in the management API and the metrics, as AMQP ones are there."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import beyond_rabbitmq, rabbitmq4
from tests.integration.management import add_user, delete_user, quote, request, set_permissions
from tests.mqtt.clients import Client, connected
from tests.waiting import wait_for


def mqtt_connections(broker, unique: str) -> list[dict]:
    return [c for c in request(broker, "GET", "/api/connections").body
            if c["client_properties"].get("client_id", "").startswith(unique)]


def listed(broker, unique: str, count: int) -> list[dict]:
    """The MQTT connections of the test, once there are count (RabbitMQ lists a connection once its statistics
    came)."""
    return wait_for(lambda: mqtt_connections(broker, unique), what=f"{count} connections listed",
                    until=lambda found: len(found) == count)


def test_an_mqtt_connection_is_listed_with_its_protocol_and_client_id(broker, unique):
    with connected(broker, f"{unique}-a", keepalive=30):
        (connection,) = listed(broker, unique, 1)
        assert (connection["protocol"], connection["client_properties"], connection["vhost"], connection["user"]) == (
            "MQTT 3.1.1", {"product": "MQTT client", "client_id": f"{unique}-a"}, "/", "guest")


@rabbitmq4
def test_a_5_0_connection_is_listed_with_its_keepalive(broker, unique):
    with connected(broker, f"{unique}-b", version=5, keepalive=30):
        (connection,) = listed(broker, unique, 1)
        assert (connection["protocol"], connection["timeout"], connection["channels"]) == ("MQTT 5.0", 30, 1)


def test_an_operator_closes_an_mqtt_connection_through_the_api(broker, unique):
    client = Client(broker, f"{unique}-a").connect()
    (connection,) = listed(broker, unique, 1)
    assert request(broker, "DELETE", f"/api/connections/{quote(connection['name'])}").status == 204
    assert client.disconnected.wait(10)
    client.paho.loop_stop()
    wait_for(lambda: not mqtt_connections(broker, unique), what="the connection gone from the list")


def test_a_subscription_is_a_queue_and_binding_in_the_api(broker, unique):
    with connected(broker, f"{unique}-s", clean=False) as client:
        client.subscribe(f"{unique}/rooms/+/t", qos=1)
        queue = wait_for(lambda: request(broker, "GET", f"/api/queues/%2F/mqtt-subscription-{unique}-sqos1").body,
                         what="the queue's statistics", until=lambda queue: "consumers" in queue)
        assert (queue["durable"], queue["auto_delete"], queue["consumers"]) == (True, False, 1)
        bindings = request(broker, "GET", f"/api/queues/%2F/mqtt-subscription-{unique}-sqos1/bindings").body
        assert [(b["source"], b["routing_key"]) for b in bindings if b["source"]] == [
            ("amq.topic", f"{unique}.rooms.*.t")]
    with connected(broker, f"{unique}-s", clean=True):
        pass


@beyond_rabbitmq  # (3.10 makes it durable)
def test_a_clean_sessions_queues_are_transient(broker, unique):
    with connected(broker, f"{unique}-s", clean=True) as client:
        client.subscribe(f"{unique}/a", qos=1)
        client.subscribe(f"{unique}/b", qos=0)
        for qos in (0, 1):
            queue = request(broker, "GET", f"/api/queues/%2F/mqtt-subscription-{unique}-sqos{qos}").body
            assert (queue["durable"], queue["auto_delete"]) == (False, True)


def test_deleting_the_user_closes_its_mqtt_connections(broker, unique):
    add_user(broker, unique, "secret")
    set_permissions(broker, "/", unique)
    client = Client(broker, f"{unique}-a", username=unique, password="secret").connect()
    delete_user(broker, unique)
    assert client.disconnected.wait(10)
    client.paho.loop_stop()


@beyond_rabbitmq  # (3.10's metrics have no protocol of MQTT's: its clients are AMQP channels there)
def test_the_global_counters_are_labelled_by_protocol_as_rabbitmq_4_labels_them(own_broker, unique):
    broker = own_broker()
    with connected(broker, f"{unique}-s") as subscriber, connected(broker, f"{unique}-p", version=5) as publisher:
        subscriber.subscribe(f"{unique}/a", qos=1)
        for _ in range(3):
            publisher.publish(f"{unique}/a", b"x", qos=1)
        assert [subscriber.receive().payload for _ in range(3)] == [b"x"] * 3
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{broker.prometheus_port}/metrics", timeout=10).read()
    samples = {(sample.name, sample.labels.get("protocol")): sample.value
               for family in text_string_to_metric_families(metrics.decode()) for sample in family.samples}
    assert samples[("rabbitmq_global_messages_received_total", "mqtt50")] == 3
    assert samples[("rabbitmq_global_messages_confirmed_total", "mqtt50")] == 3
    assert samples[("rabbitmq_global_messages_received_total", "amqp091")] == 0
    assert samples[("rabbitmq_global_consumers", "mqtt311")] == 1
    assert samples[("rabbitmq_auth_attempts_total", "mqtt311")] == 1
