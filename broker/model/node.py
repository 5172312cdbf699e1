"""The node: its virtual hosts, users and permissions, kept durable in the definitions log.

Every change an operator makes (AMQP never makes these) goes through here, whether it comes from the management
API, a definitions import or the boot-time bootstrap. Closing the connections a change affects (a deleted user's,
a deleted vhost's) is the caller's part: the model knows no connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import reprlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

from broker.model.access import (
    DEFAULT_HASHING, HASHING_ALGORITHMS, Permission, TopicPermission, User, hash_password, valid_password_hash,
)
from broker.model.counters import AMQP_LABEL, NodeCounters
from broker.model.interfaces import ParameterComponent, QueueCrossing, TopologyWatcher
from broker.model.keys import permission_key, topic_permission_key
from broker.model.retained import RetainedMessages
from broker.model.vhost import VirtualHost
from protocol import errors

if TYPE_CHECKING:
    from broker.model.features.paging import Paging

log = logging.getLogger(__name__)

FULL_ACCESS = ".*"  # the configure/write/read pattern that grants everything
# Checked instead when a login names no user with a password, so that it takes as long as a wrong password does
# and the time of a refusal does not tell which users exist
STAND_IN = User("", hash_password(os.urandom(16).hex()), DEFAULT_HASHING, [])


def vhost_down(name: str, user: str) -> errors.AMQPError:
    """RabbitMQ's refusal of a vhost that is down on the node (541): a client may connect again."""
    return errors.internal_error(f"access to vhost '{name}' refused for user '{user}': vhost '{name}' is down")


