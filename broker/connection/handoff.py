"""Handing a client's socket to the worker process that leads the vhost it opens.

The front door that accepted a connection answers its handshake up to connection.open
(broker.connection.front_door). The socket itself then goes to the worker that leads the vhost named there, over a
datagram socket (SCM_RIGHTS), with what the front door answered and every byte the client sent after its protocol
header; the receiving worker reads them through its ordinary handshake. No byte of the connection passes through a
second process afterwards, except over TLS, whose session stays where it was accepted (broker.connection.splice).

A hand-off is one datagram: a 4-byte length of the JSON state, the JSON, then the client's bytes.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any, Callable, Coroutine

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
    """What a front door answered of a client's handshake, and the client's bytes."""

    user: str  # who logged in, where the front door checked the login ("" where it did not)
    peer: list  # [host, port] of the client (the proven PROXY header of another node may have named it)
    local: list  # [host, port] it connected to
    connected_at: int  # wall-clock milliseconds when the socket was accepted
    received_bytes: int  # read before the bytes that go along (the protocol header)
    sent_bytes: int  # written by the front door
    # the client speaks TLS: to the worker that handed it over (which keeps the session), or to the cluster node
    # that forwarded it (its PROXY header said so)
    tls: bool = False
    # Handshake frames the front door answered (1: connection.start, 2: and connection.tune): the receiving worker
    # runs the handshake from start-ok on, leaving them unsent
    answered: int = 1
    data: bytes = b""  # the client's bytes after its protocol header (MQTT: all of them)
    protocol: str = "amqp"  # or "mqtt" (broker.connection.mqtt.front_door)
    # an MQTT client over a WebSocket: to the worker that handed it over (which keeps the WebSocket), or to the node
    # that forwarded it (its PROXY header said so)
    web: bool = False


def encode(handed: HandedOver) -> bytes:
    state = asdict(handed)
    data = state.pop("data")
    text = json.dumps(state).encode()
    return _LENGTH.pack(len(text)) + text + data


def decode(datagram: bytes) -> HandedOver:
    (size,) = _LENGTH.unpack_from(datagram)
    state = json.loads(datagram[_LENGTH.size:_LENGTH.size + size])
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


def hand_over(transport: Any, sender: socket.socket, handed: HandedOver, keep: Callable[[Coroutine], None]) -> None:
    """Send the client's socket with its state, then let it go here; over a TLS session or a WebSocket of this
    transport's, which stays here, one end of a socket pair goes instead, joined here to the client
    (broker.connection.splice, run by keep). OSError when it cannot go, the transport left as it was."""
    sock = transport.get_extra_info("socket")
    if sock is not None and transport.get_extra_info("sslcontext") is None:
        send(sender, sock.fileno(), handed)
        transport.close()  # the receiving worker holds its own copy
        return
    inner, handed_end = socket.socketpair()
    try:
        send(sender, handed_end.fileno(), handed)
    except BaseException:  # (the caller answers an OSError; whatever it is, the pair is not left open)
        inner.close()
        raise
    finally:
        handed_end.close()  # likewise
    keep(splice(transport, inner))


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
