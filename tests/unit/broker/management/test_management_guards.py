"""The management API's pure decisions about a request: who may log in from where, which Host and Origin headers
name this API, which bodies it reads, what JSON it takes, and how a download is named."""

import re

import pytest

from broker.config import ConfigError, load_config
from broker.connection.auth import is_loopback, may_log_in_from
from broker.management import http
from broker.management.guards import UNSUPPORTED, body_refusal, host_allowed, origin_matches
from broker.management.views.definitions import content_disposition
from broker.model import access
from broker.model.node import Node

NAMES = frozenset({"localhost", "vm", "vm.example.com", "broker.example.com"})


@pytest.mark.parametrize("user, address, allowed", [
    ("guest", "127.0.0.1", True), ("guest", "127.8.9.10", True), ("guest", "::1", True),
    ("guest", "::ffff:127.0.0.1", True), ("guest", "192.0.2.2", False), ("guest", "::ffff:192.0.2.2", False),
    ("guest", "", False), ("alice", "192.0.2.2", True),
])
def test_a_loopback_user_logs_in_only_from_this_machine(user, address, allowed):
    assert may_log_in_from(user, ["guest"], address) is allowed


def test_every_127_address_is_loopback():
    assert all(is_loopback(f"127.{n}.{n}.1") for n in (0, 1, 255))
    assert not is_loopback("128.0.0.1") and not is_loopback("localhost")


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1:15672", True), ("192.0.2.2", True), ("[::1]:15672", True), ("[fe80::1]", True),
    ("localhost:15672", True), ("LOCALHOST", True), ("vm", True), ("vm.example.com.:15672", True),
    ("broker.example.com:443", True), (None, True),
    ("evil.example.net:15672", False), ("127.0.0.1.nip.io:15672", False), ("", False), ("[::1", False),
])
def test_the_host_header_must_name_this_api(host, allowed):
    assert host_allowed(host, NAMES) is allowed


@pytest.mark.parametrize("origin, host, matches", [
    ("http://127.0.0.1:15672", "127.0.0.1:15672", True),
    ("https://Broker.example.com", "broker.example.com", True),
    ("http://evil.example.net", "127.0.0.1:15672", False),
    ("http://127.0.0.1:8080", "127.0.0.1:15672", False),
    ("null", "127.0.0.1:15672", False),
    ("file://", "127.0.0.1:15672", False),
    ("http://127.0.0.1:15672", None, False),
])
def test_an_origin_must_be_the_hosts_own(origin, host, matches):
    assert origin_matches(origin, host) is matches


@pytest.mark.parametrize("method, has_body, content_type, refused", [
    ("PUT", True, "application/json", False), ("POST", True, "application/json", False),
    ("POST", True, "text/plain", True), ("POST", True, "multipart/form-data", True),
    ("POST", True, "application/x-www-form-urlencoded", True), ("DELETE", True, "application/octet-stream", True),
    ("PATCH", True, "", True), ("PUT", False, "", False), ("DELETE", False, "text/plain", False),
    ("GET", True, "text/plain", False),
])
def test_a_body_that_changes_something_must_be_json(method, has_body, content_type, refused):
    assert body_refusal(method, has_body, content_type) == (UNSUPPORTED if refused else None)


@pytest.mark.parametrize("raw", [b'{"a": 1e400}', b'{"a": -1e400}', b'{"a": NaN}', b'{"a": Infinity}',
                                 b'[-Infinity]'])
def test_numbers_json_cannot_carry_are_rabbitmqs_not_json(raw):
    with pytest.raises(http.ApiError) as refusal:
        http.decode_json(raw)
    assert (refusal.value.status, refusal.value.reason) == (400, "not_json")


def test_finite_numbers_are_read():
    assert http.decode_json(b'{"a": 1e308, "b": -2.5, "c": 12345678901234567890}') == {
        "a": 1e308, "b": -2.5, "c": 12345678901234567890}


@pytest.mark.parametrize("name, header", [
    ("warren.json", "attachment; filename=warren.json"),
    ("a\r\nSet-Cookie: x", "attachment; filename=\"a__Set-Cookie: x\"; filename*=UTF-8''a%0D%0ASet-Cookie%3A%20x"),
    ("défs.json", "attachment; filename=\"d_fs.json\"; filename*=UTF-8''d%C3%A9fs.json"),
])
def test_a_download_name_cannot_break_its_header(name, header):
    assert content_disposition(name) == header
    assert "\r" not in header and "\n" not in header


def test_a_blank_password_never_logs_in():
    node = Node()
    node.put_user("blank", "", tags=["administrator"])
    node.put_user("alice", "secret")
    assert node.authenticate("blank", "") is None
    assert node.authenticate("alice", "") is None
    assert node.authenticate("alice", "secret") is not None


def test_an_unknown_user_costs_the_same_hashing_as_a_wrong_password(monkeypatch):
    node = Node()
    node.put_user("alice", "secret")
    node.put_user("nopassword")
    digest = access.HASHING_ALGORITHMS[access.DEFAULT_HASHING]
    hashed: list[bytes] = []
    monkeypatch.setitem(access.HASHING_ALGORITHMS, access.DEFAULT_HASHING,
                        lambda data: hashed.append(data) or digest(data))
    for name in ("alice", "bob", "nopassword"):
        hashed.clear()
        assert node.authenticate(name, "wrong") is None
        assert len(hashed) == 1, name


@pytest.mark.parametrize("overrides, message", [
    ({"management_max_body_size": 0}, "management max_body_size must be between 1 and 536870912 bytes, got 0"),
    ({"management_max_connections": 0}, "management max_connections must be between 1 and 100000, got 0"),
    ({"prometheus_max_connections": 10**6}, "prometheus max_connections must be between 1 and 100000, got 1000000"),
    ({"management_hostnames": ["evil.example.net/x"]}, "management hostnames must be DNS names"),
])
def test_bad_http_limits_and_names_are_refused_with_a_message(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides=overrides)


def test_http_defaults_are_rabbitmqs():
    config = load_config()
    assert config.management_max_body_size == 10_000_000  # RabbitMQ's management.http.max_body_size
    assert (config.management_max_connections, config.prometheus_max_connections) == (256, 64)
