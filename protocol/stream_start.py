"""The start of a client's byte stream: a trusted proxy's PROXY header first, where one may come, then AMQP's 8-byte
protocol header. A broker's connection and a cluster's front door read it alike. Bytes in, what they say out; no
sockets."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import proxy_header
from protocol.constants import PROTOCOL_HEADER


class WrongProtocolHeader(Exception):
    """The stream does not start with AMQP 0-9-1's protocol header (after the PROXY header, if one came): the peer is
    answered with ours and the socket closed, as the spec says."""


@dataclass(frozen=True)
class StreamStart:
    proxied: proxy_header.Proxied | None  # what a trusted proxy's PROXY header said; None without one
    rest: bytes  # what followed the protocol header


def read_start(data: bytes, proxy_allowed: bool) -> StreamStart | None:
    """What the bytes received so far start with (proxy_allowed: the peer may send a PROXY header first); None while
    they may still become a valid start. Raises proxy_header.ProxyHeaderError for a malformed PROXY header, and
    WrongProtocolHeader for anything else that is not a valid start."""
    proxied = None
    if proxy_allowed and proxy_header.could_start(data):
        parsed = proxy_header.parse(data)
        if parsed is None:
            return None
        proxied, data = parsed
    if len(data) < len(PROTOCOL_HEADER) and PROTOCOL_HEADER.startswith(data):
        return None
    if data[:len(PROTOCOL_HEADER)] != PROTOCOL_HEADER:
        raise WrongProtocolHeader()
    return StreamStart(proxied, data[len(PROTOCOL_HEADER):])
