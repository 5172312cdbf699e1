"""A login checked at start-ok, and the answer to a refused one: the same wherever a client's handshake is read (its
connection, or the front door of a process that holds the node's users).

A refusal costs one log line naming the user, the peer and the mechanism. Its answer (403 to clients that announce
authentication_failure_close, a closed socket to others, as RabbitMQ) waits longer after each consecutive refusal
from the address (broker.connection.login_throttle, counted for the whole node with several workers), and never
longer than the throttle's longest wait. Nothing the client sends meanwhile is read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from pamqp import commands as spec

from broker.connection.auth import authenticate
from broker.connection.login_throttle import MAX_DELAY as MAX_FAILED_LOGIN_WAIT
from broker.connection.peer_log import PeerLog
from protocol.constants import ACCESS_REFUSED
from protocol.errors import reply_text

if TYPE_CHECKING:
    from broker.connection.server import Server

log = logging.getLogger("broker.connection.connection")
peer_log = PeerLog(log)


def capabilities(client_properties: dict) -> dict:
    """The capabilities table of a client's properties ({} if it sent none, or sent something else by that name)."""
    table = client_properties.get("capabilities")
    return table if isinstance(table, dict) else {}


def check_login(server: Server, start_ok: spec.Connection.StartOk, peer_address: str, peer: str) -> str | None:
    """The user a start-ok logs in, counted in the node's totals; None if the login is refused (then answer it with a
    Refusal). peer: the client's host:port, for the log."""
    node = server.node
    login = authenticate(node, server.config.loopback_users, start_ok.mechanism, start_ok.response, peer_address)
    node.counters.auth_attempts += 1
    if not login.accepted:
        node.counters.auth_failed += 1
        peer_log.warning(peer_address, "login refused for user %.100r from %s (mechanism %.40r): %s", login.user,
                         peer, start_ok.mechanism, login.reason)
        return None
    server.failed_logins.accepted(peer_address)
    return login.user


class Refusal:
    """A refused login's answer, on its way: ``answer(text)`` is called once the wait is over, with connection.close's
    reply text, or None for a client that expects no connection.close (close the socket)."""

    def __init__(self, server: Server, transport: Any, peer_address: str, start_ok: spec.Connection.StartOk,
                 answer: Callable[[str | None], None]) -> None:
        self.answer = answer
        self.text: str | None = None  # no connection.close for clients that do not expect one
        if capabilities(start_ok.client_properties or {}).get("authentication_failure_close"):
            self.text = reply_text(ACCESS_REFUSED, f"Login was refused using authentication mechanism "
                                                   f"{start_ok.mechanism}. For details see the broker logfile.")
        transport.pause_reading()
        self.loop = asyncio.get_running_loop()
        # answered after the longest wait at the latest, should the count be slow to come (a worker asks for it)
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(MAX_FAILED_LOGIN_WAIT, self._answer)
        server.failed_logins.count_refused(peer_address, server.config.failed_login_delay, self._wait)

    def _wait(self, delay: float) -> None:
        """The refused login's count came: answer after delay, and never after the longest wait from the refusal."""
        if self.timer is None:  # answered already, or the client left meanwhile
            return
        latest = self.timer.when()
        self.timer.cancel()
        delay = min(delay, latest - self.loop.time())
        if delay <= 0:
            self._answer()
            return
        self.timer = self.loop.call_later(delay, self._answer)

    def _answer(self) -> None:
        self.timer = None
        self.answer(self.text)

    def cancel(self) -> None:
        """The client left: nothing is answered."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
