"""One door: the management API changes queues, exchanges and bindings, publishes and gets as the user through the
same operations as the AMQP methods, so both refuse the same things (RabbitMQ's API runs the AMQP method). Each rule
is tried through both doors, a pika channel and the API, each test in a vhost of its own with a user of its own;
then the API's refusals of values AMQP cannot carry, and its answers to bad numbers and names."""

from __future__ import annotations

import secrets
import struct
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from pamqp import commands

from tests.integration import management
from tests.integration.helpers import channel_error, connection_error, consume, get, sync
from tests.integration.management import quote, request
from tests.integration.rawclient import RawClient, raw_frame

EVERYTHING, NOTHING = ".*", ""
API_REFUSAL = (401, {"error": "not_authorised", "reason": "Access refused."})  # RabbitMQ's API's refused declare
LOCKED = ("cannot obtain exclusive access to locked queue '{queue}' in vhost '{vhost}'. It could be originally "
          "declared on another connection or the exclusive property value does not match that of the original "
          "declaration.")


@dataclass
class Account:
    """A management user with a vhost of its own, where guest may do everything."""

    broker: Any
    vhost: str
    user: str
    password: str = "secret"

    def grant(self, configure: str = EVERYTHING, write: str = EVERYTHING, read: str = EVERYTHING) -> None:
        management.set_permissions(self.broker, self.vhost, self.user, configure, write, read)

    def connect(self, as_guest: bool = False) -> pika.BlockingConnection:
        """A connection of the user's to the vhost, or of guest's to set up what the user then meets."""
        credentials = pika.PlainCredentials("guest", "guest") if as_guest else pika.PlainCredentials(self.user,
                                                                                                    self.password)
        return pika.BlockingConnection(pika.ConnectionParameters(self.broker.host, self.broker.port, self.vhost,
                                                                 credentials))

    def api(self, method: str, path: str, body: Any = None, **kwargs) -> management.Reply:
        """A request of the user's, path relative to the vhost's resources: "queues/NAME" is /api/queues/V/NAME."""
        kind, _, rest = path.partition("/")
        return request(self.broker, method, f"/api/{kind}/{quote(self.vhost)}/{rest}", body, user=self.user,
                       password=self.password, **kwargs)

    def refusal(self, kind: str, name: str) -> tuple[int, str]:
        return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user}'"


@pytest.fixture
def account(broker) -> Iterator[Account]:
    tag = secrets.token_hex(4)  # short names keep refusal texts under a short string's 255 bytes
    vhost, user = f"door-vhost-{tag}", f"door-user-{tag}"
    management.add_vhost(broker, vhost)
    management.add_user(broker, user, "secret", "management")
    try:
        with Account(broker, vhost, user).connect(as_guest=True) as conn:
            ch = conn.channel()
            ch.queue_declare("q")
            ch.exchange_declare("x", "direct")
            ch.queue_bind("q", "x", "k")
        yield Account(broker, vhost, user)
    finally:
        management.delete_user(broker, user)
        management.delete_vhost(broker, vhost)


def amqp_refusal(account: Account, action) -> tuple[int, str]:
    with account.connect() as conn:
        return channel_error(lambda: action(conn.channel()))


def queue_exists(account: Account, name: str) -> bool:
    return request(account.broker, "GET", f"/api/queues/{quote(account.vhost)}/{quote(name)}").status == 200


def exchange_exists(account: Account, name: str) -> bool:
    return request(account.broker, "GET", f"/api/exchanges/{quote(account.vhost)}/{quote(name)}").status == 200


# --- permissions: a dead-letter or alternate exchange needs write on it ---------------------------------------
@pytest.mark.parametrize("door", ["amqp", "api"])
def test_a_queue_that_dead_letters_needs_write_on_the_dead_letter_exchange(account, door):
    account.grant(write="^dl-q$")
    arguments = {"x-dead-letter-exchange": "x"}
    if door == "amqp":
        refused = amqp_refusal(account, lambda ch: ch.queue_declare("dl-q", arguments=arguments))
        assert refused == account.refusal("exchange", "x")
    else:
        assert account.api("PUT", "queues/dl-q", {"arguments": arguments}) == API_REFUSAL
    assert not queue_exists(account, "dl-q")


