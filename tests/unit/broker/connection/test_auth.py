"""Logins: PLAIN and AMQPLAIN against the node's users (the configured default user on a new node), and loopback-only users (guest, as in RabbitMQ)."""

import pytest
from pamqp import encode

from broker.config import load_config
from broker.connection.auth import Login, authenticate as authenticate_with_node, parse_response
from broker.model.node import Node


def authenticate(config, mechanism, response, peer_address):
    """A login to a new node bootstrapped from config."""
    node = Node()
    node.bootstrap(config.default_vhost, config.default_user, config.default_pass)
    return authenticate_with_node(node, config.loopback_users, mechanism, response, peer_address)


def amqplain(login: str, password: str) -> bytes:
    return encode.field_table({"LOGIN": login, "PASSWORD": password})[4:]


@pytest.mark.parametrize("mechanism, response", [("PLAIN", "\0guest\0guest"), ("AMQPLAIN", amqplain("guest", "guest"))])
def test_the_default_user_logs_in_with_either_mechanism(mechanism, response):
    assert authenticate(load_config(), mechanism, response, "127.0.0.1") == Login("guest", True)


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "\0guest\0wrong"), ("PLAIN", "\0nobody\0guest"), ("PLAIN", "garbage"), ("EXTERNAL", ""),
    ("AMQPLAIN", b"\xff\xff"),
])
def test_bad_credentials_are_refused(mechanism, response):
    assert not authenticate(load_config(), mechanism, response, "127.0.0.1").accepted


def test_guest_may_log_in_only_from_this_machine():
    config = load_config()
    assert authenticate(config, "PLAIN", "\0guest\0guest", "::1") == Login("guest", True)
    assert authenticate(config, "PLAIN", "\0guest\0guest", "192.0.2.7") == Login(
        "guest", False, "user 'guest' can only connect via localhost")  # (RabbitMQ's words, for the log)
    assert authenticate(config, "PLAIN", "\0guest\0wrong", "192.0.2.7") == Login("guest", False, "invalid credentials")


def test_loopback_users_can_be_configured(tmp_path):
    path = tmp_path / "warren.toml"
    path.write_text('[amqp]\ndefault_user = "app"\ndefault_pass = "secret"\nloopback_users = []\n')
    assert authenticate(load_config(path), "PLAIN", "\0app\0secret", "192.0.2.7") == Login("app", True)


@pytest.mark.parametrize("response, expected", [
    (b"\0guest\0guest", ("guest", "guest")),
    (b"\0guest\0", ("guest", "")),  # an empty password is read; the check refuses it
    (b"\0\xc3\xa9l\xc3\xa8ve\0p\xc3\xa4ss", ("\u00e9l\u00e8ve", "p\u00e4ss")),  # UTF-8 names and passwords
    (b"guest\0guest\0guest", None),  # an authorization identity, even the user's own (as RabbitMQ)
    (b"admin\0guest\0guest", None),  # an authorization identity other than the user
    (b"\0guest\0guest\0x", None),  # a NUL in the password
    (b"\0guest", None),  # no password
    (b"guest", None),
    (b"", None),
])
def test_plain_reads_only_user_and_password_without_an_authorization_identity(response, expected):
    assert parse_response("PLAIN", response) == expected


def test_a_refused_login_names_the_user_when_its_response_can_be_read():
    assert authenticate(load_config(), "PLAIN", "admin\0guest\0guest", "127.0.0.1") == Login(
        "", False, "invalid credentials")
    assert authenticate(load_config(), "PLAIN", "\0guest\0wrong", "127.0.0.1") == Login(
        "guest", False, "invalid credentials")
