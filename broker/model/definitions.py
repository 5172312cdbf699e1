"""Definitions: RabbitMQ's JSON export of a node's (or one vhost's) vhosts, users, permissions, topic permissions,
policies, queues, exchanges and bindings, and its import.

An import is checked whole before anything changes (the shape of every item, the vhosts and users it names,
password hashes, permission patterns, policies, exchange types, queue and exchange arguments), then applied
through the same model calls the management API and AMQP use, so it is durable as they are. As RabbitMQ does, an
import creates or overwrites what it names and leaves the rest alone; a queue or exchange that already exists is
kept as it is, and a binding whose source or destination does not exist (or that names a reserved object) is
skipped with a warning.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from broker.model.access import HASHING_ALGORITHMS, DEFAULT_HASHING, TopicPermission, valid_password_hash
from broker.model.arguments import (
    check_exchange_equivalent, check_queue_equivalent, validate_exchange_arguments, validate_queue_arguments,
)
from broker.model.exchange import EXCHANGE_TYPES
from broker.model.operations import shortstr_problem
from broker.model.patterns import PatternError, compile_pattern
from broker.model.policy import PolicyError, make_policy
from broker.model.routing.headers import validate_x_match
from broker.model.turns import OffLoop, Steps
from broker.model.vhost import OPERATOR_OWNER, PREDECLARED_EXCHANGES
from protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.model.node import Node
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost

log = logging.getLogger(__name__)

RABBITMQ_VERSION = "3.10.8"  # the RabbitMQ release whose definitions format and management API Warren follows
OPERATOR_POLICY = "operator_policy"  # the component of an operator policy among RabbitMQ's "parameters"
RESERVED_PREFIX = "amq."  # names of queues and exchanges only the broker may create
# RabbitMQ releases whose exports name no hashing_algorithm because their hashes are all MD5 (before 3.6).
MD5_RELEASES = ("2.", "3.0.", "3.1.", "3.2.", "3.3.", "3.4.", "3.5.")


class DefinitionsError(ValueError):
    """An import that cannot be applied; the message names the item and what is wrong with it."""


# --- export ------------------------------------------------------------------------------------------------------
def export_node(node: "Node", product_name: str, product_version: str) -> dict:
    """Everything RabbitMQ's GET /api/definitions exports, in its shape."""
    vhosts = list(node.vhosts.values())
    return {
        "rabbit_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": product_name,
        "product_version": product_version,
        "users": [user.definition() for user in node.users.values()],
        "vhosts": [_vhost_definition(vhost) for vhost in vhosts],
        "permissions": [permission.definition() for permission in node.permissions.values()],
        "topic_permissions": topic_permissions(node),
        "parameters": [item for vhost in vhosts for item in (*_operator_policies(vhost), *_parameters(vhost))],
        "global_parameters": [],
        "policies": [item for vhost in vhosts for item in _policies(vhost, with_vhost=True)],
        "queues": [item for vhost in vhosts for item in _queues(vhost, with_vhost=True)],
        "exchanges": [item for vhost in vhosts for item in _exchanges(vhost, with_vhost=True)],
        "bindings": [item for vhost in vhosts for item in _bindings(vhost, with_vhost=True)],
    }


NODE_WIDE_SECTIONS = ("users", "vhosts", "permissions", "topic_permissions")  # what every worker holds a copy of
VHOST_SECTIONS = ("parameters", "policies", "queues", "exchanges", "bindings")  # what lives in one vhost


def export_node_wide(node: "Node") -> dict:
    """The node-wide part of export_node: users, vhosts, permissions and topic permissions, which every worker
    process holds."""
    return {
        "users": [user.definition() for user in node.users.values()],
        "vhosts": [_vhost_definition(vhost) for vhost in node.vhosts.values()],
        "permissions": [permission.definition() for permission in node.permissions.values()],
        "topic_permissions": topic_permissions(node),
    }