@pytest.mark.parametrize("door", ["amqp", "api"])
def test_a_queue_that_dead_letters_needs_read_on_itself(account, door):
    account.grant(read="^q$")
    arguments = {"x-dead-letter-exchange": "x"}
    if door == "amqp":
        refused = amqp_refusal(account, lambda ch: ch.queue_declare("dl-q", arguments=arguments))
        assert refused == account.refusal("queue", "dl-q")
    else:
        assert account.api("PUT", "queues/dl-q", {"arguments": arguments}) == API_REFUSAL
    assert not queue_exists(account, "dl-q")


@pytest.mark.parametrize("door", ["amqp", "api"])
def test_an_exchange_with_an_alternate_needs_write_on_the_alternate(account, door):
    account.grant(write="^ae-x$")
    arguments = {"alternate-exchange": "x"}
    if door == "amqp":
        refused = amqp_refusal(account, lambda ch: ch.exchange_declare("ae-x", "direct", arguments=arguments))
        assert refused == account.refusal("exchange", "x")
    else:
        assert account.api("PUT", "exchanges/ae-x", {"type": "direct", "arguments": arguments}) == API_REFUSAL
    assert not exchange_exists(account, "ae-x")


@pytest.mark.parametrize("door", ["amqp", "api"])
def test_with_write_on_the_dead_letter_and_alternate_exchanges_both_are_declared(account, door):
    account.grant()
    if door == "amqp":
        with account.connect() as conn:
            ch = conn.channel()
            ch.queue_declare("dl-q", arguments={"x-dead-letter-exchange": "x"})
            ch.exchange_declare("ae-x", "direct", arguments={"alternate-exchange": "x"})
    else:
        assert account.api("PUT", "queues/dl-q", {"arguments": {"x-dead-letter-exchange": "x"}}).status == 201
        assert account.api("PUT", "exchanges/ae-x", {"arguments": {"alternate-exchange": "x"}}).status == 201
    assert queue_exists(account, "dl-q") and exchange_exists(account, "ae-x")


# --- reserved names and the default exchange ------------------------------------------------------------------
@pytest.mark.parametrize("door", ["amqp", "api"])
def test_reserved_names_are_refused(account, door):
    account.grant()
    if door == "amqp":
        assert amqp_refusal(account, lambda ch: ch.queue_declare("amq.q")) == (
            403, "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'")
        assert amqp_refusal(account, lambda ch: ch.exchange_declare("amq.x", "direct")) == (
            403, "ACCESS_REFUSED - exchange name 'amq.x' contains reserved prefix 'amq.*'")
        assert amqp_refusal(account, lambda ch: ch.exchange_delete("amq.direct"))[0] == 403
    else:
        assert account.api("PUT", "queues/amq.q", {}) == API_REFUSAL
        assert account.api("PUT", "exchanges/amq.x", {"type": "direct"}) == API_REFUSAL
        assert account.api("DELETE", "exchanges/amq.direct") == API_REFUSAL
    assert not queue_exists(account, "amq.q") and not exchange_exists(account, "amq.x")
    assert exchange_exists(account, "amq.direct")


