"""Topic permissions (RabbitMQ's topic authorisation): on a topic exchange, the routing keys a user may publish with
(write) and bind with (read), two regular expressions per user, vhost and exchange, set through the management API;
refused with 403 ACCESS_REFUSED and RabbitMQ's text. Each test has a vhost and a user of its own, allowed every
resource there."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import beyond_rabbitmq, channel_error, fresh, get, rabbitmq4
from tests.integration.management import quote, request


@dataclass
class TopicAccount:
    """A user with a vhost of its own, allowed every resource there (and the management API), and the vhost's topic
    exchange "events"."""

    broker: Any
    vhost: str
    user: str

    @property
    def path(self) -> str:
        return f"/api/topic-permissions/{quote(self.vhost)}/{quote(self.user)}"

    def limit(self, exchange: str = "events", write: str = ".*", read: str = ".*") -> int:
        """Set the user's topic permission on exchange; the API's status."""
        return request(self.broker, "PUT", self.path, {"exchange": exchange, "write": write, "read": read}).status

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            self.broker.host, self.broker.port, self.vhost, pika.PlainCredentials(self.user, "secret")))

    def refusal(self, key: str, exchange: str = "events") -> tuple[int, str]:
        return 403, (f"ACCESS_REFUSED - access to topic '{key}' in exchange '{exchange}' in vhost '{self.vhost}' "
                     f"refused for user '{self.user}'")


@pytest.fixture
def account(broker) -> Iterator[TopicAccount]:
    tag = secrets.token_hex(4)
    vhost, user = f"topic-vhost-{tag}", f"topic-user-{tag}"
    management.add_vhost(broker, vhost)
    management.add_user(broker, user, "secret", "management")  # (a management user may publish through the API)
    management.set_permissions(broker, vhost, user)
    account = TopicAccount(broker, vhost, user)
    with account.connect() as conn:
        ch = conn.channel()
        ch.exchange_declare("events", "topic")
        ch.exchange_declare("plain", "direct")
    try:
        yield account
    finally:
        management.delete_user(broker, user)
        management.delete_vhost(broker, vhost)


def published(ch, exchange: str, key: str, headers: dict | None = None) -> None:
    """Publish and make a round trip, so that a refusal closes the channel before this returns."""
    ch.basic_publish(exchange, key, b"m", pika.BasicProperties(headers=headers))
    ch.queue_declare("", exclusive=True)


def test_publishing_needs_a_routing_key_the_write_pattern_allows(account):
    assert account.limit(write="^orders\\.", read=".*") == 201
    with account.connect() as conn:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, "events", "#")
        published(ch, "events", "orders.new")
        assert get(ch, queue).body == b"m"
        assert channel_error(lambda: published(ch, "events", "invoices.new")) == account.refusal("invoices.new")


def test_binding_and_unbinding_need_a_binding_key_the_read_pattern_allows(account):
    account.limit(write=".*", read="^orders\\.")
    with account.connect() as conn:
        ch = conn.channel()
        queue = ch.queue_declare("q").method.queue
        ch.exchange_declare("copies", "fanout")
        ch.queue_bind(queue, "events", "orders.#")
        ch.queue_unbind(queue, "events", "orders.#")
        assert channel_error(lambda: ch.queue_bind(queue, "events", "#")) == account.refusal("#")
        ch = fresh(ch)
        assert channel_error(lambda: ch.queue_unbind(queue, "events", "invoices.#")) == account.refusal("invoices.#")
        ch = fresh(ch)
        assert channel_error(lambda: ch.exchange_bind("copies", "events", "invoices.#")) == account.refusal(
            "invoices.#")


def test_only_topic_exchanges_with_a_topic_permission_are_limited(account):
    account.limit(exchange="events", write="^$", read="^$")
    account.limit(exchange="plain", write="^$", read="^$")  # (a direct exchange: never checked)
    with account.connect() as conn:
        ch = conn.channel()
        ch.exchange_declare("other", "topic")
        queue = ch.queue_declare("", exclusive=True).method.queue
        published(ch, "plain", "anything")
        ch.queue_bind(queue, "plain", "anything")
        published(ch, "other", "anything")  # (a topic exchange the user has no topic permission on)
        ch.queue_bind(queue, "other", "anything")


def test_an_empty_pattern_allows_only_the_empty_key(account):
    account.limit(write="", read="")
    with account.connect() as conn:
        ch = conn.channel()
        published(ch, "events", "")
        ch.queue_bind(ch.queue_declare("", exclusive=True).method.queue, "events", "")
        assert channel_error(lambda: published(ch, "events", "a")) == account.refusal("a")


def test_username_and_vhost_in_a_pattern_stand_for_the_clients(account):
    account.limit(write="^{vhost}\\.{username}\\.", read="^{username}$")
    with account.connect() as conn:
        ch = conn.channel()
        published(ch, "events", f"{account.vhost}.{account.user}.hello")
        ch.queue_bind(ch.queue_declare("", exclusive=True).method.queue, "events", account.user)
        assert channel_error(lambda: published(ch, "events", f"{account.vhost}.someone.hello")) == \
            account.refusal(f"{account.vhost}.someone.hello")


@beyond_rabbitmq  # (RabbitMQ puts the name in as it is: a user called "a.*" would match "abc")
def test_a_name_put_in_a_pattern_matches_only_itself(broker, account):
    user = f"dotted.{account.user}"
    management.add_user(broker, user, "secret")
    management.set_permissions(broker, account.vhost, user)
    try:
        reply = request(broker, "PUT", f"/api/topic-permissions/{quote(account.vhost)}/{quote(user)}",
                        {"exchange": "events", "write": "^{username}$", "read": ".*"})
        assert reply.status == 201
        with pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port, account.vhost,
                                                               pika.PlainCredentials(user, "secret"))) as conn:
            ch = conn.channel()
            published(ch, "events", user)
            lookalike = user.replace(".", "x", 1)
            code, _ = channel_error(lambda: published(ch, "events", lookalike))
            assert code == 403
    finally:
        management.delete_user(broker, user)


@rabbitmq4  # (3.x checked the routing key alone, so that a CC header could reach keys the user may not publish to)
def test_the_cc_and_bcc_keys_of_a_publish_are_checked_too(account):
    account.limit(write="^orders\\.")
    with account.connect() as conn:
        ch = conn.channel()
        published(ch, "events", "orders.new", {"CC": ["orders.copy"]})
        assert channel_error(lambda: published(ch, "events", "orders.new", {"CC": ["invoices.copy"]})) == \
            account.refusal("invoices.copy")
        ch = fresh(ch)
        assert channel_error(lambda: published(ch, "events", "orders.new", {"BCC": ["audit"]})) == \
            account.refusal("audit")


def test_a_change_applies_to_an_open_channel_at_once(account):
    """What the channel has not used yet follows the change at once (RabbitMQ remembers only the checks that
    passed, per channel)."""
    with account.connect() as conn:
        ch = conn.channel()
        published(ch, "events", "orders.new")
        account.limit(write="^invoices\\.")
        published(ch, "events", "invoices.new")
        assert channel_error(lambda: published(ch, "events", "audit.new")) == account.refusal("audit.new")


@beyond_rabbitmq  # (RabbitMQ keeps the decisions a channel made until it closes)
def test_revoking_applies_to_a_key_the_channel_already_published_with(account):
    with account.connect() as conn:
        ch = conn.channel()
        published(ch, "events", "orders.new")
        account.limit(write="^invoices\\.")
        assert channel_error(lambda: published(ch, "events", "orders.new")) == account.refusal("orders.new")
        ch = fresh(ch)
        assert request(account.broker, "DELETE", account.path).status == 204
        published(ch, "events", "orders.new")


def test_a_publish_through_the_api_is_checked_as_a_clients(account):
    account.limit(write="^orders\\.")
    reply = request(account.broker, "POST", f"/api/exchanges/{quote(account.vhost)}/events/publish",
                    {"properties": {}, "routing_key": "invoices.new", "payload": "p", "payload_encoding": "string"},
                    user=account.user, password="secret")
    assert reply.status == 400
    assert reply.body["reason"] == "403 " + account.refusal("invoices.new")[1]


# --- the management API ----------------------------------------------------------------------------------------
def by_exchange(items: list[dict]) -> list[dict]:
    """A listing in the order of its exchanges (RabbitMQ's own order is its tables', Warren's sorted)."""
    return sorted(items, key=lambda item: item["exchange"])


def test_the_api_sets_lists_and_clears_topic_permissions_in_rabbitmqs_shape(broker, account):
    assert request(broker, "GET", account.path).status == 404  # (none yet)
    assert account.limit(exchange="events", write="^a", read="^b") == 201
    assert account.limit(exchange="amq.topic", write="^c", read="") == 204  # (the user had one in the vhost)
    events = {"user": account.user, "vhost": account.vhost, "exchange": "events", "write": "^a", "read": "^b"}
    topic = {"user": account.user, "vhost": account.vhost, "exchange": "amq.topic", "write": "^c", "read": ""}
    for path in (account.path, f"/api/users/{quote(account.user)}/topic-permissions",
                 f"/api/vhosts/{quote(account.vhost)}/topic-permissions", "/api/topic-permissions"):
        listed = [item for item in request(broker, "GET", path).body if item["user"] == account.user]
        assert by_exchange(listed) == [topic, events], path
    assert request(broker, "DELETE", account.path).status == 204
    assert request(broker, "GET", account.path).status == 404
    assert request(broker, "DELETE", account.path).status == 404


@beyond_rabbitmq  # (RabbitMQ's API clears them all whatever the query; rabbitmqctl can name the exchange)
def test_the_api_clears_the_topic_permission_of_one_exchange(broker, account):
    account.limit(exchange="events")
    account.limit(exchange="amq.topic")
    assert request(broker, "DELETE", account.path + "?exchange=events").status == 204
    assert [item["exchange"] for item in request(broker, "GET", account.path).body] == ["amq.topic"]
    assert request(broker, "DELETE", account.path + "?exchange=events").status == 404


def test_the_api_refuses_what_cannot_be_a_topic_permission(broker, account):
    missing = request(broker, "PUT", account.path, {"exchange": "events", "write": ".*"})
    assert (missing.status, missing.body["reason"]) == (400, "[{key_missing,read}]")
    assert request(broker, "PUT", account.path, {"exchange": "events", "write": "(", "read": ""}).status == 400
    nobody = request(broker, "PUT", f"/api/topic-permissions/{quote(account.vhost)}/nobody-{account.user}",
                     {"exchange": "events", "write": ".*", "read": ".*"})
    assert (nobody.status, nobody.body["reason"]) == (400, "vhost_or_user_not_found")
    refused = request(broker, "PUT", account.path, {"exchange": "events", "write": ".*", "read": ".*"},
                      user=account.user, password="secret")
    assert refused.status == 401  # (administrators only)


def test_deleting_the_user_drops_its_topic_permissions(broker, account):
    account.limit()
    management.delete_user(broker, account.user)
    assert request(broker, "GET", f"/api/vhosts/{quote(account.vhost)}/topic-permissions").body == []
    management.add_user(broker, account.user, "secret")
    assert request(broker, "GET", account.path).status == 404
