"""Access control: a user's configure/write/read permissions in a vhost, checked on every AMQP method as RabbitMQ
checks them, refused with 403 ACCESS_REFUSED and RabbitMQ's texts; connection.open to a vhost the user has no
permissions in is 530. Users, vhosts and permissions are set up through the management API (tests/integration/
management.py), each test with a vhost and a user of its own."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration import management
from tests.integration.helpers import channel_error, connection_error, fresh, get, wait_until

EVERYTHING = ".*"
NOTHING = ""  # an empty pattern grants nothing


@dataclass
class Account:
    """A user with a vhost of its own, in which guest (the administrator) may do everything."""

    broker: Any
    vhost: str
    user: str
    password: str

    def grant(self, configure: str = NOTHING, write: str = NOTHING, read: str = NOTHING) -> None:
        management.set_permissions(self.broker, self.vhost, self.user, configure, write, read)

    def connect(self, user: str | None = None, password: str | None = None) -> pika.BlockingConnection:
        credentials = pika.PlainCredentials(user or self.user, password or self.password)
        return pika.BlockingConnection(pika.ConnectionParameters(self.broker.host, self.broker.port, self.vhost,
                                                                 credentials))

    def admin(self) -> pika.BlockingConnection:
        """A guest connection to the vhost, to set up what the user is then refused or allowed."""
        return self.connect("guest", "guest")

    def refusal(self, kind: str, name: str) -> tuple[int, str]:
        return 403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user}'"


@pytest.fixture
def account(broker) -> Iterator[Account]:
    tag = secrets.token_hex(4)  # short names, so that refusal texts stay under a shortstr's 255 bytes
    vhost, user = f"acl-vhost-{tag}", f"acl-user-{tag}"
    management.add_vhost(broker, vhost)
    management.add_user(broker, user, "secret")
    management.set_permissions(broker, vhost, "guest")
    try:
        yield Account(broker, vhost, user, "secret")
    finally:
        management.delete_user(broker, user)
        management.delete_vhost(broker, vhost)


@pytest.fixture
def setup(account) -> Iterator[BlockingChannel]:
    """A guest channel in the account's vhost with queue q, exchanges x (q bound to it with key k) and x2."""
    with account.admin() as conn:
        ch = conn.channel()
        ch.queue_declare("q")
        ch.exchange_declare("x", "direct")
        ch.exchange_declare("x2", "fanout")
        ch.queue_bind("q", "x", "k")
        ch.exchange_bind("x2", "x", "k")
        yield ch


def refused(account: Account, action: Callable[[BlockingChannel], object], asynchronous: bool = False) -> tuple:
    """The (code, text) the user's channel is closed with when it runs action."""
    with account.connect() as conn:
        ch = conn.channel()
        return channel_error(lambda: action(ch), ch if asynchronous else None)


