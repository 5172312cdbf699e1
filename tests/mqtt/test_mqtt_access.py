"""Who may connect, where, and what they may do: Warren's users, their permissions, loopback users and the
refused-login throttle, as for AMQP; vhost:user names the vhost."""

from __future__ import annotations

import pytest

from tests.integration.helpers import beyond_rabbitmq, rabbitmq4
from tests.integration.management import add_user, add_vhost, delete_user, delete_vhost, set_permissions
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


def test_an_empty_client_id_needs_a_clean_session(broker, unique):
    assert connack_of(broker, connect_packet("", clean=False)) == CONNACK_IDENTIFIER_REJECTED
    assert connack_of(broker, connect_packet("", clean=True)) == CONNACK_ACCEPTED
