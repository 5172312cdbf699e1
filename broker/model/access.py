"""Users, their password hashes and tags, per-vhost permissions and topic permissions, with RabbitMQ's checks and
refusal texts."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.model.patterns import PatternError, compile_pattern
from protocol import errors

if TYPE_CHECKING:
    from broker.model.exchange import Exchange
    from broker.model.node import Node

# RabbitMQ's password hashing modules, by the name its definitions export gives them, and the digest each uses.
HASHING_ALGORITHMS = {
    "rabbit_password_hashing_sha256": hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}
DEFAULT_HASHING = "rabbit_password_hashing_sha256"  # RabbitMQ's default since 3.6
SALT_BYTES = 4  # RabbitMQ salts each hash with 4 random bytes
KNOWN_TAGS = ("administrator", "monitoring", "policymaker", "management", "impersonator")
CONFIGURE, WRITE, READ = ACCESS_KINDS = ("configure", "write", "read")
QUEUE, EXCHANGE = "queue", "exchange"  # the kinds of resource a permission covers, as refusal texts name them
# Exchanges a channel remembers it may publish to (RabbitMQ's channels remember 12 decisions); past that it starts over
PUBLISH_CACHE_SIZE = 64
# Routing keys a channel remembers it may publish or bind with under topic permissions; past that it starts over
TOPIC_CACHE_SIZE = 64
TOPIC_VARIABLES = ("username", "vhost", "client_id")  # what a topic permission's {name} placeholders stand for
TOPIC_EXCHANGE = "topic"  # the only kind of exchange topic permissions apply to


def hash_password(password: str, algorithm: str = DEFAULT_HASHING, salt: bytes | None = None) -> str:
    """RabbitMQ's scheme: base64(salt + digest(salt + utf-8 password)), salt 4 random bytes."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = HASHING_ALGORITHMS[algorithm](salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def valid_password_hash(password_hash: str, algorithm: str) -> bool:
    """Whether password_hash can be checked: base64 of a salt and a digest of the algorithm's size (or empty: a
    user without a password, who cannot log in with one)."""
    if password_hash == "":
        return True
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) == SALT_BYTES + HASHING_ALGORITHMS[algorithm]().digest_size


@dataclass
class User:
    name: str
    password_hash: str  # base64(salt + digest); "" = no password login
    hashing_algorithm: str = DEFAULT_HASHING  # a key of HASHING_ALGORITHMS
    tags: list[str] = field(default_factory=list)  # administrator, monitoring, policymaker, management...
    limits: dict = field(default_factory=dict)  # RabbitMQ's user limits as exported (kept, not enforced yet)

    def check_password(self, password: str) -> bool:
        if not self.password_hash:
            return False
        raw = base64.b64decode(self.password_hash)
        salt = raw[:SALT_BYTES]
        return hmac.compare_digest(raw, salt + HASHING_ALGORITHMS[self.hashing_algorithm](
            salt + password.encode("utf-8")).digest())

    def definition(self) -> dict:
        """The user as RabbitMQ's definitions export shows it."""
        return {"name": self.name, "password_hash": self.password_hash,
                "hashing_algorithm": self.hashing_algorithm, "tags": list(self.tags), "limits": dict(self.limits)}


def permission_pattern(pattern: str):
    """A permission regex as RabbitMQ reads it (searched anywhere in the name); "" grants nothing (None).
    patterns.PatternError or re.error when it cannot be used."""
    return compile_pattern(pattern) if pattern else None


@dataclass
class Permission:
    """What one user may do in one vhost: three regular expressions over resource names."""

    user: str
    vhost: str
    configure: str  # declare and delete queues and exchanges
    write: str  # publish to exchanges, bind queues and exchanges to something
    read: str  # consume, get and purge queues; bind from exchanges
    patterns: dict = field(default_factory=dict, repr=False, compare=False)  # access kind -> compiled, or None

    def __post_init__(self) -> None:
        self.patterns = {kind: permission_pattern(getattr(self, kind)) for kind in ACCESS_KINDS}

    def allows(self, access: str, name: str) -> bool:
        pattern = self.patterns[access]
        return pattern is not None and pattern.search(name) is not None

    def definition(self) -> dict:
        return {"user": self.user, "vhost": self.vhost, "configure": self.configure, "write": self.write,
                "read": self.read}


