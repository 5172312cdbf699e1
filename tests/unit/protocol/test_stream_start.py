"""The start of a client's stream: a PROXY header only where the peer may send one, then AMQP 0-9-1's protocol
header; what follows is kept, and a start that is not valid says so as soon as it cannot become one."""

from __future__ import annotations

import pytest

from protocol.constants import PROTOCOL_HEADER
from protocol.proxy_header import Proxied, ProxyHeaderError, encode
from protocol.stream_start import StreamStart, WrongProtocolHeader, read_start

V1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 5672\r\n"
ENDS = (("192.0.2.7", 56324), ("10.0.0.1", 5672))
FRAME = b"\x01\x00\x00"  # the beginning of what a client sends next


@pytest.mark.parametrize("proxy_allowed", [False, True])
def test_the_protocol_header_alone_starts_a_stream(proxy_allowed):
    assert read_start(PROTOCOL_HEADER + FRAME, proxy_allowed) == StreamStart(None, FRAME)


@pytest.mark.parametrize("header, proxied", [
    (V1, Proxied(ENDS)),
    (encode(*ENDS), Proxied(ENDS)),
    (encode(*ENDS, tls=True), Proxied(ENDS, tls=True)),
    (b"PROXY UNKNOWN\r\n", Proxied(None)),
], ids=["v1", "v2", "v2-tls", "v1-unknown"])
def test_a_proxy_allowed_one_names_the_client_before_the_protocol_header(header, proxied):
    assert read_start(header + PROTOCOL_HEADER + FRAME, True) == StreamStart(proxied, FRAME)


@pytest.mark.parametrize("header", [V1, encode(*ENDS, tls=True)], ids=["v1", "v2"])
def test_every_prefix_of_a_valid_start_waits_for_more(header):
    start = header + PROTOCOL_HEADER
    for end in range(len(start)):
        assert read_start(start[:end], True) is None, start[:end]


@pytest.mark.parametrize("data", [
    V1 + PROTOCOL_HEADER,  # a PROXY header from a peer that may not send one
    encode(*ENDS) + PROTOCOL_HEADER,
    b"AMQP\x00\x00\x09\x00",  # another version of the protocol
    b"AMQP\x01\x01\x00\x09",  # AMQP 0-9's header
    b"GET / HTTP/1.1\r\n",
    b"A" + b"\x00",  # wrong as soon as it cannot become the header
], ids=["v1-not-allowed", "v2-not-allowed", "version", "0-9", "http", "early"])
def test_anything_else_is_a_wrong_protocol_header(data):
    with pytest.raises(WrongProtocolHeader):
        read_start(data, False)


def test_a_wrong_protocol_header_after_a_proxy_header_is_wrong_too():
    with pytest.raises(WrongProtocolHeader):
        read_start(V1 + b"HTTP/1.1", True)


def test_a_malformed_proxy_header_says_what_is_wrong():
    with pytest.raises(ProxyHeaderError, match="'1.2.3' is not a TCP4 address"):
        read_start(b"PROXY TCP4 1.2.3 10.0.0.1 1 2\r\n" + PROTOCOL_HEADER, True)