def topic_permissions(node: "Node") -> list[dict]:
    """Every topic permission, as RabbitMQ's exports and its API list them."""
    return [permission.definition() for held in node.topic_permissions.values() for permission in held.values()]


def of_vhosts(document: dict, names: set[str]) -> dict:
    """``document`` with the items of VHOST_SECTIONS kept only for the vhosts ``names`` (an item that names no
    vhost stays, for the import to report)."""
    kept = dict(document)
    for section in VHOST_SECTIONS:
        items = document.get(section)
        if isinstance(items, list):
            kept[section] = [item for item in items if not isinstance(item, dict)
                             or not isinstance(item.get("vhost"), str) or item["vhost"] in names]
    return kept


def export_vhost(vhost: "VirtualHost") -> dict:
    """One vhost's definitions, as RabbitMQ's GET /api/definitions/{vhost} (no users, no vhost names)."""
    return {
        "rabbit_version": RABBITMQ_VERSION,
        "parameters": [*_operator_policies(vhost), *_parameters(vhost)],  # RabbitMQ names the vhost even here
        "policies": list(_policies(vhost, with_vhost=False)),
        "queues": list(_queues(vhost, with_vhost=False)),
        "exchanges": list(_exchanges(vhost, with_vhost=False)),
        "bindings": list(_bindings(vhost, with_vhost=False)),
    }


def _vhost_definition(vhost: "VirtualHost") -> dict:
    """Name, description, tags and metadata, as RabbitMQ 3.11 exports them (3.10 imports them too); the default
    queue type only when one was given (RabbitMQ 3.10 would import a null as the queue type 'undefined')."""
    definition = vhost.definition()
    if definition.get("default_queue_type") is None:
        definition.pop("default_queue_type", None)
    return definition


def _policies(vhost: "VirtualHost", with_vhost: bool):
    for policy in vhost.policies.values():
        yield _scoped(json_safe(policy.export()), with_vhost)


def _operator_policies(vhost: "VirtualHost"):
    """Operator policies, which RabbitMQ exports as runtime parameters of the component operator_policy."""
    for policy in vhost.operator_policies.values():
        value = json_safe(policy.export())
        yield {"value": {key: value[key] for key in ("pattern", "definition", "priority", "apply-to")},
               "vhost": vhost.name, "component": OPERATOR_POLICY, "name": policy.name}


def _parameters(vhost: "VirtualHost"):
    """The vhost's runtime parameters (a shovel's), their values as they were given."""
    for (component, name), value in vhost.parameters.items():
        yield {"value": value, "vhost": vhost.name, "component": component, "name": name}


def _queues(vhost: "VirtualHost", with_vhost: bool):
    """Every queue but exclusive ones (they belong to a connection), durable or not, as RabbitMQ exports them."""
    for queue in vhost.queues.values():
        if queue.exclusive_owner is None:
            yield _scoped({"vhost": vhost.name, **queue.definition(), "arguments": json_safe(queue.arguments)},
                          with_vhost)


def _exported_exchange(name: str) -> bool:
    """The default exchange and the amq.* ones exist in every vhost: RabbitMQ leaves them out."""
    return name != "" and not name.startswith(RESERVED_PREFIX)


def _exchanges(vhost: "VirtualHost", with_vhost: bool):
    for exchange in vhost.exchanges.values():
        if _exported_exchange(exchange.name):
            yield _scoped({"vhost": vhost.name, **exchange.definition(), "arguments": json_safe(exchange.arguments)},
                          with_vhost)


def _bindings(vhost: "VirtualHost", with_vhost: bool):
    """Bindings between exported objects (amq.* sources included); none to an exclusive queue."""
    for exchange in vhost.exchanges.values():
        if exchange is vhost.default_exchange:
            continue
        for binding in exchange.live_bindings():
            destination = binding.destination
            if not binding.destination_is_exchange and destination.exclusive_owner is not None:
                continue
            yield _scoped({"source": exchange.name, "vhost": vhost.name, "destination": destination.name,
                           "destination_type": binding.destination_type,
                           "routing_key": binding.routing_key, "arguments": json_safe(binding.arguments)},
                          with_vhost)


