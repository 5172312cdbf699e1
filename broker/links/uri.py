"""AMQP URIs as RabbitMQ reads them (its URI spec): ``amqp[s]://user:password@host:port/vhost?heartbeat=10``.

A URI without a host (``amqp://``, ``amqp:///vhost``) names this node. RabbitMQ connects such a shovel directly, as
an internal user with every right; Warren connects it to its own AMQP port over loopback, as the URI's user
(guest/guest when it names none), whose permissions apply."""

from __future__ import annotations

import dataclasses
import re
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
QUERY_KEYS = frozenset(("heartbeat", "connection_timeout", "verify", "cacertfile", "certfile", "keyfile",
                        "server_name_indication", "auth_mechanism", "channel_max", "frame_max"))
VERIFY = {"verify_peer": True, "verify_none": False}


class UriError(ValueError):
    """The URI cannot be used; the text says why."""


@dataclasses.dataclass(frozen=True)
class Address:
    """Where a link connects, and as whom."""

    host: str
    port: int
    vhost: str
    user: str
    password: str
    tls: bool
    heartbeat: int  # seconds asked for (0: none; the peer's own proposal then applies)
    connection_timeout: float  # seconds a connection and its handshake may take
    local: bool = False  # the URI names no host: this node (its host and port are filled in when it connects)
    verify: bool = True  # amqps: the peer's certificate checked against cacertfile (or the system's CAs)
    cacertfile: str | None = None
    certfile: str | None = None  # amqps: this side's certificate, for a peer that asks for one
    keyfile: str | None = None

    @property
    def shown(self) -> str:
        """Where it connects, without credentials."""
        return f"{'amqps' if self.tls else 'amqp'}://{self.host}:{self.port}/{quote(self.vhost, safe='')}"


def parse(uri: str, default_vhost: str = "/") -> Address:
    """The address a URI names (a URI without a path: default_vhost); UriError if it names none."""
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as error:
        raise UriError(str(error)) from None
    if parts.scheme not in DEFAULT_PORTS:
        raise UriError(f"the scheme must be amqp or amqps, not {parts.scheme!r}")
    if not parts.hostname and (port is not None or parts.scheme == "amqps"):
        raise UriError("a port or amqps needs a host (amqp:// alone names this node)")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - QUERY_KEYS)
    if unknown:
        raise UriError(f"unknown query parameters {unknown}")
    value = {key: values[-1] for key, values in query.items()}
    try:
        heartbeat = int(value.get("heartbeat", 60))
        timeout = float(value.get("connection_timeout", 30000)) / 1000  # (milliseconds, as RabbitMQ's)
    except ValueError:
        raise UriError("heartbeat and connection_timeout must be numbers") from None
    if heartbeat < 0 or timeout <= 0:
        raise UriError("heartbeat must be 0 or more, connection_timeout more than 0")
    if value.get("verify", "verify_peer") not in VERIFY:
        raise UriError("verify must be verify_peer or verify_none")
    path = parts.path
    vhost = default_vhost if not path else unquote(path[1:])
    return Address(
        host=parts.hostname or "", port=port or DEFAULT_PORTS[parts.scheme], vhost=vhost, local=not parts.hostname,
        user=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        tls=parts.scheme == "amqps", heartbeat=heartbeat, connection_timeout=timeout,
        verify=VERIFY[value.get("verify", "verify_peer")], cacertfile=value.get("cacertfile"),
        certfile=value.get("certfile"), keyfile=value.get("keyfile"))


def without_credentials(uri: str) -> str:
    """The URI as RabbitMQ shows a shovel's (amqp_uri:remove_credentials): its user, password and query left out,
    ``amqp://host:5672/%2f``."""
    try:
        parts = urlsplit(uri)
        if not parts.scheme or not parts.netloc:
            raise ValueError("not a URI")
        port = f":{parts.port}" if parts.port is not None else ""
        host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "")
        return f"{parts.scheme}://{host}{port}{parts.path}"
    except ValueError:
        return re.sub(r"://[^@/]*@", "://", uri)