@pytest.mark.parametrize("door", ["amqp", "api"])
def test_the_default_exchange_takes_no_binding(account, door):
    account.grant()
    if door == "amqp":
        assert amqp_refusal(account, lambda ch: ch.queue_bind("q", "", "k")) == (
            403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    else:
        assert account.api("POST", "bindings/e/amq.default/q/q", {"routing_key": "k"}) == API_REFUSAL


# --- another connection's exclusive queue ---------------------------------------------------------------------
EXCLUSIVE_ACTIONS = {  # what the user tries on the exclusive queue "exq": through AMQP, then through the API
    "delete": (lambda ch: ch.queue_delete("exq"), ("DELETE", "queues/exq", None)),
    "purge": (lambda ch: ch.queue_purge("exq"), ("DELETE", "queues/exq/contents", None)),
    "bind": (lambda ch: ch.queue_bind("exq", "x", "k2"), ("POST", "bindings/e/x/q/exq", {"routing_key": "k2"})),
}


@pytest.mark.parametrize("door", ["amqp", "api"])
@pytest.mark.parametrize("action", list(EXCLUSIVE_ACTIONS))
def test_another_connections_exclusive_queue_is_locked(account, door, action):
    account.grant()
    amqp_action, (method, path, body) = EXCLUSIVE_ACTIONS[action]
    with account.connect(as_guest=True) as owner:
        owner_channel = owner.channel()
        owner_channel.queue_declare("exq", exclusive=True)
        owner_channel.basic_publish("", "exq", b"kept")
        locked = LOCKED.format(queue="exq", vhost=account.vhost)
        if door == "amqp":
            assert amqp_refusal(account, amqp_action) == (405, f"RESOURCE_LOCKED - {locked}")
        else:
            assert account.api(method, path, body) == (400, {"error": "bad_request", "reason": locked})
        assert owner_channel.queue_declare("exq", passive=True).method.message_count == 1
        bindings = request(account.broker, "GET", f"/api/queues/{quote(account.vhost)}/exq/bindings").body
        assert [binding["source"] for binding in bindings] == [""]


# --- if-unused and if-empty -----------------------------------------------------------------------------------
@pytest.mark.parametrize("door", ["amqp", "api"])
def test_if_empty_and_if_unused_keep_the_queue(account, door):
    account.grant()
    with account.connect(as_guest=True) as conn:
        ch = conn.channel()
        ch.basic_publish("", "q", b"m")
        sync(ch)
        if door == "amqp":
            assert amqp_refusal(account, lambda user_ch: user_ch.queue_delete("q", if_empty=True)) == (
                406, f"PRECONDITION_FAILED - queue 'q' in vhost '{account.vhost}' not empty")
        else:
            assert account.api("DELETE", "queues/q?if-empty=true") == (
                400, {"error": "bad_request", "reason": f"queue 'q' in vhost '{account.vhost}' not empty"})
        consume(ch, "q")
        if door == "amqp":
            assert amqp_refusal(account, lambda user_ch: user_ch.queue_delete("q", if_unused=True)) == (
                406, f"PRECONDITION_FAILED - queue 'q' in vhost '{account.vhost}' in use")
        else:
            assert account.api("DELETE", "queues/q?if-unused=true") == (
                400, {"error": "bad_request", "reason": f"queue 'q' in vhost '{account.vhost}' in use"})
    assert queue_exists(account, "q")


# --- what AMQP cannot carry -----------------------------------------------------------------------------------
LONG_NAME = "n" * 300


def test_a_queue_name_over_255_bytes_is_refused(account):
    account.grant()
    reply = account.api("PUT", f"queues/{LONG_NAME}", {})
    # RabbitMQ's reason ends in a newline
    assert (reply.status, reply.body["reason"].strip()) == (400, "queue should be less than 255 bytes, actually was 300")


def test_an_exchange_name_over_255_bytes_is_refused(broker, account):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ declares such an exchange, which no AMQP client can then name")
    account.grant()
    assert account.api("PUT", f"exchanges/{LONG_NAME}", {"type": "direct"}) == (
        400, {"error": "bad_request", "reason": "exchange should be less than 255 bytes, actually was 300"})
    assert not exchange_exists(account, LONG_NAME)


def test_a_publish_with_a_routing_key_over_255_bytes_is_refused_and_blocks_nothing(broker, account):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ queues such a message, which it then cannot deliver over AMQP")
    account.grant()
    with account.connect() as conn:
        ch = conn.channel()
        ch.queue_bind("q", "amq.topic", "#")
        message = {"properties": {}, "payload": "x", "payload_encoding": "string"}
        assert account.api("POST", "exchanges/amq.topic/publish", {**message, "routing_key": "r" * 256}) == (
            400, {"error": "bad_request",
                  "reason": "406 PRECONDITION_FAILED - routing_key should be less than 255 bytes, actually was 256"})
        assert account.api("POST", "exchanges/amq.topic/publish", {**message, "routing_key": "r" * 255}) == (
            200, {"routed": True})
        received = get(ch, "q")
        assert received is not None and received.routing_key == "r" * 255


@pytest.mark.parametrize("name", ["message_id", "correlation_id", "type", "app_id"])
def test_a_short_string_property_over_255_bytes_is_refused(broker, account, name):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ queues such a message, which it then cannot deliver over AMQP")
    account.grant()
    body = {"properties": {name: "é" * 128}, "routing_key": "q", "payload": "x", "payload_encoding": "string"}
    assert account.api("POST", "exchanges/amq.default/publish", body) == (
        400, {"error": "bad_request", "reason": f"{name} should be less than 255 bytes, actually was 256"})
    assert request(broker, "GET", f"/api/queues/{quote(account.vhost)}/q").body["messages_ready"] == 0


def nested(depth: int) -> dict:
    table: dict = {"leaf": 1}
    for _ in range(depth - 1):
        table = {"a": table}
    return table


@pytest.mark.parametrize("kind", ["queues", "exchanges"])
def test_arguments_nested_deeper_than_amqp_takes_them_are_refused(broker, account, kind):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ takes tables of any depth; Warren's AMQP decoder takes 100 levels")
    account.grant()
    assert account.api("PUT", f"{kind}/deep", {"arguments": {"x-deep": nested(900)}}) == (
        400, {"error": "bad_request", "reason": "field tables and arrays nested deeper than 100 levels"})
    assert account.api("PUT", f"{kind}/deep", {"arguments": {"x-deep": nested(99)}}).status == 201


def test_a_vhost_name_over_255_bytes_is_refused(broker):
    if broker.external:
        pytest.skip("Warren's refusal: RabbitMQ creates such a vhost, which connection.open cannot name")
    assert request(broker, "PUT", f"/api/vhosts/{'v' * 300}") == (
        400, {"error": "bad_request", "reason": "vhost should be less than 255 bytes, actually was 300"})
    assert request(broker, "GET", f"/api/vhosts/{'v' * 300}").status == 404


def test_a_close_reason_over_255_bytes_is_cut_as_rabbitmq_cuts_it(broker, account):
    name = f"long-reason-{account.user}"
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.port, account.vhost, pika.PlainCredentials("guest", "guest"),
        client_properties={"connection_name": name}))
    listed = management.wait_for(broker, "/api/connections",
                                 lambda body: any(c.get("user_provided_name") == name for c in body))
    path = "/api/connections/" + urllib.parse.quote(next(c["name"] for c in listed
                                                         if c.get("user_provided_name") == name), safe="")
    code, text = connection_error(
        lambda: request(broker, "DELETE", path, headers={"X-Reason": "a" * 300}).status, conn)
    assert (code, text) == (320, "CONNECTION_FORCED - " + "a" * 232 + "...")