def _scoped(item: dict, with_vhost: bool) -> dict:
    """A vhost's own export names no vhost in its items."""
    if not with_vhost:
        del item["vhost"]
    return item


def json_safe(value: Any) -> Any:
    """An AMQP field value as JSON can carry it: bytes as text, decimals as numbers, timestamps as seconds."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


# --- import: reading the document --------------------------------------------------------------------------------
_REQUIRED = object()  # marks a key an item must have
_TYPE_NAMES = {str: "a string", bool: "true or false", int: "an integer", dict: "a JSON object", list: "a list"}


class _Item:
    """One item of a section, read key by key; every error names the item (by its position until its name is
    known)."""

    def __init__(self, section: str, index: int, data):
        self.label = f"{section}[{index}]"  # how errors name the item
        if not isinstance(data, dict):
            raise DefinitionsError(f"{self.label}: not a JSON object")
        self.data = data

    def get(self, key: str, kind: type, default=_REQUIRED):
        value = self.data.get(key, default)
        if value is _REQUIRED:
            raise self.error(f"'{key}' is missing")
        if value is not default and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise self.error(f"'{key}' must be {_TYPE_NAMES[kind]}, got {value!r}")
        return value

    def tags(self, value) -> list[str]:
        """Tags as RabbitMQ takes them: a list of strings or one comma-separated string."""
        if isinstance(value, str):
            return [tag.strip() for tag in value.split(",") if tag.strip()]
        if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
            raise self.error(f"'tags' must be a list of strings or a comma-separated string, got {value!r}")
        return list(value)

    def error(self, reason: str) -> DefinitionsError:
        return DefinitionsError(f"{self.label}: {reason}")


@dataclass
class _Plan:
    """What an import will do, every item checked; each entry is (label for errors, keyword arguments)."""

    vhosts: list[tuple[str, dict]] = field(default_factory=list)
    users: list[tuple[str, dict]] = field(default_factory=list)
    permissions: list[tuple[str, dict]] = field(default_factory=list)
    topic_permissions: list[tuple[str, dict]] = field(default_factory=list)
    # (label, vhost, set_policy's keyword arguments); operator policies too ("operator": True)
    policies: list[tuple[str, str, dict]] = field(default_factory=list)
    # (label, node.set_parameter's keyword arguments): runtime parameters of components other than operator_policy
    parameters: list[tuple[str, dict]] = field(default_factory=list)
    queues: list[tuple[str, dict]] = field(default_factory=list)
    exchanges: list[tuple[str, dict]] = field(default_factory=list)
    bindings: list[tuple[str, dict]] = field(default_factory=list)


def import_definitions(node: "Node", document, vhost: str | None = None) -> None:
    """Check the whole document, then apply it to node (to one vhost, named by vhost, as RabbitMQ's POST
    /api/definitions/{vhost}: its users, vhosts, permissions and topic permissions are ignored, and items take
    that vhost).
    DefinitionsError, before anything changed, if an item cannot be applied."""
    steps = importing(node, document, vhost)
    for step in steps:
        while isinstance(step, OffLoop):
            try:
                step = steps.send(step.call())
            except StopIteration:
                return


def vhosts_named(document) -> list[str]:
    """The names a definitions document's vhosts section gives (whether or not its items are otherwise right)."""
    items = document.get("vhosts") if isinstance(document, dict) else None
    return [item["name"] for item in items if isinstance(item, dict) and isinstance(item.get("name"), str)
            ] if isinstance(items, list) else []