# (test id, (configure, write, read) granted, what the user does, kind and name of the resource refused)
REFUSALS = [
    ("exchange.declare", (NOTHING, EVERYTHING, EVERYTHING),
     lambda ch: ch.exchange_declare("new-x", "direct"), "exchange", "new-x"),
    ("exchange.declare of an existing one", (NOTHING, EVERYTHING, EVERYTHING),
     lambda ch: ch.exchange_declare("x", "direct"), "exchange", "x"),
    ("exchange.delete", (NOTHING, EVERYTHING, EVERYTHING), lambda ch: ch.exchange_delete("x"), "exchange", "x"),
    ("exchange.delete of a missing one", (NOTHING, EVERYTHING, EVERYTHING),
     lambda ch: ch.exchange_delete("missing"), "exchange", "missing"),
    ("queue.declare", (NOTHING, EVERYTHING, EVERYTHING), lambda ch: ch.queue_declare("new-q"), "queue", "new-q"),
    ("queue.declare of an existing one", (NOTHING, EVERYTHING, EVERYTHING),
     lambda ch: ch.queue_declare("q"), "queue", "q"),
    ("queue.delete", (NOTHING, EVERYTHING, EVERYTHING), lambda ch: ch.queue_delete("q"), "queue", "q"),
    ("queue.delete of a missing one", (NOTHING, EVERYTHING, EVERYTHING),
     lambda ch: ch.queue_delete("missing"), "queue", "missing"),
    ("queue.bind without write on the queue", (EVERYTHING, NOTHING, EVERYTHING),
     lambda ch: ch.queue_bind("q", "x", "k2"), "queue", "q"),
    ("queue.bind without read on the exchange", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.queue_bind("q", "x", "k2"), "exchange", "x"),
    ("queue.bind with neither: write is checked first", (EVERYTHING, NOTHING, NOTHING),
     lambda ch: ch.queue_bind("q", "x", "k2"), "queue", "q"),
    ("queue.bind to a missing exchange", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.queue_bind("q", "missing", "k2"), "exchange", "missing"),
    ("queue.bind of a missing queue", (EVERYTHING, NOTHING, EVERYTHING),
     lambda ch: ch.queue_bind("missing", "x", "k2"), "queue", "missing"),
    ("queue.unbind without write on the queue", (EVERYTHING, NOTHING, EVERYTHING),
     lambda ch: ch.queue_unbind("q", "x", "k"), "queue", "q"),
    ("queue.unbind without read on the exchange", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.queue_unbind("q", "x", "k"), "exchange", "x"),
    ("exchange.bind without write on the destination", (EVERYTHING, "^x$", EVERYTHING),
     lambda ch: ch.exchange_bind("x2", "x", "k2"), "exchange", "x2"),
    ("exchange.bind without read on the source", (EVERYTHING, EVERYTHING, "^x2$"),
     lambda ch: ch.exchange_bind("x2", "x", "k2"), "exchange", "x"),
    ("exchange.unbind without write on the destination", (EVERYTHING, "^x$", EVERYTHING),
     lambda ch: ch.exchange_unbind("x2", "x", "k"), "exchange", "x2"),
    ("exchange.unbind without read on the source", (EVERYTHING, EVERYTHING, "^x2$"),
     lambda ch: ch.exchange_unbind("x2", "x", "k"), "exchange", "x"),
    ("queue.purge", (EVERYTHING, EVERYTHING, NOTHING), lambda ch: ch.queue_purge("q"), "queue", "q"),
    ("basic.get", (EVERYTHING, EVERYTHING, NOTHING), lambda ch: ch.basic_get("q"), "queue", "q"),
    ("basic.get from a missing queue", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.basic_get("missing"), "queue", "missing"),
    ("basic.consume", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.basic_consume("q", lambda *args: None), "queue", "q"),
    ("queue.declare with a dead-letter exchange needs read on the queue", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.queue_declare("dl-q", arguments={"x-dead-letter-exchange": "x"}), "queue", "dl-q"),
    ("queue.declare with a dead-letter exchange needs write on it", (EVERYTHING, "^dl-q$", EVERYTHING),
     lambda ch: ch.queue_declare("dl-q", arguments={"x-dead-letter-exchange": "x"}), "exchange", "x"),
    ("the default exchange as dead-letter exchange", (EVERYTHING, "^dl-q$", EVERYTHING),
     lambda ch: ch.queue_declare("dl-q", arguments={"x-dead-letter-exchange": ""}), "exchange", "amq.default"),
    ("exchange.declare with an alternate exchange needs read on the exchange", (EVERYTHING, EVERYTHING, NOTHING),
     lambda ch: ch.exchange_declare("ae-x", "direct", arguments={"alternate-exchange": "x"}), "exchange", "ae-x"),
    ("exchange.declare with an alternate exchange needs write on it", (EVERYTHING, "^ae-x$", EVERYTHING),
     lambda ch: ch.exchange_declare("ae-x", "direct", arguments={"alternate-exchange": "x"}), "exchange", "x"),
]


@pytest.mark.parametrize("granted, action, kind, name", [case[1:] for case in REFUSALS],
                         ids=[case[0] for case in REFUSALS])
def test_a_method_without_its_permission_is_refused(account, setup, granted, action, kind, name):
    account.grant(*granted)
    assert refused(account, action) == account.refusal(kind, name)


# (test id, write pattern granted, exchange published to, name the refusal gives it)
PUBLISH_REFUSALS = [
    ("an exchange", "^x2$", "x", "x"),
    ("the default exchange, as amq.default", "^x$", "", "amq.default"),
    ("a missing exchange: permission is checked first", "^x$", "missing", "missing"),
]


