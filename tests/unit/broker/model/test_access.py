"""Users, password hashes, permissions and the checks built on them (broker.model.access), and the vhost a
connection.open may use (broker.model.node). Expected hashes were made by RabbitMQ 3.10 itself (GET /api/users and
rabbitmqctl eval 'rabbit_password:hash(rabbit_password_hashing_sha512, <<"s3cret">>)'), expected texts are
RabbitMQ's."""

import base64
import re

import pytest

from broker.model.access import (
    PUBLISH_CACHE_SIZE, TOPIC_CACHE_SIZE, ChannelAccess, Permission, TopicPermission, User, check_resource,
    hash_password, valid_password_hash,
)
from broker.model.exchange import DirectExchange, TopicExchange
from broker.model.patterns import PatternError
from broker.model.node import Node
from protocol.errors import AMQPError

SHA256 = "rabbit_password_hashing_sha256"
# (password, RabbitMQ's hash of it, the hashing module)
RABBITMQ_HASHES = [
    ("guest", "d8Qh3GKGixZzBNz6FBFShCvvYR4TDqQI4tw5cC9e9/6tAUV3", SHA256),
    ("pw", "p0GYldHlmY3AsUBc8bufxaOeEHMfVg/cGOTDJL5RbXeCe4GT", SHA256),
    ("pässwörd ✓", "4xp2OlqUxriOr4OQ+e1DK18jTs8WLhd+v09MEQUghudTXskm", SHA256),
    ("s3cret", "UfwIl6xcWrLzVjiLdNIp4zurXwtvo7783631BLdWgY7fAdxPZ7EWssVTO895G6a5n/Yb/2lSTqAYPVSzDDctj/Cv/YI=",
     "rabbit_password_hashing_sha512"),
    ("s3cret", "/vMGZzl3IyX0isrqrky6Z4tKJHY=", "rabbit_password_hashing_md5"),
]


@pytest.mark.parametrize("password, password_hash, algorithm", RABBITMQ_HASHES)
def test_a_hash_made_by_rabbitmq_verifies_its_password_only(password, password_hash, algorithm):
    user = User("u", password_hash, algorithm)
    assert valid_password_hash(password_hash, algorithm)
    assert user.check_password(password)
    assert not user.check_password(password + "x")
    assert not user.check_password("")


@pytest.mark.parametrize("password, password_hash, algorithm", RABBITMQ_HASHES)
def test_hashing_with_rabbitmqs_salt_gives_rabbitmqs_hash(password, password_hash, algorithm):
    salt = base64.b64decode(password_hash)[:4]
    assert hash_password(password, algorithm, salt) == password_hash


def test_each_hash_has_a_new_salt():
    first, second = hash_password("same"), hash_password("same")
    assert first != second
    assert User("u", first).check_password("same") and User("u", second).check_password("same")


@pytest.mark.parametrize("password_hash, algorithm", [
    ("not base64!", SHA256),
    (base64.b64encode(b"\0" * 20).decode(), SHA256),  # too short for a salt and a SHA-256 digest
    ("d8Qh3GKGixZzBNz6FBFShCvvYR4TDqQI4tw5cC9e9/6tAUV3", "rabbit_password_hashing_sha512"),  # the wrong size
])
def test_an_unusable_hash_is_refused(password_hash, algorithm):
    assert not valid_password_hash(password_hash, algorithm)
    with pytest.raises(ValueError):
        Node().put_user("u", password_hash=password_hash, hashing_algorithm=algorithm)


def test_a_user_without_a_password_cannot_log_in_with_one():
    node = Node()
    node.put_user("nopass", tags=["monitoring"])
    assert node.authenticate("nopass", "") is None
    assert node.authenticate("nopass", "anything") is None


def test_a_user_imported_with_a_rabbitmq_hash_logs_in_and_keeps_its_tags():
    node = Node()
    node.put_user("guest", password_hash=RABBITMQ_HASHES[0][1], tags=["administrator", "policymaker"])
    user = node.authenticate("guest", "guest")
    assert user is not None and node.authenticate("guest", "wrong") is None
    assert user.definition() == {"name": "guest", "password_hash": RABBITMQ_HASHES[0][1],
                                 "hashing_algorithm": SHA256, "tags": ["administrator", "policymaker"],
                                 "limits": {}}


def test_changing_tags_alone_keeps_the_password():
    node = Node()
    node.put_user("u", "secret")
    node.put_user("u", tags=["management"])
    assert node.authenticate("u", "secret").tags == ["management"]