# --- the API's get --------------------------------------------------------------------------------------------
def undecodable_message(broker, vhost: str, queue: str) -> None:
    """Publish to queue a message whose timestamp no datetime holds: its properties do not decode."""
    with RawClient.connect(broker) as client:
        client.handshake(vhost=vhost)
        client.open_channel(1)
        client.send(1, commands.Confirm.Select())
        client.expect(commands.Confirm.SelectOk)
        properties = struct.pack(">HHQH", 60, 0, 1, 0x0040) + b"\xff" * 8  # flags: the timestamp alone
        client.send(1, commands.Basic.Publish(exchange="", routing_key=queue))
        client.send_raw(raw_frame(2, 1, properties) + raw_frame(3, 1, b"x"))
        client.expect(commands.Basic.Ack)


def test_a_get_puts_back_a_message_whose_properties_do_not_decode(broker, account):
    if broker.external:
        pytest.skip("Warren only: RabbitMQ's timestamps are plain integers, so any it takes decodes again")
    undecodable_message(broker, account.vhost, "q")
    account.grant()
    reply = account.api("POST", "queues/q/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert reply == (500, {"error": "internal_error",
                           "reason": "INTERNAL_ERROR: the properties of message 1 could not be decoded; the "
                                     "messages taken are back in the queue"})
    assert request(broker, "GET", f"/api/queues/{quote(account.vhost)}/q").body["messages_ready"] == 1
    with account.connect() as conn:
        received = get(conn.channel(), "q")
        assert received is not None and received.body == b"x"