def importing(node: "Node", document, vhost: str | None = None, check_only: bool = False) -> Steps:
    """import_definitions an item at a time: it yields after each item it checks and each change it makes, so that
    a caller on the event loop can let other work run between them (a 10 MB document holds 290,000 queues).
    ``check_only``: check the whole document and change nothing."""
    if not isinstance(document, dict):
        raise DefinitionsError("the definitions must be a JSON object")
    planner = _Planner(node, document, vhost)
    yield from planner.planning()
    if check_only:
        return
    plan = planner.result
    yield from _apply(node, plan)
    log.info("definitions imported%s: %d vhosts, %d users, %d permissions, %d topic permissions, %d policies, "
             "%d queues, %d exchanges, %d bindings", f" into vhost {vhost[:200]!r}" if vhost is not None else "",
             len(plan.vhosts), len(plan.users), len(plan.permissions), len(plan.topic_permissions),
             len(plan.policies), len(plan.queues), len(plan.exchanges), len(plan.bindings))


class _Planner:
    """Reads a definitions document into a _Plan, checking every item against the node and the document."""

    def __init__(self, node: "Node", document: dict, vhost: str | None):
        self.node = node
        self.document = document
        self.vhost = vhost  # the one vhost of a per-vhost import, else None
        self.result = _Plan()
        self.vhost_names = set(node.vhosts)  # vhosts that exist once the import is applied
        self.user_names = set(node.users)
        version = document.get("rabbit_version")
        # the hashing of users whose item names none: MD5 in an export of a RabbitMQ older than 3.6, as RabbitMQ
        self.default_hashing = ("rabbit_password_hashing_md5" if isinstance(version, str)
                                and version.startswith(MD5_RELEASES) else DEFAULT_HASHING)
        self.exchange_kinds: dict[tuple[str, str], str] = {  # (vhost, exchange) -> type, once applied
            (vhost_name, name): exchange.kind
            for vhost_name, existing in node.vhosts.items() for name, exchange in existing.exchanges.items()}
        self.queue_names = {(vhost_name, name) for vhost_name, existing in node.vhosts.items()
                            for name in existing.queues}

    def planning(self) -> Iterator[None]:
        """Check the document's items into self.result, yielding after each."""
        if self.vhost is None:
            yield from self._read("vhosts", self._vhost)
            yield from self._read("users", self._user)
            yield from self._read("permissions", self._permission)
            yield from self._read("topic_permissions", self._topic_permission)
        yield from self._read("policies", self._policy)
        yield from self._read("parameters", self._parameter)
        yield from self._read("queues", self._queue)
        yield from self._read("exchanges", self._exchange)
        yield from self._read("bindings", self._binding)

    def _read(self, section: str, read_one) -> Iterator[None]:
        items = self.document.get(section, [])
        if not isinstance(items, list):
            raise DefinitionsError(f"'{section}' must be a list, got {type(items).__name__}")
        for index, data in enumerate(items):
            read_one(_Item(section, index, data))
            yield

    @staticmethod
    def _check_shortstr(item: _Item, **values: str) -> None:
        """Names and routing keys must fit in an AMQP short string, as through the other doors."""
        for what, value in values.items():
            if problem := shortstr_problem(what, value):
                raise item.error(problem)

    def _vhost_of(self, item: _Item) -> str:
        """The vhost an item belongs to: the import's one, or its own "vhost" key (which must name a vhost that
        exists or that the import creates)."""
        if self.vhost is not None:
            return self.vhost
        name = item.get("vhost", str)
        if name not in self.vhost_names:
            raise item.error(f"no vhost '{name}'")
        return name

    # --- access control ---------------------------------------------------------------------------------------
    def _vhost(self, item: _Item) -> None:
        name = item.get("name", str)
        item.label = f"vhost '{name}'"
        self._check_shortstr(item, name=name)
        # What the item leaves out stays as it is (a RabbitMQ 3.10 export names its vhosts only); RabbitMQ 3.11+
        # also puts the description and tags in "metadata".
        current = self.node.vhosts.get(name)
        metadata = item.get("metadata", dict, {})
        description = item.get("description", str, metadata.get("description", current.description if current
                                                                 else ""))
        tags = item.tags(item.data.get("tags", metadata.get("tags", current.tags if current else [])))
        queue_type = item.get("default_queue_type", str, current.default_queue_type if current else None)
        self.vhost_names.add(name)
        self.exchange_kinds.update(((name, exchange), kind) for exchange, kind in PREDECLARED_EXCHANGES.items())
        self.result.vhosts.append((item.label, {"name": name, "description": description, "tags": tags,
                                                "default_queue_type": queue_type}))

    def _user(self, item: _Item) -> None:
        name = item.get("name", str)
        item.label = f"user '{name}'"
        password = item.get("password", str, None)
        password_hash = item.get("password_hash", str, None)
        algorithm = item.get("hashing_algorithm", str, self.default_hashing)
        if algorithm not in HASHING_ALGORITHMS:
            raise item.error(f"unknown hashing_algorithm '{algorithm}' (known: {', '.join(HASHING_ALGORITHMS)})")
        if password is None and password_hash is not None and not valid_password_hash(password_hash, algorithm):
            raise item.error(f"password_hash is not a base64-encoded salted hash of {algorithm}")
        self.user_names.add(name)
        self.result.users.append((item.label, {
            "name": name, "password": password, "password_hash": password_hash, "hashing_algorithm": algorithm,
            "tags": item.tags(item.data.get("tags", []))}))

    def _permission(self, item: _Item) -> None:
        user = item.get("user", str)
        item.label = f"permission of user '{user}'"
        vhost = self._vhost_of(item)
        item.label = f"permission of user '{user}' in vhost '{vhost}'"
        if user not in self.user_names:
            raise item.error(f"no user '{user}'")
        patterns = {kind: item.get(kind, str) for kind in ("configure", "write", "read")}
        for kind, pattern in patterns.items():
            try:
                compile_pattern(pattern)
            except re.error as error:
                raise item.error(f"'{kind}' is not a valid regular expression: {error}") from None
            except PatternError as error:
                raise item.error(f"'{kind}': {error}") from None
        self.result.permissions.append((item.label, {"user": user, "vhost": vhost, **patterns}))

    def _topic_permission(self, item: _Item) -> None:
        user = item.get("user", str)
        item.label = f"topic permission of user '{user}'"
        vhost = self._vhost_of(item)
        exchange = item.get("exchange", str)
        item.label = f"topic permission of user '{user}' in vhost '{vhost}' on exchange '{exchange}'"
        if user not in self.user_names:
            raise item.error(f"no user '{user}'")
        patterns = {kind: item.get(kind, str) for kind in ("write", "read")}
        try:
            TopicPermission(user, vhost, exchange, **patterns)
        except re.error as error:
            raise item.error(f"not a valid regular expression: {error}") from None
        except PatternError as error:
            raise item.error(str(error)) from None
        self.result.topic_permissions.append((item.label, {"user": user, "vhost": vhost, "exchange": exchange,
                                                           **patterns}))

    # --- policies ---------------------------------------------------------------------------------------------
    def _policy(self, item: _Item, operator: bool = False, settings: dict | None = None) -> None:
        name = item.get("name", str)
        item.label = f"{'operator ' if operator else ''}policy '{name}'"
        vhost = self._vhost_of(item)
        item.label += f" in vhost '{vhost}'"
        fields = item.data if settings is None else settings  # an operator policy's are in its "value"
        try:  # checked by the policy model, with RabbitMQ's reasons
            policy = make_policy(vhost, name, fields.get("pattern"), fields.get("definition"),
                                 fields.get("priority", 0), fields.get("apply-to", "all"), operator)
        except PolicyError as error:
            raise item.error(str(error)) from None
        self.result.policies.append((item.label, vhost, {
            "name": name, "pattern": policy.pattern, "definition": policy.definition, "priority": policy.priority,
            "apply_to": policy.apply_to, "operator": operator}))

    def _parameter(self, item: _Item) -> None:
        """Runtime parameters: operator policies, and those of the node's components (shovels), which check them."""
        component = item.get("component", str)
        if component == OPERATOR_POLICY:
            self._policy(item, operator=True, settings=item.get("value", dict))
            return
        name = item.get("name", str)
        item.label = f"parameter '{name}' of component '{component}'"
        vhost = self._vhost_of(item)
        item.label += f" in vhost '{vhost}'"
        handler = self.node.parameter_components.get(component)
        if handler is None:
            known = "', '".join((OPERATOR_POLICY, *sorted(self.node.parameter_components)))
            raise item.error(f"unknown parameter component '{component}' (Warren knows '{known}')")
        value = item.get("value", object)
        try:
            handler.check(vhost, name, value, None)
        except ValueError as error:
            raise item.error(str(error)) from None
        self.result.parameters.append((item.label, {"vhost_name": vhost, "component": component, "name": name,
                                                    "value": value}))

    # --- queues, exchanges, bindings --------------------------------------------------------------------------
    def _queue(self, item: _Item) -> None:
        name = item.get("name", str)
        item.label = f"queue '{name}'"
        self._check_shortstr(item, name=name)
        vhost = self._vhost_of(item)
        item.label += f" in vhost '{vhost}'"
        declared = {"durable": item.get("durable", bool, True), "auto_delete": item.get("auto_delete", bool, False),
                    "arguments": item.get("arguments", dict, {})}
        if not name or name.startswith(RESERVED_PREFIX):
            log.warning("definitions import: skipping %s: the name is reserved", item.label)
            return
        self._check(item, lambda: validate_queue_arguments(name, vhost, declared["arguments"]))
        existing = self._existing_queue(vhost, name)
        if existing is not None:
            self._keep_existing(item, lambda: check_queue_equivalent(
                name, vhost, {**existing.definition(), "exclusive": existing.exclusive_owner is not None},
                {"exclusive": False, **declared}))
            return
        self.queue_names.add((vhost, name))
        self.result.queues.append((item.label, {"vhost": vhost, "name": name, **declared}))

    def _exchange(self, item: _Item) -> None:
        name = item.get("name", str)
        item.label = f"exchange '{name}'"
        self._check_shortstr(item, name=name)
        vhost = self._vhost_of(item)
        item.label += f" in vhost '{vhost}'"
        kind = item.get("type", str)
        declared = {"durable": item.get("durable", bool, True), "auto_delete": item.get("auto_delete", bool, False),
                    "internal": item.get("internal", bool, False), "arguments": item.get("arguments", dict, {})}
        if kind not in EXCHANGE_TYPES:
            raise item.error(f"unknown exchange type '{kind}'")
        if not name or name.startswith(RESERVED_PREFIX):
            log.warning("definitions import: skipping %s: the name is reserved", item.label)
            return
        self._check(item, lambda: validate_exchange_arguments(name, vhost, kind, declared["arguments"]))
        existing = self.node.vhosts[vhost].exchanges.get(name) if vhost in self.node.vhosts else None
        if existing is not None:
            self._keep_existing(item, lambda: check_exchange_equivalent(
                name, vhost, existing.definition(), {"type": kind, **declared}))
            return
        self.exchange_kinds[vhost, name] = kind
        self.result.exchanges.append((item.label, {"vhost": vhost, "name": name, "kind": kind, **declared}))

    def _binding(self, item: _Item) -> None:
        source, destination = item.get("source", str), item.get("destination", str)
        destination_type = item.get("destination_type", str)
        item.label = f"binding of {destination_type} '{destination}' to exchange '{source}'"
        vhost = self._vhost_of(item)
        item.label += f" in vhost '{vhost}'"
        routing_key, arguments = item.get("routing_key", str, ""), item.get("arguments", dict, {})
        self._check_shortstr(item, source=source, destination=destination, routing_key=routing_key)
        if destination_type not in ("queue", "exchange"):
            raise item.error(f"destination_type must be 'queue' or 'exchange', got '{destination_type}'")
        source_kind = self.exchange_kinds.get((vhost, source))
        destination_exists = ((vhost, destination) in self.queue_names if destination_type == "queue"
                              else (vhost, destination) in self.exchange_kinds)
        if source_kind is None or not destination_exists or "" in (source, destination):
            log.warning("definitions import: skipping %s: its source or destination does not exist", item.label)
            return
        problem = validate_x_match(arguments) if source_kind == "headers" else None
        if problem:
            raise item.error(problem)
        self.result.bindings.append((item.label, {
            "vhost": vhost, "source": source, "destination": destination, "destination_type": destination_type,
            "routing_key": routing_key, "arguments": arguments}))

    def _existing_queue(self, vhost: str, name: str) -> "Queue | None":
        existing = self.node.vhosts.get(vhost)
        return existing.queues.get(name) if existing is not None else None

    @staticmethod
    def _check(item: _Item, check) -> None:
        """Run a model check that raises RabbitMQ's AMQP error; its text becomes the import's error."""
        try:
            check()
        except AMQPError as error:
            raise item.error(error.reply_text) from None

    @staticmethod
    def _keep_existing(item: _Item, check_equivalent) -> None:
        """An object of that name exists: it is kept as it is (as RabbitMQ does), with a warning if it differs."""
        try:
            check_equivalent()
        except AMQPError as error:
            log.warning("definitions import: keeping the existing %s, which differs: %s", item.label,
                        error.reply_text)


