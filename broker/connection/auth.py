"""Authentication: the SASL mechanisms PLAIN and AMQPLAIN against the node's users."""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from broker.model.node import Node
from protocol.field_table import field_table


class Login(NamedTuple):
    """What a start-ok asked for, and the verdict."""

    user: str  # the user name the client gave, for the log ("" when its response cannot be read)
    accepted: bool
    reason: str = ""  # why it was refused, in RabbitMQ's words, for the log (never for the client)


INVALID_CREDENTIALS = "invalid credentials"  # (a wrong password or user name, or a response that cannot be read)


def parse_response(mechanism: str, response: bytes | str) -> tuple[str, str] | None:
    """(username, password) from a start-ok response, or None if it cannot be read."""
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        # RabbitMQ's rabbit_auth_mechanism_plain (3.10 and 4.x alike) reads "\0user\0password" only: a response
        # that names an authorization identity (RFC 4616's "authzid\0user\0password") is refused, whatever the
        # identity, so that no client can log in as one user and act as another.
        parts = raw.split(b"\x00")
        if len(parts) != 3 or parts[0]:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            # The response is a field table without its 4-byte length prefix.
            _, table = field_table(len(raw).to_bytes(4, "big") + raw)
        except ValueError:
            return None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, (str, bytes)) or not isinstance(password, (str, bytes)):
            return None
        as_text = lambda value: value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return as_text(login), as_text(password)
    return None


def is_loopback(address: str) -> bool:
    """Whether address (an IP address, v4 or v6) is this machine's loopback: any of 127.0.0.0/8, or ::1."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a v4 client of a dual-stack listener (::ffff:127.0.0.1)
    return ip.is_loopback


def may_log_in_from(user: str, loopback_users: list[str], peer_address: str) -> bool:
    """Whether user may log in from peer_address: a loopback user (RabbitMQ's loopback_users) only from this
    machine. The same rule for AMQP and the management API."""
    return user not in loopback_users or is_loopback(peer_address)


def authenticate(node: Node, loopback_users: list[str], mechanism: str, response: bytes | str,
                 peer_address: str) -> Login:
    """Check a login against the node's users (loopback users from elsewhere are refused)."""
    credentials = parse_response(mechanism, response)
    if credentials is None:
        return Login("", False, INVALID_CREDENTIALS)
    user, password = credentials
    if node.authenticate(user, password) is None:
        return Login(user, False, INVALID_CREDENTIALS)
    if not may_log_in_from(user, loopback_users, peer_address):
        return Login(user, False, f"user '{user[:100]}' can only connect via localhost")
    return Login(user, True)