@dataclass
class TopicPermission:
    """What one user may publish (write) and bind (read) through one topic exchange of one vhost: two regular
    expressions over routing keys and binding keys, RabbitMQ's topic authorisation. {username}, {vhost} and (for
    an MQTT client) {client_id} in a pattern stand for the client's; "" allows only the empty key, as RabbitMQ's
    "^$"."""

    user: str
    vhost: str
    exchange: str
    write: str
    read: str

    def __post_init__(self) -> None:
        for kind in (WRITE, READ):  # (re.error or PatternError for one that cannot be used)
            _compiled_topic_pattern(_expanded(getattr(self, kind), {name: "x" for name in TOPIC_VARIABLES}))

    def allows(self, access: str, key: str, variables: dict[str, str]) -> bool:
        """Whether the routing key may be used for access ("write" or "read") by a client of these variables."""
        try:
            pattern = _compiled_topic_pattern(_expanded(getattr(self, access), variables))
        except (PatternError, re.error):  # (a client's long name made the pattern too big: nothing is allowed)
            return False
        return pattern.search(key) is not None

    def definition(self) -> dict:
        return {"user": self.user, "vhost": self.vhost, "exchange": self.exchange, "write": self.write,
                "read": self.read}


def _expanded(pattern: str, variables: dict[str, str]) -> str:
    """pattern with each {name} replaced by the variable's value, escaped: unlike RabbitMQ, which puts the value in
    as it is, a user or client called "a.*" cannot widen a pattern made for its own name."""
    if not pattern:
        return "^$"
    for name, value in variables.items():
        pattern = pattern.replace("{" + name + "}", re.escape(value))
    return pattern


@functools.lru_cache(maxsize=1024)  # (the patterns of the users and clients at hand; compiling one takes up to 5 ms)
def _compiled_topic_pattern(pattern: str):
    return compile_pattern(pattern)


def topic_refusal(access: "ChannelAccess", exchange: str, key: str) -> errors.AMQPError:
    """RabbitMQ's refusal of a routing key (a publish's) or binding key (a bind's) under a topic permission."""
    return errors.access_refused(f"access to topic '{key}' in exchange '{exchange}' in vhost '{access.vhost}' "
                                 f"refused for user '{access.user}'")


def permission_name(name: str) -> str:
    """The name a resource's permission is checked against: the default exchange is 'amq.default'."""
    return name or "amq.default"


def check_resource(permission: Permission | None, user: str, vhost: str, kind: str, name: str,
                   access: str) -> None:
    """Raise RabbitMQ's 403 unless permission grants access ('configure', 'write' or 'read') to the queue or
    exchange called name."""
    name = permission_name(name)
    if permission is None or not permission.allows(access, name):
        raise errors.access_refused(
            f"access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'")


def internal_exchange_refusal(exchange: str, vhost: str) -> errors.AMQPError:
    """RabbitMQ's refusal of a publish to an internal exchange (by a client or through the management API)."""
    return errors.access_refused(f"cannot publish to internal exchange '{exchange}' in vhost '{vhost}'")


def user_id_refusal(user_id: str, user: str) -> errors.AMQPError:
    """RabbitMQ's refusal of a publish whose user_id property names another user than the one logged in."""
    return errors.precondition_failed(f"user_id property set to '{user_id}' but authenticated user was '{user}'")