@pytest.mark.parametrize("write, exchange, name", [case[1:] for case in PUBLISH_REFUSALS],
                         ids=[case[0] for case in PUBLISH_REFUSALS])
def test_publishing_needs_write_on_the_exchange(account, setup, write, exchange, name):
    account.grant(EVERYTHING, write, EVERYTHING)
    assert refused(account, lambda ch: ch.basic_publish(exchange, "k", b"m"), asynchronous=True) == \
        account.refusal("exchange", name)


def test_a_server_named_queue_needs_configure_on_its_generated_name(account, setup):
    account.grant("^q$", EVERYTHING, EVERYTHING)
    code, text = refused(account, lambda ch: ch.queue_declare("", exclusive=True))
    match = re.fullmatch(rf"ACCESS_REFUSED - access to queue '(amq\.gen-[\w-]{{22}})' in vhost "
                         rf"'{re.escape(account.vhost)}' refused for user '{re.escape(account.user)}'", text)
    assert code == 403 and match, text
    assert channel_error(lambda: setup.queue_declare(match.group(1), passive=True))[0] == 404


def test_a_server_named_queue_is_refused_before_its_arguments_are_checked(account, setup):
    account.grant("^q$", EVERYTHING, EVERYTHING)
    code, text = refused(account, lambda ch: ch.queue_declare("", exclusive=True,
                                                             arguments={"x-max-length": "not a number"}))
    assert code == 403 and text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-"), text