# --- import: applying the plan -----------------------------------------------------------------------------------
def _apply(node: "Node", plan: _Plan) -> Steps:
    """Apply a checked plan in RabbitMQ's order: vhosts, users, permissions, topic permissions, policies, queues,
    exchanges, bindings; yield after each change. The policies are applied to the queues and exchanges that exist
    once, after the last of them."""
    for label, vhost in plan.vhosts:
        yield _applying(label, lambda: node.add_vhost(**vhost))
    for label, user in plan.users:
        yield _applying(label, lambda: node.put_user(**user))
    for label, permission in plan.permissions:
        yield _applying(label, lambda: node.set_permissions(**permission))
    for label, topic_permission in plan.topic_permissions:
        yield _applying(label, lambda: node.set_topic_permissions(**topic_permission))
    for label, vhost_name, policy in plan.policies:
        yield _applying(label, lambda: node.vhosts[vhost_name].set_policy(**policy, reapply=False))
    for vhost_name in dict.fromkeys(vhost_name for _, vhost_name, _ in plan.policies):
        vhost = node.vhosts.get(vhost_name)
        if vhost is not None:  # (unless deleted by another client meanwhile)
            choices = yield OffLoop(vhost.policy_snapshot().choose)
            yield from vhost.applying_policy_choices(choices)
    for label, queue in plan.queues:
        yield _applying(label, lambda: node.vhosts[queue["vhost"]].declare_queue(
            queue["name"], OPERATOR_OWNER, False, queue["durable"], False, queue["auto_delete"], queue["arguments"]))
    for label, exchange in plan.exchanges:
        yield _applying(label, lambda: node.vhosts[exchange["vhost"]].declare_exchange(
            exchange["name"], exchange["kind"], False, exchange["durable"], exchange["auto_delete"],
            exchange["internal"], exchange["arguments"]))
    for label, binding in plan.bindings:
        yield _applying(label, lambda: _bind(node.vhosts[binding["vhost"]], binding))
    for label, parameter in plan.parameters:  # (last: a shovel finds the queues it names)
        yield _applying(label, lambda: node.set_parameter(**parameter))


def _bind(vhost: "VirtualHost", binding: dict) -> None:
    table = vhost.queues if binding["destination_type"] == "queue" else vhost.exchanges
    vhost.bind(vhost.exchanges[binding["source"]], table[binding["destination"]], binding["routing_key"],
               binding["arguments"])


def _applying(label: str, change) -> None:
    """Make one change of a checked plan; should the model still refuse it, the error names the item (the changes
    before it stay made)."""
    try:
        change()
    except (AMQPError, ValueError) as error:
        reason = error.reply_text if isinstance(error, AMQPError) else str(error)
        raise DefinitionsError(f"{label}: {reason}") from error
    except KeyError as error:  # deleted by another client while a sliced import went on
        raise DefinitionsError(f"{label}: {error} no longer exists") from error
