"""Who may connect, where, and what they may do: Warren's users, their permissions and topic permissions, loopback
users and the refused-login throttle, as for AMQP; vhost:user names the vhost."""

from __future__ import annotations

import pytest

from tests.integration.helpers import beyond_rabbitmq, rabbitmq4
from tests.integration.management import (
    add_user, add_vhost, delete_user, delete_vhost, set_permissions, set_topic_permissions,
)
from tests.mqtt.clients import Client, RawClient, connect_packet, connected

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
CONNACK_BAD_CREDENTIALS = b"\x20\x02\x00\x04"
CONNACK_NOT_AUTHORIZED = b"\x20\x02\x00\x05"
CONNACK_IDENTIFIER_REJECTED = b"\x20\x02\x00\x02"
REFUSAL_WAIT = 15  # seconds a refused login's CONNACK may take (the throttle's longest wait is 10 s)


def connack_of(broker, packet: bytes) -> bytes:
    client = RawClient(broker)
    client.sock.settimeout(REFUSAL_WAIT)
    try:
        client.send(packet)
        return client.read(4)
    finally:
        client.close()


@pytest.fixture
def user_in_vhost(broker, unique):
    """A vhost of the test's own with a user allowed everything there (name, password, vhost)."""
    vhost, user = f"{unique}-vhost", f"{unique}-user"
    add_vhost(broker, vhost)
    add_user(broker, user, "secret")
    set_permissions(broker, vhost, user)
    yield user, "secret", vhost
    delete_user(broker, user)
    delete_vhost(broker, vhost)


def test_a_wrong_password_is_refused_with_bad_credentials(broker, unique):
    assert connack_of(broker, connect_packet(unique, password="wrong")) == CONNACK_BAD_CREDENTIALS


def test_a_client_without_credentials_is_refused_unless_anonymous_logins_are_allowed(broker, own_broker, unique,
                                                                                     tmp_path):
    assert connack_of(broker, b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a") == CONNACK_BAD_CREDENTIALS
    config = tmp_path / "warren.toml"
    config.write_text("[mqtt]\nallow_anonymous = true\n")
    anonymous = own_broker("--config", str(config))
    assert connack_of(anonymous, b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a") == CONNACK_ACCEPTED


def test_user_names_vhost_colon_user_choose_the_vhost(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    with connected(broker, f"{unique}-s", username=f"{vhost}:{user}", password=password) as subscriber:
        subscriber.subscribe(f"{unique}/a", qos=1)
        with connected(broker, f"{unique}-p", username=f"{vhost}:{user}", password=password) as publisher:
            publisher.publish(f"{unique}/a", b"in the vhost", qos=1)
        with connected(broker, f"{unique}-other") as elsewhere:  # guest, in the default vhost
            elsewhere.publish(f"{unique}/a", b"in /", qos=1)
        assert subscriber.receive().payload == b"in the vhost"
        subscriber.nothing_more()


def test_a_vhost_that_does_not_exist_is_bad_credentials_and_one_without_permissions_not_authorized(
        broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    assert connack_of(broker, connect_packet(unique, f"nowhere-{unique}:{user}", password)) == CONNACK_BAD_CREDENTIALS
    assert connack_of(broker, connect_packet(unique, f"/:{user}", password)) == CONNACK_NOT_AUTHORIZED


@rabbitmq4  # (3.10 leaves a QoS 1 publish it refused unanswered)
def test_publishing_without_write_permission_closes_the_connection(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    set_permissions(broker, vhost, user, write="^$")
    client = Client(broker, f"{unique}-p", username=f"{vhost}:{user}", password=password).connect()
    client.paho.publish(f"{unique}/a", b"refused", qos=1)
    assert client.disconnected.wait(10)
    client.paho.loop_stop()


@beyond_rabbitmq  # (3.10 closes the connection, where the spec has SUBACK 0x80)
def test_subscribing_without_read_permission_is_refused_in_the_suback(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    set_permissions(broker, vhost, user, read="^$")
    with connected(broker, f"{unique}-s", username=f"{vhost}:{user}", password=password) as client:
        assert [code.value for code in client.subscribe(f"{unique}/a", qos=1)] == [0x80]


@rabbitmq4  # (3.10 closes the connection, where 4.x refuses the filter in the SUBACK)
@pytest.mark.parametrize("version, refused", [(4, 0x80), (5, 0x87)])
def test_a_filter_the_topic_permissions_refuse_is_refused_in_the_suback(broker, unique, user_in_vhost, version,
                                                                         refused):
    user, password, vhost = user_in_vhost
    set_topic_permissions(broker, vhost, user, read=f"^{unique}\\.open\\.")
    with connected(broker, f"{unique}-s", username=f"{vhost}:{user}", password=password, version=version) as client:
        assert [code.value for code in client.subscribe(f"{unique}/closed/#", qos=1)] == [refused]
        assert [code.value for code in client.subscribe(f"{unique}/open/#", qos=1)] == [1]
        client.publish(f"{unique}/open/a", b"still connected", qos=1)
        assert client.receive().payload == b"still connected"


@rabbitmq4  # (3.10 leaves a QoS 1 publish it refused unanswered)
def test_publishing_to_a_topic_the_topic_permissions_refuse_closes_the_connection(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    set_topic_permissions(broker, vhost, user, write=f"^{unique}\\.open\\.")
    client = Client(broker, f"{unique}-p", username=f"{vhost}:{user}", password=password).connect()
    client.publish(f"{unique}/open/a", b"allowed", qos=1)
    client.paho.publish(f"{unique}/closed/a", b"refused", qos=1)
    assert client.disconnected.wait(10)
    client.paho.loop_stop()


@rabbitmq4
def test_client_id_in_a_topic_permission_stands_for_the_clients(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    set_topic_permissions(broker, vhost, user, write="^devices\\.{client_id}\\.", read="^devices\\.{client_id}\\.")
    login = {"username": f"{vhost}:{user}", "password": password}
    with connected(broker, f"{unique}-a", **login) as device:
        assert [code.value for code in device.subscribe(f"devices/{unique}-a/#", qos=1)] == [1]
        assert [code.value for code in device.subscribe(f"devices/{unique}-b/#", qos=1)] == [0x80]
        device.publish(f"devices/{unique}-a/temperature", b"21", qos=1)
        assert device.receive().payload == b"21"


@rabbitmq4
def test_a_retained_message_the_topic_permissions_refuse_is_not_kept(broker, unique, user_in_vhost):
    user, password, vhost = user_in_vhost
    set_topic_permissions(broker, vhost, user, write=f"^{unique}\\.open")
    login = {"username": f"{vhost}:{user}", "password": password}
    client = Client(broker, f"{unique}-p", **login).connect()
    client.paho.publish(f"{unique}/closed", b"refused", qos=1, retain=True)
    assert client.disconnected.wait(10)
    client.paho.loop_stop()
    with connected(broker, f"{unique}-s", **login) as subscriber:
        subscriber.subscribe(f"{unique}/#", qos=1)
        subscriber.nothing_more()  # (no retained message comes)


def test_an_empty_client_id_needs_a_clean_session(broker, unique):
    assert connack_of(broker, connect_packet("", clean=False)) == CONNACK_IDENTIFIER_REJECTED
    assert connack_of(broker, connect_packet("", clean=True)) == CONNACK_ACCEPTED