# --- permissions -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern, name, allowed", [
    (".*", "anything", True),
    ("", "anything", False),  # an empty pattern grants nothing
    ("", "", False),
    ("app", "my-app-queue", True),  # searched anywhere in the name, as RabbitMQ's re:run
    ("^app", "my-app-queue", False),
    ("^app-.*$", "app-q", True),
    ("^(a|b)$", "ab", False),
    ("^amq\\.default$", "amq.default", True),
])
def test_a_pattern_grants_the_names_it_matches(pattern, name, allowed):
    permission = Permission("u", "/", pattern, pattern, pattern)
    assert [permission.allows(access, name) for access in ("configure", "write", "read")] == [allowed] * 3


def test_each_access_kind_has_its_own_pattern():
    permission = Permission("u", "/", "^c$", "^w$", "^r$")
    assert [permission.allows("configure", "c"), permission.allows("write", "c"), permission.allows("read", "c"),
            permission.allows("write", "w"), permission.allows("read", "r")] == [True, False, False, True, True]


def refusal(action) -> tuple[int, str]:
    with pytest.raises(AMQPError) as error:
        action()
    return error.value.reply_code, error.value.text


@pytest.mark.parametrize("permission", [None, Permission("bob", "v", "", "", "")])
def test_a_refusal_names_the_resource_vhost_and_user(permission):
    assert refusal(lambda: check_resource(permission, "bob", "v", "queue", "q", "read")) == (
        403, "ACCESS_REFUSED - access to queue 'q' in vhost 'v' refused for user 'bob'")


def test_the_default_exchange_is_checked_and_named_as_amq_default():
    check_resource(Permission("bob", "/", "", "^amq\\.default$", ""), "bob", "/", "exchange", "", "write")
    assert refusal(lambda: check_resource(Permission("bob", "/", "", "^$", ""), "bob", "/", "exchange", "",
                                          "write")) == (
        403, "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'bob'")


# --- a channel's checks ------------------------------------------------------------------------------------------
@pytest.fixture
def node():
    node = Node()
    node.add_vhost("v")
    node.put_user("bob", "pw")
    node.set_permissions("bob", "v", ".*", "^x$", ".*")
    return node


def test_a_channel_remembers_the_exchanges_it_may_publish_to(node):
    access = ChannelAccess(node, "bob", "v")
    access.check_publish("x")
    assert access.writable == {"x"} and access.version == node.permissions_version
    assert refusal(lambda: access.check_publish("y")) == (
        403, "ACCESS_REFUSED - access to exchange 'y' in vhost 'v' refused for user 'bob'")
    assert access.writable == {"x"}  # a refusal is not remembered


def test_a_permission_change_drops_what_a_channel_remembers(node):
    access = ChannelAccess(node, "bob", "v")
    access.check_publish("x")
    node.set_permissions("bob", "v", ".*", "^y$", ".*")
    assert access.version != node.permissions_version  # what publish compares before skipping the check
    assert refusal(lambda: access.check_publish("x"))[0] == 403
    access.check_publish("y")
    assert access.writable == {"y"}


def test_cleared_permissions_refuse_everything(node):
    access = ChannelAccess(node, "bob", "v")
    access.check("configure", "queue", "q")
    node.clear_permissions("bob", "v")
    assert refusal(lambda: access.check("configure", "queue", "q")) == (
        403, "ACCESS_REFUSED - access to queue 'q' in vhost 'v' refused for user 'bob'")


def test_what_a_channel_remembers_is_bounded(node):
    node.set_permissions("bob", "v", ".*", ".*", ".*")
    access = ChannelAccess(node, "bob", "v")
    for index in range(PUBLISH_CACHE_SIZE * 3):
        access.check_publish(f"x{index}")
    assert 0 < len(access.writable) <= PUBLISH_CACHE_SIZE


# --- topic permissions -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern, key, variables, allowed", [
    ("^a\\.", "a.b", {}, True),
    ("^a\\.", "b.a.", {}, False),
    ("", "", {}, True),  # an empty pattern is RabbitMQ's "^$"
    ("", "a", {}, False),
    ("^{username}\\.{vhost}$", "bob.v", {"username": "bob", "vhost": "v"}, True),
    ("^{username}$", "bxb", {"username": "b.b"}, False),  # a name stands for itself, never for a pattern
    ("^{username}$", "b.b", {"username": "b.b"}, True),
    ("^{client_id}$", "{client_id}", {"username": "bob"}, True),  # (an AMQP client has no client id)
    ("^{client_id}$", "x" * 9000, {"client_id": "x" * 9000}, False),  # (too big a pattern: nothing is allowed)
])
def test_a_topic_pattern_allows_the_keys_it_matches(pattern, key, variables, allowed):
    assert TopicPermission("bob", "v", "t", pattern, pattern).allows("write", key, variables) is allowed


