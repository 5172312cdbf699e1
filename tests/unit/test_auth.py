"""Logins: PLAIN and AMQPLAIN against the configured user, and loopback-only users (guest, as in RabbitMQ)."""

import pytest
from pamqp import encode

from broker.auth import authenticate
from broker.config import load_config


def amqplain(login: str, password: str) -> bytes:
    return encode.field_table({"LOGIN": login, "PASSWORD": password})[4:]


@pytest.mark.parametrize("mechanism, response", [("PLAIN", "\0guest\0guest"), ("AMQPLAIN", amqplain("guest", "guest"))])
def test_the_default_user_logs_in_with_either_mechanism(mechanism, response):
    assert authenticate(load_config(), mechanism, response, "127.0.0.1") == "guest"


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "\0guest\0wrong"), ("PLAIN", "\0nobody\0guest"), ("PLAIN", "garbage"), ("EXTERNAL", ""),
    ("AMQPLAIN", b"\xff\xff"),
])
def test_bad_credentials_are_refused(mechanism, response):
    assert authenticate(load_config(), mechanism, response, "127.0.0.1") is None


def test_guest_may_log_in_only_from_this_machine():
    config = load_config()
    assert authenticate(config, "PLAIN", "\0guest\0guest", "::1") == "guest"
    assert authenticate(config, "PLAIN", "\0guest\0guest", "192.0.2.7") is None


def test_loopback_users_can_be_configured(tmp_path):
    path = tmp_path / "warren.toml"
    path.write_text('[amqp]\ndefault_user = "app"\ndefault_pass = "secret"\nloopback_users = []\n')
    assert authenticate(load_config(path), "PLAIN", "\0app\0secret", "192.0.2.7") == "app"
