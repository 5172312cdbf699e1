"""Handing a client's socket to the worker process that leads the vhost it opens.

The worker that accepted a connection runs its handshake up to connection.open. When the vhost named there is led
by another worker, the socket itself goes to that worker over a datagram socket (SCM_RIGHTS), with what the
handshake settled and the bytes read from connection.open on; the receiving worker carries on as if it had read
them itself. No byte of the connection passes through a second process afterwards, except over TLS, whose session
stays where it was accepted (broker.connection.splice).

A hand-off is one datagram: a 4-byte length of the JSON state, the JSON, then the client's bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any, Callable

from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from broker.connection.splice import splice

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
# How a client is told that the worker leading its vhost could not be handed the connection
UNAVAILABLE = "CONNECTION_FORCED - broker forced connection closure with reason 'vhost unavailable'"
# The largest hand-off: a read of the event loop (256 KiB at most) and the state; a receive reads up to it. Each
# hand-off socket's buffers are made this large: room for it, or for a thousand-odd usual hand-offs (under 1 KiB)
# waiting for a busy worker (a socket pair's datagrams are bounded by that, not by net.unix.max_dgram_qlen).
DATAGRAM_MAX = 1024 * 1024


@dataclass
class HandedOver:
    """What the handshake settled before connection.open, as the worker that ran it saw it."""

    user: str  # who logged in (from a front door: "" where it did not check the login)
    client_properties: bytes  # connection.start-ok's client properties, as an AMQP field table
    frame_max: int  # negotiated in tune-ok
    channel_max: int
    heartbeat: int
    peer: list  # [host, port] of the client (the proven PROXY header of another node may have named it)
    local: list  # [host, port] it connected to
    connected_at: int  # wall-clock milliseconds when the socket was accepted
    received_bytes: int  # read before connection.open
    sent_bytes: int  # written before connection.open
    # the client speaks TLS: to the worker that handed it over (which keeps the session), or to the cluster node
    # that forwarded it (its PROXY header said so)
    tls: bool = False
    # Handshake frames a front door answered without a login (1: connection.start, 2: and connection.tune): the
    # receiving worker runs the handshake from start-ok on, with data from there. 0: handed after connection.open.
    answered: int = 0
    data: bytes = b""  # the client's bytes from connection.open on (from start-ok on, when a front door answered)

    def properties(self) -> dict:
        return pamqp_decode.field_table(self.client_properties)[1] if self.client_properties else {}


def encode_properties(properties: dict) -> bytes:
    return pamqp_encode.field_table(properties)


def encode(handed: HandedOver) -> bytes:
    state = asdict(handed)
    data = state.pop("data")
    state["client_properties"] = handed.client_properties.hex()
    text = json.dumps(state).encode()
    return _LENGTH.pack(len(text)) + text + data


def decode(datagram: bytes) -> HandedOver:
    (size,) = _LENGTH.unpack_from(datagram)
    state = json.loads(datagram[_LENGTH.size:_LENGTH.size + size])
    state["client_properties"] = bytes.fromhex(state["client_properties"])
    return HandedOver(**state, data=datagram[_LENGTH.size + size:])


def handoff_pair() -> tuple[socket.socket, socket.socket]:
    """A worker's hand-off socket pair: (where it receives, what the others send to), both non-blocking."""
    receiving, sending = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for sock in (receiving, sending):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, DATAGRAM_MAX)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, DATAGRAM_MAX)
        sock.setblocking(False)
    return receiving, sending


def send(sending: socket.socket, client: int, handed: HandedOver) -> None:
    """Send the client's socket (a file descriptor) with its state; raises OSError when it cannot go (the receiving
    worker's buffer is full, or the datagram too large)."""
    datagram = encode(handed)
    if len(datagram) > DATAGRAM_MAX:
        raise OSError(f"a hand-off of {len(datagram)} bytes is over {DATAGRAM_MAX}")
    socket.send_fds(sending, [datagram], [client])


def hand_over(transport: Any, sender: socket.socket, handed: HandedOver, splicing: set[asyncio.Task]) -> None:
    """Send the client's socket with its state, then let it go here; over a TLS session of this transport's, which
    stays here, one end of a socket pair goes instead, joined here to the client (broker.connection.splice; the task
    in splicing until it is done). OSError when it cannot go, the transport left as it was."""
    session_here = transport.get_extra_info("sslcontext") is not None
    inner, handed_end = socket.socketpair() if session_here else (None, None)
    try:
        sent = handed_end if handed_end is not None else transport.get_extra_info("socket")
        send(sender, sent.fileno(), handed)
    except OSError:
        if inner is not None:
            inner.close()
        raise
    finally:
        if handed_end is not None:
            handed_end.close()  # the receiving worker holds its own copy
    if inner is None:
        transport.close()  # likewise
        return
    task = asyncio.get_running_loop().create_task(splice(transport, inner))
    splicing.add(task)
    task.add_done_callback(splicing.discard)


def receive_all(receiving: socket.socket, take: Callable[[socket.socket, HandedOver], Any]) -> None:
    """Take every hand-off waiting on the socket (called when it is readable)."""
    while True:
        try:
            datagram, fds, flags, _ = socket.recv_fds(receiving, DATAGRAM_MAX, 1)
        except (BlockingIOError, InterruptedError):
            return
        client = socket.socket(fileno=fds[0]) if fds else None
        if client is None or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            log.error("dropped a malformed connection hand-off (%d bytes, %d sockets)", len(datagram), len(fds))
            if client is not None:
                client.close()
            continue
        try:
            handed = decode(datagram)
        except (ValueError, TypeError, KeyError, struct.error) as error:
            log.error("dropped a malformed connection hand-off: %s", error)
            client.close()
            continue
        take(client, handed)


class Handoffs:
    """One worker's side of hand-offs: which worker leads each vhost, and where to send a connection to each."""

    def __init__(self, worker: int, leaders: dict[str, int], senders: dict[int, socket.socket]):
        self.worker = worker  # this worker's number
        self.leaders = leaders  # vhost name -> number of the worker that leads it
        self.senders = senders  # worker number -> the socket that reaches its hand-off receiver
        self.down: set[int] = set()  # workers that ended and are starting again: their vhosts are down meanwhile

    def leader_down(self, vhost: str) -> bool:
        return self.leaders.get(vhost, self.worker) in self.down

    def sender_for(self, vhost: str) -> socket.socket | None:
        """Where a connection to ``vhost`` goes, or None if this worker serves it (or no worker leads it: this one
        then answers connection.open itself, with RabbitMQ's 'vhost not found')."""
        leader = self.leaders.get(vhost, self.worker)
        return None if leader == self.worker else self.senders.get(leader)