@pytest.mark.parametrize("pattern", ["(", "(a)\\1"])
def test_a_topic_pattern_that_cannot_be_used_is_refused(pattern):
    with pytest.raises((PatternError, re.error)):
        TopicPermission("bob", "v", "t", ".*", pattern)


@pytest.fixture
def exchanges(node):
    """Bob may use every resource of vhost v; its topic exchanges t and other, and a direct exchange d."""
    node.set_permissions("bob", "v", ".*", ".*", ".*")
    return TopicExchange("t"), TopicExchange("other"), DirectExchange("d")


def test_a_topic_permission_limits_its_topic_exchange_only(node, exchanges):
    topic, other, direct = exchanges
    node.set_topic_permissions("bob", "v", "t", "^w", "^r")
    node.set_topic_permissions("bob", "v", "d", "^w", "^r")
    access = ChannelAccess(node, "bob", "v")
    access.check_topic("write", topic, "w.1")
    access.check_topic("read", topic, "r.1")
    assert refusal(lambda: access.check_topic("write", topic, "r.1")) == (
        403, "ACCESS_REFUSED - access to topic 'r.1' in exchange 't' in vhost 'v' refused for user 'bob'")
    assert refusal(lambda: access.check_topic("read", topic, "w.1"))[0] == 403
    access.check_topic("write", other, "anything")
    access.check_topic("write", direct, "anything")


def test_a_topic_permission_change_drops_what_a_channel_remembers(node, exchanges):
    topic = exchanges[0]
    access = ChannelAccess(node, "bob", "v")
    access.check_topic("write", topic, "k")
    assert access.topics is None  # (no topic permission: the publish path skips the check)
    node.set_topic_permissions("bob", "v", "t", "^w", ".*")
    assert refusal(lambda: access.check_topic("write", topic, "k"))[0] == 403
    node.clear_topic_permissions("bob", "v", "t")
    access.check_topic("write", topic, "k")
    assert access.topics is None


def test_what_a_channel_remembers_of_topics_is_bounded(node, exchanges):
    node.set_topic_permissions("bob", "v", "t", ".*", ".*")
    access = ChannelAccess(node, "bob", "v")
    for index in range(TOPIC_CACHE_SIZE * 3):
        access.check_topic("write", exchanges[0], f"k{index}")
    assert 0 < len(access.topic_allowed) <= TOPIC_CACHE_SIZE


def test_an_mqtt_clients_id_stands_in_its_topic_permissions(node, exchanges):
    node.set_topic_permissions("bob", "v", "t", "^devices\\.{client_id}\\.", ".*")
    ChannelAccess(node, "bob", "v", client_id="d1").check_topic("write", exchanges[0], "devices.d1.t")
    assert refusal(lambda: ChannelAccess(node, "bob", "v", client_id="d2").check_topic(
        "write", exchanges[0], "devices.d1.t"))[0] == 403


def test_a_users_or_vhosts_deletion_drops_their_topic_permissions(node):
    node.add_vhost("w")
    node.set_topic_permissions("bob", "v", "t", ".*", ".*")
    node.set_topic_permissions("bob", "w", "t", ".*", ".*")
    for _ in node.delete_vhost("w"):
        pass
    assert list(node.topic_permissions) == [("v", "bob")]
    node.delete_user("bob")
    assert node.topic_permissions == {}


# --- connection.open -------------------------------------------------------------------------------------------
def test_opening_a_vhost_needs_a_permission_entry_there(node):
    node.add_vhost("other")
    assert node.open_vhost("bob", "v").name == "v"
    assert refusal(lambda: node.open_vhost("bob", "missing")) == (530, "NOT_ALLOWED - vhost missing not found")
    assert refusal(lambda: node.open_vhost("bob", "other")) == (
        530, "NOT_ALLOWED - access to vhost 'other' refused for user 'bob'")
    node.set_permissions("bob", "other", "", "", "")  # empty patterns still let the user in, as in RabbitMQ
    assert node.open_vhost("bob", "other").name == "other"


def test_a_vhost_this_process_does_not_serve_now_is_refused_as_a_vhost_that_is_down(node):
    """A worker of several whose group does not hold the vhost (a front door routed the client by a record this
    worker has not learnt yet): 541, as RabbitMQ answers for a vhost down on its node; the client comes again."""
    node.serves = lambda name: name != "v"
    assert refusal(lambda: node.open_vhost("bob", "v")) == (
        541, "INTERNAL_ERROR - access to vhost 'v' refused for user 'bob': vhost 'v' is down")
    assert refusal(lambda: node.open_vhost("bob", "missing")) == (530, "NOT_ALLOWED - vhost missing not found")