def test_passive_declares_need_no_permission(account, setup):
    account.grant(NOTHING, NOTHING, NOTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.exchange_declare("x", passive=True)
        assert ch.queue_declare("q", passive=True).method.queue == "q"
        assert channel_error(lambda: ch.queue_declare("missing", passive=True))[0] == 404


def test_reserved_names_and_permissions_are_checked_in_rabbitmqs_order(account, setup):
    """A queue's reserved prefix is refused before its permission, an exchange's after; the deletion of a system
    exchange and the default exchange in a binding before any permission."""
    account.grant(NOTHING, "^q$", EVERYTHING)
    assert refused(account, lambda ch: ch.queue_declare("amq.q")) == (
        403, "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'")
    assert refused(account, lambda ch: ch.exchange_declare("amq.x", "direct")) == account.refusal("exchange", "amq.x")
    assert refused(account, lambda ch: ch.exchange_delete("amq.direct")) == (
        403, f"ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '{account.vhost}' not allowed")
    assert refused(account, lambda ch: ch.queue_bind("q", "", "k")) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    account.grant(EVERYTHING, EVERYTHING, EVERYTHING)
    assert refused(account, lambda ch: ch.exchange_declare("amq.x", "direct")) == (
        403, "ACCESS_REFUSED - exchange name 'amq.x' contains reserved prefix 'amq.*'")
    assert refused(account, lambda ch: ch.queue_bind("missing", "", "k")) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_operations_within_the_permissions_pass(account, setup):
    """Patterns are searched anywhere in a name, as RabbitMQ's re:run does: 'app' matches 'my-app-q'."""
    account.grant("app", "app|^amq.default$", "app")
    with account.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("my-app-x", "direct", arguments={"alternate-exchange": "app-ae"})
        ch.queue_declare("my-app-q", arguments={"x-dead-letter-exchange": "app-dlx"})
        ch.queue_bind("my-app-q", "my-app-x", "k")
        ch.basic_publish("my-app-x", "k", b"routed")
        ch.basic_publish("", "my-app-q", b"direct")
        assert get(ch, "my-app-q").body == b"routed"
        ch.basic_consume("my-app-q", lambda *args: None, auto_ack=True)
        ch.queue_purge("my-app-q")
        ch.queue_unbind("my-app-q", "my-app-x", "k")
        ch.queue_delete("my-app-q")
        ch.exchange_delete("my-app-x")
        assert channel_error(lambda: ch.queue_declare("other")) == account.refusal("queue", "other")


def test_redeclaring_with_a_dead_letter_or_alternate_exchange_needs_configure_only(account, setup):
    """The DLX and alternate-exchange rules apply when the queue or exchange is created, not to a redeclare."""
    setup.queue_declare("dl-q", arguments={"x-dead-letter-exchange": "x"})
    setup.exchange_declare("ae-x", "direct", arguments={"alternate-exchange": "x"})
    account.grant(EVERYTHING, NOTHING, NOTHING)
    with account.connect() as conn:
        ch = conn.channel()
        assert ch.queue_declare("dl-q", arguments={"x-dead-letter-exchange": "x"}).method.queue == "dl-q"
        ch.exchange_declare("ae-x", "direct", arguments={"alternate-exchange": "x"})


def test_direct_reply_to_needs_no_read_permission(account, setup):
    account.grant(NOTHING, "^amq.default$", NOTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        replies = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, body: replies.append(body), auto_ack=True)
        ch.basic_publish("", "q", b"request", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        request = get(setup, "q")
        setup.basic_publish("", request.properties.reply_to, b"reply")
        wait_until(conn, lambda: replies == [b"reply"])


def test_a_vhost_the_user_has_no_permissions_in_is_refused_with_530(account):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as error:
        account.connect()
    assert (f"(530) \"NOT_ALLOWED - access to vhost '{account.vhost}' refused for user '{account.user}'\""
            in str(error.value))


def test_empty_patterns_still_let_the_user_open_the_vhost(account, setup):
    account.grant(NOTHING, NOTHING, NOTHING)
    with account.connect() as conn:
        ch = conn.channel()
        assert channel_error(lambda: ch.basic_get("q")) == account.refusal("queue", "q")


def test_a_permission_change_applies_to_an_open_channel(account, setup):
    """What the channel has not used yet follows the change at once (RabbitMQ remembers only the checks that
    passed, per channel)."""
    account.grant(EVERYTHING, "^x$", EVERYTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("x", "k", b"one")
        account.grant(EVERYTHING, "^(x|x2)$", EVERYTHING)
        ch.basic_publish("x2", "k", b"two")
        account.grant(EVERYTHING, "^x$", EVERYTHING)
        assert channel_error(lambda: ch.queue_bind("q", "x", "k3")) == account.refusal("queue", "q")
        ch = fresh(ch)
        ch.confirm_delivery()
        assert channel_error(lambda: ch.basic_publish("", "q", b"three")) == account.refusal("exchange", "amq.default")


def test_revoking_a_permission_applies_to_an_exchange_the_channel_already_published_to(broker, account, setup):
    """Warren drops a channel's remembered decisions whenever permissions change; RabbitMQ keeps them for the
    channel's life (its access-control guide: changes "may only take effect when the user reconnects")."""
    if broker.external:
        pytest.skip("RabbitMQ keeps the decisions a channel made until it closes")
    account.grant(EVERYTHING, "^x$", EVERYTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("x", "k", b"one")
        account.grant(EVERYTHING, NOTHING, EVERYTHING)
        assert channel_error(lambda: ch.basic_publish("x", "k", b"two")) == account.refusal("exchange", "x")


def test_cleared_permissions_refuse_the_open_connection(account, setup):
    account.grant(EVERYTHING, EVERYTHING, EVERYTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.queue_declare("q", passive=True)
        reply = management.request(account.broker, "DELETE",
                                   f"/api/permissions/{management.quote(account.vhost)}/{management.quote(account.user)}")
        assert reply.status == 204, reply
        assert channel_error(lambda: ch.basic_get("q")) == account.refusal("queue", "q")


def test_deleting_a_user_closes_its_connections(account, setup):
    account.grant(EVERYTHING, EVERYTHING, EVERYTHING)
    with account.connect() as conn:
        conn.channel()
        management.delete_user(account.broker, account.user)
        assert connection_error(lambda: wait_until(conn, lambda: conn.is_closed), conn) == (
            320, f"CONNECTION_FORCED - user '{account.user}' is deleted")


@pytest.mark.parametrize("tags, accepted", [("", False), ("impersonator", True)])
def test_only_an_impersonator_may_publish_another_users_user_id(account, setup, tags, accepted):
    management.add_user(account.broker, account.user, account.password, tags)
    account.grant(EVERYTHING, EVERYTHING, EVERYTHING)
    with account.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        publish = lambda: ch.basic_publish("", "q", b"m", pika.BasicProperties(user_id="someone-else"))
        if accepted:
            publish()
            assert get(setup, "q").properties.user_id == "someone-else"
        else:
            assert channel_error(publish) == (406, "PRECONDITION_FAILED - user_id property set to 'someone-else' "
                                                   f"but authenticated user was '{account.user}'")