class ChannelAccess:
    """What one channel's user may do in its vhost: RabbitMQ's check_configure/write/read_permitted, and its
    check_topic_access. Publishing checks no regex per message: the exchanges it may publish to, and the routing keys
    its topic permissions allow, are remembered (as rabbit_channel's permission caches) until the node's permissions
    change, so that a change applies to open channels at once."""

    __slots__ = ("node", "user", "vhost", "client_id", "version", "permission", "writable", "topics",
                 "topic_allowed")

    def __init__(self, node: "Node", user: str, vhost: str, client_id: str | None = None):
        self.node = node
        self.user = user
        self.vhost = vhost
        self.client_id = client_id  # an MQTT client's id, for {client_id} in topic permissions (None: AMQP's)
        self.version = -1  # the node's permissions_version that permission and writable were taken at
        self.permission: Permission | None = None  # the user's permission in the vhost (None: it has none)
        self.writable: set[str] = set()  # exchanges this channel may publish to, checked under version
        # the user's topic permissions in the vhost, by exchange, under version (None: it has none, as most users)
        self.topics: dict[str, TopicPermission] | None = None
        self.topic_allowed: set[tuple[str, str, str]] = set()  # (access, exchange, key) allowed under version

    def _permission(self) -> Permission | None:
        node = self.node
        if self.version != node.permissions_version:
            self.version = node.permissions_version
            self.permission = node.permissions.get((self.vhost, self.user))
            self.writable = set()
            self.topics = node.topic_permissions.get((self.vhost, self.user))
            self.topic_allowed = set()
        return self.permission

    def check(self, access: str, kind: str, name: str) -> None:
        """Raise RabbitMQ's 403 unless the user has access ('configure', 'write' or 'read') to the resource."""
        check_resource(self._permission(), self.user, self.vhost, kind, name, access)

    def may_impersonate(self) -> bool:
        """Whether the user may publish with another user's user_id (RabbitMQ's impersonator tag)."""
        user = self.node.users.get(self.user)
        return user is not None and "impersonator" in user.tags

    def check_publish(self, exchange: str) -> None:
        """basic.publish's write check; callers skip it while exchange is in writable at the current version."""
        self.check(WRITE, EXCHANGE, exchange)
        if len(self.writable) >= PUBLISH_CACHE_SIZE:
            self.writable.clear()
        self.writable.add(exchange)

    def check_published_keys(self, exchange: "Exchange", keys: list[str]) -> None:
        """A publish's topic check: every key it is routed by (its CC and BCC keys too, as RabbitMQ 4.x checks them;
        3.x checked its own routing key alone)."""
        for key in keys:
            self.check_topic(WRITE, exchange, key)

    def check_topic(self, access: str, exchange: "Exchange", key: str) -> None:
        """Raise RabbitMQ's 403 unless the user's topic permission on a topic exchange (if it has one there) allows
        the routing key for access: "write" to publish with it, "read" to bind with it."""
        self._permission()
        topics = self.topics
        if topics is None or exchange.kind != TOPIC_EXCHANGE:
            return
        permission = topics.get(exchange.name)
        if permission is None or (access, exchange.name, key) in self.topic_allowed:
            return
        variables = {"username": self.user, "vhost": self.vhost}
        if self.client_id is not None:
            variables["client_id"] = self.client_id
        if not permission.allows(access, key, variables):
            raise topic_refusal(self, exchange.name, key)
        if len(self.topic_allowed) >= TOPIC_CACHE_SIZE:
            self.topic_allowed.clear()
        self.topic_allowed.add((access, exchange.name, key))


class InternalAccess(ChannelAccess):
    """What the broker's own federation links act with in a vhost, as RabbitMQ's act through an internal
    connection: every right, other users' user_id included. Only the broker makes one."""

    __slots__ = ()

    def __init__(self, node: "Node", vhost: str):
        super().__init__(node, "", vhost)

    def check(self, access: str, kind: str, name: str) -> None:
        return None

    def check_topic(self, access: str, exchange: "Exchange", key: str) -> None:
        return None

    def may_impersonate(self) -> bool:
        return True
