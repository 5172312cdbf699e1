"""The names the store knows objects by (their store keys): a queue's messages and definition, an exchange's, a
policy's, a permission's, a topic permission's and a binding's definitions, a delayed exchange's waiting messages.

A key is made of the names that identify the object, as RabbitMQ identifies a resource by its vhost and its name,
so that no two objects share one: composite_key writes the separator and its escape character out of each name.
Earlier versions joined the names as they were (a queue's by "|", a policy's by NUL), and vhost "a" with queue
"b|c" shared "a|b|c" with vhost "a|b" and queue "c"; broker.model.upgrade moves such a data dir's keys.
"""

from __future__ import annotations

SEPARATOR = "|"  # between the names of a key
ESCAPE = "\\"  # before a separator, an escape character or a NUL (written "0") inside a name
DELAYED_PREFIX = "\x00delayed|"  # before a delayed exchange's key: no key made of names holds a NUL


def composite_key(*names: str) -> str:
    """One key for these names, no other names' key: in each name the escape character, the separator and NUL are
    written \\\\, \\| and \\0, and the names are joined by the separator. Names without those characters give the
    key they gave when they were joined as they were."""
    return SEPARATOR.join([_escaped(name) for name in names])


def _escaped(name: str) -> str:
    if ESCAPE in name or SEPARATOR in name or "\x00" in name:
        return name.replace(ESCAPE, ESCAPE * 2).replace(SEPARATOR, ESCAPE + SEPARATOR).replace("\x00", ESCAPE + "0")
    return name


def queue_key(vhost_name: str, queue_name: str) -> str:
    """The name a queue's messages and definition have in the store."""
    return composite_key(vhost_name, queue_name)


def exchange_key(vhost_name: str, exchange_name: str) -> str:
    """The name an exchange's definition has in the definitions log."""
    return composite_key(vhost_name, exchange_name)


def delayed_key(vhost_name: str, exchange_name: str) -> str:
    """The name the waiting messages of a delayed exchange have in the store."""
    return DELAYED_PREFIX + exchange_key(vhost_name, exchange_name)


def policy_key(vhost_name: str, policy_name: str) -> str:
    """The name a policy (or operator policy) has in the definitions log."""
    return composite_key(vhost_name, policy_name)


def parameter_key(vhost_name: str, component: str, name: str) -> str:
    """The name a runtime parameter has in the definitions log."""
    return composite_key(vhost_name, component, name)


def permission_key(vhost_name: str, user: str) -> str:
    """The name a permission has in the definitions log."""
    return composite_key(vhost_name, user)


def topic_permission_key(vhost_name: str, user: str, exchange: str) -> str:
    """The name a topic permission has in the definitions log."""
    return composite_key(vhost_name, user, exchange)


def binding_key(vhost_name: str, source: str, destination_kind: str, destination: str, routing_key: str,
                arguments_key: str) -> str:
    """The name a binding has in the definitions log (arguments_key: exchange.canonical_arguments of its
    arguments)."""
    return composite_key(vhost_name, source, destination_kind, destination, routing_key, arguments_key)