class Node:
    def __init__(self, store=None, paging: "Paging | None" = None):
        self.store = store  # durable storage (storage.MessageStore) or None for a node kept in memory
        self.paging = paging  # where deep queues page their ready messages, None: they keep them all in memory
        self.vhosts: dict[str, VirtualHost] = {}
        self.deleting: dict[str, list[asyncio.Future[None]]] = {}  # vhosts being deleted -> who waits for the end
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}  # (vhost, user) -> what user may do there
        # (vhost, user) -> exchange -> the routing keys user may publish and bind with through it
        self.topic_permissions: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        # Bumped on every permission change, so that channels caching access decisions know to drop them.
        self.permissions_version = 0
        self.next_msg_id = 1  # id of the next persistent message written to the store (shared by every vhost)
        self.counters = NodeCounters()  # what the node did since it started, for the Prometheus endpoint
        # the same of the clients of other protocols, by RabbitMQ's protocol label ("mqtt311"...): their channels
        # count there (the node's totals are the sums: totals())
        self.other_protocols: dict[str, NodeCounters] = {}
        # whether this process serves a vhost's clients now: a worker of several, those of the vhosts recorded in
        # its group (broker.workers.placement); a client sent by a record it has not learnt yet is told to come again
        self.serves: Callable[[str], bool] = lambda name: True
        self.parameter_components: dict[str, ParameterComponent] = {}  # component -> what runs its parameters
        self.watcher: TopologyWatcher | None = None  # told of changes to every vhost's topology (federation)
        # how queues owned by other processes of the node are reached (broker.crossing); None: all are here
        self.crossing: QueueCrossing | None = None
        self.retained = RetainedMessages(store)  # MQTT's retained messages of every vhost

    def counters_of(self, protocol: str) -> NodeCounters:
        """The counters of a protocol's clients (RabbitMQ's label: "amqp091" those of self.counters)."""
        if protocol == AMQP_LABEL:
            return self.counters
        counters = self.other_protocols.get(protocol)
        if counters is None:
            counters = self.other_protocols[protocol] = NodeCounters()
        return counters

    def by_protocol(self) -> list[tuple[str, NodeCounters]]:
        """Each protocol's counters, AMQP 0-9-1's first."""
        return [(AMQP_LABEL, self.counters), *self.other_protocols.items()]

    def total(self, name: str) -> int:
        """A plain counter (received, confirmed ...) summed over the protocols."""
        return sum(getattr(counters, name) for _, counters in self.by_protocol())

    # --- durability ------------------------------------------------------------------------------------------
    def record(self, kind: str, name: str, data: dict | None) -> None:
        """Keep a definition (data; None: its end) under kind and name in the definitions log, where there is one."""
        if self.store is not None:
            self.store.append_definition(kind, name, data)

    # --- vhosts ----------------------------------------------------------------------------------------------
    def vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise errors.not_found(f"no vhost '{name}'")
        return vhost

    def add_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str | None = None) -> VirtualHost:
        """Create a vhost (or update the description and tags of an existing one); not one being deleted
        (ValueError: vhost_deleted says when it is gone)."""
        if name in self.deleting:
            raise ValueError(f"vhost '{name}' is being deleted")
        vhost = self.vhosts.get(name)
        log.info("vhost %.200r %s", name, "added" if vhost is None else "updated")
        if vhost is None:
            vhost = self.vhosts[name] = VirtualHost(name, self.store, self, self.paging)
            vhost.watcher = self.watcher
        vhost.description = description
        vhost.tags = list(tags or [])
        vhost.default_queue_type = default_queue_type
        self.record("vhost", name, vhost.definition())
        return vhost

    def delete_vhost(self, name: str) -> Iterator[None]:
        """Remove a vhost with its queues (and their messages), exchanges, policies and permissions, yielding after
        each queue and exchange (the caller runs it in slices: broker.model.turns.in_slices). Its first step takes
        it out of the node's vhosts with its permissions: no client or request finds it meanwhile, and its name is
        taken until the last (``deleting``), so that no vhost of that name is made while the records of its
        deletion are written. The caller closes its connections after that first step."""
        vhost = self.vhost(name)
        for component, parameter in list(vhost.parameters):  # (their components stop what runs them)
            self.clear_parameter(name, component, parameter)
        del self.vhosts[name]
        self.deleting[name] = []
        try:
            self.retained.drop_vhost(name)
            for key in [key for key in self.permissions if key[0] == name]:  # (an export meanwhile names none)
                self._drop_permission(key)
            for key in [key for key in self.topic_permissions if key[0] == name]:
                self._drop_topic_permissions(key, None)
            yield None  # (the first step ends here: the caller closes the vhost's connections once it has left)
            yield from vhost.delete_everything()
            self.record("vhost", name, None)
            log.info("vhost %.200r deleted", name)
        except BaseException:  # (a step that failed: what is left of it stays, as its records say)
            self.vhosts[name] = vhost
            raise
        finally:
            for waiter in self.deleting.pop(name):
                if not waiter.done():  # (its request gone)
                    waiter.set_result(None)

    def record_ends(self) -> None:
        """Each vhost's records of the end of its deleted queues whose bindings are still leaving, given to the
        store now (VirtualHost.record_ends: the node stops, and a restart is to find those queues gone)."""
        for vhost in self.vhosts.values():
            vhost.record_ends()

    async def vhost_deleted(self, name: str) -> None:
        """Once a deletion of the vhost under way, if any, is done (a vhost of that name may then be made)."""
        waiting = self.deleting.get(name)
        if waiting is not None:
            waiter = asyncio.get_running_loop().create_future()
            waiting.append(waiter)
            await waiter

    def cross(self, crossing: QueueCrossing) -> None:
        """Let queues of every vhost be owned by other processes of the node, reached through crossing (before the
        store's definitions are restored, which name the owners)."""
        self.crossing = crossing
        for vhost in self.vhosts.values():
            vhost.crossing = crossing

    def watch(self, watcher: TopologyWatcher) -> None:
        """Tell watcher of the topology changes of every vhost, those made later included."""
        self.watcher = watcher
        for vhost in self.vhosts.values():
            vhost.watcher = watcher

    # --- runtime parameters -------------------------------------------------------------------------------
    def set_parameter(self, vhost_name: str, component: str, name: str, value: Any, user: str | None = None) -> bool:
        """Set a runtime parameter once its component has checked the value, and that user may set it (ValueError
        saying why not; an unknown component is one); whether it is new. user: who sets it (None: an import)."""
        vhost = self.vhost(vhost_name)
        handler = self._component(component)
        handler.check(vhost_name, name, value, user)
        new = (component, name) not in vhost.parameters
        if not new and vhost.parameters[(component, name)] == value:
            return False  # (as RabbitMQ: the same value changes nothing, and a running shovel goes on)
        vhost.store_parameter(component, name, value)
        log.info("parameter %.200r of component %s set in vhost %.200r", name, component, vhost_name)
        handler.changed(vhost_name, name, value)
        return new

    def clear_parameter(self, vhost_name: str, component: str, name: str) -> None:
        vhost = self.vhost(vhost_name)
        if (component, name) not in vhost.parameters:
            raise errors.not_found(f"no parameter '{name}' of component '{component}' in vhost '{vhost_name}'")
        vhost.store_parameter(component, name, None)
        log.info("parameter %.200r of component %s cleared in vhost %.200r", name, component, vhost_name)
        handler = self.parameter_components.get(component)
        if handler is not None:
            handler.changed(vhost_name, name, None)

    def _component(self, component: str) -> ParameterComponent:
        handler = self.parameter_components.get(component)
        if handler is None:
            known = ", ".join(f"'{name}'" for name in sorted(self.parameter_components)) or "none"
            raise ValueError(f"unknown parameter component '{component}' (this node knows {known})")
        return handler

    # --- users -----------------------------------------------------------------------------------------------
    def put_user(self, name: str, password: str | None = None, password_hash: str | None = None,
                 hashing_algorithm: str = DEFAULT_HASHING, tags: list[str] | None = None) -> User:
        """Create or replace a user from a password (hashed here) or a RabbitMQ password hash; with neither, an
        existing user keeps its password and a new one has none."""
        if hashing_algorithm not in HASHING_ALGORITHMS:
            raise ValueError(f"unknown hashing algorithm '{hashing_algorithm}'")
        if password is not None:
            password_hash = hash_password(password, hashing_algorithm)
        elif password_hash is None:
            existing = self.users.get(name)
            password_hash = existing.password_hash if existing is not None else ""
            hashing_algorithm = existing.hashing_algorithm if existing is not None else hashing_algorithm
        elif not valid_password_hash(password_hash, hashing_algorithm):
            raise ValueError("password_hash is not a base64-encoded salted hash of the hashing algorithm")
        user = User(name, password_hash, hashing_algorithm, list(tags or []))
        log.info("user %.200r %s (tags: %.200s)", name, "updated" if name in self.users else "added",
                 ", ".join(user.tags) or "none")
        self.users[name] = user
        self.record("user", name, user.definition())
        return user

    def delete_user(self, name: str) -> User:
        """Remove a user and its permissions. The caller closes its connections."""
        user = self.users.pop(name, None)
        if user is None:
            raise errors.not_found(f"no user '{name}'")
        for key in [key for key in self.permissions if key[1] == name]:
            self._drop_permission(key)
        for key in [key for key in self.topic_permissions if key[1] == name]:
            self._drop_topic_permissions(key, None)
        self.record("user", name, None)
        log.info("user %.200r deleted", name)
        return user

    def authenticate(self, name: str, password: str) -> User | None:
        """The user, if password is its password. A blank password is refused whoever the user (as RabbitMQ's
        internal backend: a user without a password logs in by other means)."""
        if password == "":
            return None
        user = self.users.get(name)
        if user is None or not user.password_hash:
            STAND_IN.check_password(password)
            return None
        return user if user.check_password(password) else None

    # --- permissions -----------------------------------------------------------------------------------------
    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> Permission:
        if user not in self.users:
            raise errors.not_found(f"no user '{user}'")
        self.vhost(vhost)
        permission = Permission(user, vhost, configure, write, read)  # raises re.error for a bad pattern
        self.permissions[vhost, user] = permission
        self.permissions_version += 1
        self.record("permission", permission_key(vhost, user), permission.definition())
        log.info("permissions of user %.200r in vhost %.200r set: configure %.200r, write %.200r, read %.200r", user,
                 vhost, configure, write, read)
        return permission

    def clear_permissions(self, user: str, vhost: str) -> None:
        if (vhost, user) not in self.permissions:
            raise errors.not_found(f"no permissions for user '{user}' in vhost '{vhost}'")
        self._drop_permission((vhost, user))
        log.info("permissions of user %.200r in vhost %.200r cleared", user, vhost)

    def _drop_permission(self, key: tuple[str, str]) -> None:
        del self.permissions[key]
        self.permissions_version += 1
        self.record("permission", permission_key(*key), None)

    def set_topic_permissions(self, user: str, vhost: str, exchange: str, write: str, read: str) -> TopicPermission:
        if user not in self.users:
            raise errors.not_found(f"no user '{user}'")
        self.vhost(vhost)
        permission = TopicPermission(user, vhost, exchange, write, read)  # raises re.error for a bad pattern
        self.topic_permissions.setdefault((vhost, user), {})[exchange] = permission
        self.permissions_version += 1
        self.record("topic_permission", topic_permission_key(vhost, user, exchange), permission.definition())
        log.info("topic permissions of user %.200r in vhost %.200r on exchange %.200r set: write %.200r, read %.200r",
                 user, vhost, exchange, write, read)
        return permission

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        """Drop the user's topic permissions in the vhost: on one exchange, or (None) on every one."""
        held = self.topic_permissions.get((vhost, user), {})
        if not held or (exchange is not None and exchange not in held):
            raise errors.not_found(f"no topic permissions for user '{user}' in vhost '{vhost}'"
                                   + (f" on exchange '{exchange}'" if exchange is not None else ""))
        self._drop_topic_permissions((vhost, user), exchange)
        log.info("topic permissions of user %.200r in vhost %.200r%s cleared", user, vhost,
                 f" on exchange {exchange[:200]!r}" if exchange is not None else "")

    def _drop_topic_permissions(self, key: tuple[str, str], exchange: str | None) -> None:
        held = self.topic_permissions[key]
        for name in list(held) if exchange is None else [exchange]:
            del held[name]
            self.record("topic_permission", topic_permission_key(*key, name), None)
        if not held:
            del self.topic_permissions[key]
        self.permissions_version += 1

    def open_vhost(self, user: str, name: str) -> VirtualHost:
        """The vhost a connection.open names, if user may use it (any permission entry there), else RabbitMQ's
        530; 541 for one this process does not serve now (RabbitMQ's answer for a vhost that is down): it leads it,
        or keeps a copy of it that has its home's definitions (broker.crossing.copies)."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise errors.not_allowed(f"vhost {name} not found")
        if (name, user) not in self.permissions:
            raise errors.not_allowed(f"access to vhost '{name}' refused for user '{user}'")
        if not vhost.serving():
            raise vhost_down(name, user)
        return vhost

    # --- boot ------------------------------------------------------------------------------------------------
    def bootstrap(self, vhost: str, user: str, password: str) -> None:
        """On a node with no vhost and no user yet (first start), create the default vhost and an administrator
        with full permissions on it, as RabbitMQ does with its default_vhost/default_user."""
        if self.vhosts or self.users:
            return
        self.add_vhost(vhost, "Default virtual host")
        self.put_user(user, password, tags=["administrator"])
        self.set_permissions(user, vhost, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)
        log.info("created the default vhost '%s' and user '%s'", vhost, user)

    def restore_definitions(self, vhosts: list, users: list, permissions: list, topic_permissions: list) -> None:
        """Rebuild vhosts, users, permissions and topic permissions from their stored definitions; one that cannot
        be used is logged and skipped."""
        for data in vhosts:
            self._restore_one("vhost", data, lambda d: self._restore_vhost(d))
        for data in users:
            self._restore_one("user", data, lambda d: self._restore_user(d))
        for data in permissions:
            self._restore_one("permission", data, lambda d: self._restore_permission(d))
        for data in topic_permissions:
            self._restore_one("topic permission", data, lambda d: self._restore_topic_permission(d))

    def _restore_one(self, kind: str, data, restore) -> None:
        try:
            if not isinstance(data, dict):
                raise TypeError("not a table")
            restore(data)
        except Exception as error:
            log.error("skipping stored %s %s: %s: %s", kind, reprlib.repr(data), type(error).__name__, error)

    def _restore_vhost(self, data: dict) -> None:
        vhost = self.vhosts[data["name"]] = VirtualHost(data["name"], self.store, self, self.paging)
        vhost.watcher = self.watcher
        vhost.description = data.get("description", "")
        vhost.tags = list(data.get("tags", []))
        vhost.default_queue_type = data.get("default_queue_type")

    def _restore_user(self, data: dict) -> None:
        algorithm = data.get("hashing_algorithm", DEFAULT_HASHING)
        if algorithm not in HASHING_ALGORITHMS or not valid_password_hash(data["password_hash"], algorithm):
            raise ValueError("unusable password hash")
        self.users[data["name"]] = User(data["name"], data["password_hash"], algorithm, list(data.get("tags", [])),
                                        dict(data.get("limits", {})))

    def _restore_permission(self, data: dict) -> None:
        if data["vhost"] not in self.vhosts or data["user"] not in self.users:
            raise ValueError("its user or vhost is gone")
        self.permissions[data["vhost"], data["user"]] = Permission(
            data["user"], data["vhost"], data["configure"], data["write"], data["read"])

    def _restore_topic_permission(self, data: dict) -> None:
        if data["vhost"] not in self.vhosts or data["user"] not in self.users:
            raise ValueError("its user or vhost is gone")
        permission = TopicPermission(data["user"], data["vhost"], data["exchange"], data["write"], data["read"])
        self.topic_permissions.setdefault((data["vhost"], data["user"]), {})[data["exchange"]] = permission