def test_an_ackmode_that_is_not_a_string_is_a_400(broker, account):
    if broker.external:
        pytest.skip("RabbitMQ answers 500: its handler crashes on the list")
    account.grant()
    reply = account.api("POST", "queues/q/get", {"count": 1, "ackmode": [], "encoding": "auto"})
    assert reply.status == 400 and reply.body["error"] == "bad_request"


# --- the aliveness test ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("granted, refused", [
    ((NOTHING, EVERYTHING, EVERYTHING), ("queue", "aliveness-test")),
    ((EVERYTHING, "^x$", EVERYTHING), ("exchange", "amq.default")),
    ((EVERYTHING, EVERYTHING, "^q$"), ("queue", "aliveness-test")),
])
def test_the_aliveness_test_acts_as_the_user(broker, account, granted, refused):
    with account.connect(as_guest=True) as conn:
        ch = conn.channel()
        ch.queue_declare("aliveness-test")
        ch.basic_publish("", "aliveness-test", b"someone else's")
        sync(ch)
        account.grant(*granted)
        reply = request(broker, "GET", f"/api/aliveness-test/{quote(account.vhost)}", user=account.user,
                        password=account.password)
        assert reply == (401, {"error": "not_authorised", "reason": account.refusal(*refused)[1]})
        first = get(ch, "aliveness-test")
        assert first is not None and first.body == b"someone else's"


def test_the_aliveness_test_passes_with_the_permissions_it_needs(broker, account):
    account.grant("^aliveness-test$", "^amq.default$", "^aliveness-test$")
    assert request(broker, "GET", f"/api/aliveness-test/{quote(account.vhost)}", user=account.user,
                   password=account.password) == (200, {"status": "ok"})


# --- health checks' numbers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("within", ["١٢", "²", "abc"])
def test_a_certificate_expiration_period_that_is_not_a_number_is_a_400(broker, within):
    path = f"/api/health/checks/certificate-expiration/{urllib.parse.quote(within)}/days"
    assert request(broker, "GET", path) == (400, {"error": "bad_request", "reason": "Invalid expiration value."})


def test_a_huge_certificate_expiration_period_is_answered(broker):
    assert request(broker, "GET", f"/api/health/checks/certificate-expiration/{'9' * 30}/years") == (
        200, {"status": "ok"})


@pytest.mark.parametrize("port", ["١٢", "²", "abc"])
def test_a_port_that_is_not_a_number_is_a_400(broker, port):
    path = f"/api/health/checks/port-listener/{urllib.parse.quote(port)}"
    assert request(broker, "GET", path) == (400, {"error": "bad_request", "reason": "Invalid port"})


def test_a_huge_port_is_not_listened_on(broker):
    reply = request(broker, "GET", f"/api/health/checks/port-listener/{'9' * 30}")
    assert reply.status == 503 and reply.body["missing"] == int("9" * 30)
