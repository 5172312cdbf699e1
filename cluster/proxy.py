"""A follower's AMQP ports: each client's TCP stream goes to the leader's AMQP port, after a PROXY v2 header that names
the client and the proofs that both nodes know the cluster's secret (the leader believes the header for that proof
alone: protocol.stream_start). A client of the amqps port has its TLS session end here: its bytes go on in plain
TCP, and the header says the client speaks TLS.

Bytes are copied as they come, with back-pressure both ways (broker.connection.splice): when one socket holds more
than its high-water mark unsent, the other is not read until it drains. Either socket closing closes the other."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

from broker.connection.connection import HANDSHAKE_TIMEOUT
from broker.connection.front_door import CONNECT_TIMEOUT, ForwardEnd
from broker.connection.peer_log import PeerLog
from broker.connection.splice import SpliceEnd
from protocol.stream_start import Forwarding

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # lines about one address at a time: clients retrying fast cannot flood the log


class _Client(SpliceEnd):
    """A client's socket: accepted, it waits unread while a connection to the leader is made and both nodes prove
    themselves (ForwardEnd), then is joined to it."""

    def __init__(self, forwarder: AmqpForwarder) -> None:
        super().__init__()
        self.forwarder = forwarder
        self.connecting: asyncio.Task | None = None  # makes the connection to the leader (done once forwarding)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        leader, secret = self.forwarder.leader(), self.forwarder.secret()
        if leader is None or not secret:
            transport.close()  # no leader known (or no secret to prove this node with): the client tries another
            return
        forwarding = Forwarding(secret, transport.get_extra_info("peername"), transport.get_extra_info("sockname"),
                                tls=transport.get_extra_info("sslcontext") is not None)
        self.forwarder.clients.add(self)
        self.transport.pause_reading()  # until the leader's socket takes the client's bytes (uvloop reads once more)
        self.connecting = asyncio.get_running_loop().create_task(self._connect(leader, forwarding))

    async def _connect(self, leader: tuple[str, int], forwarding: Forwarding) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await asyncio.get_running_loop().create_connection(
                    lambda: ForwardEnd(0, forwarding, b"", self), *leader, ssl=self.forwarder.towards)
        except OSError as error:  # TimeoutError included
            reason = "no answer in time" if isinstance(error, TimeoutError) else error.strerror or str(error)
            peer_log.warning(leader[0], "cannot forward a client to the leader at %s:%d: %s", *leader, reason)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.forwarder.clients.discard(self)
        if self.connecting is not None:
            self.connecting.cancel()
        super().connection_lost(exc)

    def abort(self) -> None:
        """Drop both sockets at once, whatever they hold unsent."""
        if self.connecting is not None:
            self.connecting.cancel()
        self.transport.abort()
        if self.other is not None:
            self.other.transport.abort()


class AmqpForwarder:
    """A TCP listener whose every client is forwarded to the leader's AMQP address, as leader() names it when the
    client connects; while it names none, clients are closed at once so that they try another node."""

    def __init__(self, leader: Callable[[], tuple[str, int] | None], secret: Callable[[], str],
                 towards: ssl.SSLContext | None = None) -> None:
        self.leader = leader
        self.secret = secret  # the cluster's, which this node proves itself with to the leader
        self.towards = towards  # [cluster] tls: the TLS of the forwards (to the leader's amqps port)
        self.listener: asyncio.Server | None = None
        self.clients: set[_Client] = set()  # accepted and not closed yet: forwarded, or waiting for the leader

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen on host:port; with tls, the amqps port: clients that do not finish their TLS handshake within the
        handshake timeout are dropped, as the broker's own amqps port drops them."""
        self.listener = await asyncio.get_running_loop().create_server(
            lambda: _Client(self), host, port, reuse_address=True, backlog=1024, ssl=tls,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls is not None else None)

    @property
    def port(self) -> int:
        assert self.listener is not None, "started"
        return self.listener.sockets[0].getsockname()[1]

    def close_all(self) -> None:
        """Drop every forwarded connection at once (the leader changed: its clients reconnect)."""
        for client in list(self.clients):
            client.abort()

    async def stop(self) -> None:
        """Stop listening and drop every forwarded connection."""
        assert self.listener is not None, "started"
        self.listener.close()
        self.close_all()
        await self.listener.wait_closed()
