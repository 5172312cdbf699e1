"""The PROXY protocol's version 2 header: what the spec allows parses to the client's and the proxy's addresses,
whether the client speaks TLS, the forwarding node's nonce and whether the client speaks MQTT over a WebSocket;
anything else is refused with the reason, and a header that arrives in pieces is waited for. What encode writes
parses back. Version 1 is not read."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.proxy_header import (
    MAX_V2_LENGTH, SIGNATURE_V2, Proxied, ProxyHeaderError, could_start, encode, parse,
)


def test_a_version_1_header_is_not_read():
    with pytest.raises(ProxyHeaderError, match="it does not start with version 2's signature"):
        parse(b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 5672\r\n")


# ---- version 2


def v2(family: int, block: bytes, version_command: int = 0x21) -> bytes:
    """A version 2 header: its fixed part, then block (addresses and TLVs)."""
    return SIGNATURE_V2 + struct.pack(">BBH", version_command, family, len(block)) + block


TCP4_BLOCK = bytes([192, 0, 2, 7, 10, 0, 0, 1]) + struct.pack(">HH", 56324, 5672)
TCP6_BLOCK = ipaddress.IPv6Address("2001:db8::7").packed + ipaddress.IPv6Address("::1").packed + struct.pack(
    ">HH", 1, 2)
SSL_TLV = b"\x20\x00\x05\x01\x00\x00\x00\x00"  # PP2_TYPE_SSL: client flags PP2_CLIENT_SSL, verify 0
NOT_SSL_TLV = b"\x20\x00\x05\x00\x00\x00\x00\x00"  # the same TLV, the client's flags empty
OTHER_TLVS = b"\x01\x00\x02h2" + b"\x04\x00\x00"  # ALPN and NOOP, of no meaning here
NONCE = bytes(range(16))
NONCE_TLV = b"\xe0\x00\x10" + NONCE  # a forwarding node's nonce
WEB_TLV = b"\xe1\x00\x00"  # the client spoke MQTT over a WebSocket to the forwarding node


@pytest.mark.parametrize("header, proxied", [
    (v2(0x11, TCP4_BLOCK), Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)))),
    (v2(0x21, TCP6_BLOCK), Proxied((("2001:db8::7", 1), ("::1", 2)))),
    (v2(0x11, TCP4_BLOCK + SSL_TLV), Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)), tls=True)),
    (v2(0x11, TCP4_BLOCK + OTHER_TLVS + SSL_TLV),
     Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)), tls=True)),
    (v2(0x11, TCP4_BLOCK + NOT_SSL_TLV), Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)))),
    (v2(0x11, TCP4_BLOCK + SSL_TLV + NONCE_TLV),
     Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)), tls=True, nonce=NONCE)),
    (v2(0x11, TCP4_BLOCK + NONCE_TLV + WEB_TLV),
     Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)), nonce=NONCE, web=True)),
    (v2(0x21, ipaddress.IPv6Address("::ffff:192.0.2.7").packed + ipaddress.IPv6Address("::1").packed +
        struct.pack(">HH", 1, 2)), Proxied((("192.0.2.7", 1), ("::1", 2)))),
    (v2(0x11, TCP4_BLOCK, version_command=0x20), Proxied(None)),  # LOCAL: the proxy's own health check
    (v2(0x00, b""), Proxied(None)),  # UNSPEC: a client the proxy cannot name
    (v2(0x00, b"anything"), Proxied(None)),
], ids=["tcp4", "tcp6", "tls", "tls-among-other-tlvs", "ssl-tlv-without-tls", "nonce", "web", "ipv4-in-ipv6",
        "local", "unspec", "unspec-with-block"])
def test_a_valid_version_2_header_gives_both_ends_whether_tls_and_what_follows(header, proxied):
    assert parse(header + b"AMQP\x00\x00\x09\x01") == (proxied, b"AMQP\x00\x00\x09\x01")


@pytest.mark.parametrize("header, reason", [
    (v2(0x11, TCP4_BLOCK, version_command=0x11), "version 1 in a version 2 signature"),
    (v2(0x11, TCP4_BLOCK, version_command=0x22), "unknown command 2"),
    (v2(0x12, TCP4_BLOCK), "family and protocol 0x12, not TCP over IPv4 or IPv6"),  # UDP
    (v2(0x31, b"\x00" * 216), "family and protocol 0x31, not TCP over IPv4 or IPv6"),  # a UNIX socket
    (v2(0x11, TCP4_BLOCK[:11]), "11 bytes for TCP4 addresses of 12"),
    (v2(0x21, TCP4_BLOCK), "12 bytes for TCP6 addresses of 36"),
    (v2(0x11, TCP4_BLOCK + b"\x20\x00"), "a TLV cut short after 2 bytes"),
    (v2(0x11, TCP4_BLOCK + b"\x20\x00\x05\x01"), "TLV 0x20 of 5 bytes with 1 left"),
    (v2(0x11, TCP4_BLOCK + b"\x20\x00\x00"), "an SSL TLV without its client flags"),
    (v2(0x11, TCP4_BLOCK + b"\xe0\x00\x08" + bytes(8)), "a nonce of 8 bytes, not 16"),
    (SIGNATURE_V2 + struct.pack(">BBH", 0x21, 0x11, MAX_V2_LENGTH + 1),
     f"{MAX_V2_LENGTH + 1} bytes of addresses and TLVs, more than the {MAX_V2_LENGTH} taken"),
    (SIGNATURE_V2 + struct.pack(">BBH", 0x21, 0x11, 65535), "65535 bytes of addresses and TLVs"),
], ids=["version-1", "command-2", "udp", "unix", "short-tcp4", "short-tcp6", "tlv-header-cut", "tlv-value-cut",
        "empty-ssl-tlv", "short-nonce", "one-byte-too-long", "longest-length"])
def test_a_malformed_version_2_header_is_refused_with_its_reason(header, reason):
    with pytest.raises(ProxyHeaderError) as refused:
        parse(header)
    assert str(refused.value).startswith(reason)


def test_a_version_2_header_that_arrives_in_pieces_is_waited_for_then_parsed_whole():
    header = v2(0x11, TCP4_BLOCK + SSL_TLV)
    for end in range(len(header)):
        assert parse(header[:end]) is None, header[:end]
    assert parse(header + b"AMQP") == (Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672)), tls=True), b"AMQP")


def test_the_longest_version_2_header_taken_is_waited_for_whole():
    block = TCP4_BLOCK + b"\x04" + struct.pack(">H", MAX_V2_LENGTH - len(TCP4_BLOCK) - 3) + bytes(
        MAX_V2_LENGTH - len(TCP4_BLOCK) - 3)  # a NOOP TLV fills it up
    header = v2(0x11, block)
    assert parse(header[:-1]) is None
    assert parse(header) == (Proxied((("192.0.2.7", 56324), ("10.0.0.1", 5672))), b"")


@pytest.mark.parametrize("data, starts", [
    (b"", True), (b"\r", True), (SIGNATURE_V2 + b"\x21", True),
    (b"A", False), (b"AMQP\x00\x00\x09\x01", False), (b"PROXY TCP4", False), (b"\r\n\r\n\x00\r\nquit", False),
])
def test_could_start_tells_a_version_2_header_from_anything_else(data, starts):
    assert could_start(data) is starts


def test_encode_writes_version_2_in_the_family_of_the_client():
    assert encode(("192.0.2.7", 56324), ("10.0.0.1", 5672)) == v2(0x11, TCP4_BLOCK)
    assert encode(("2001:db8::7", 1, 0, 0), ("::1", 2, 0, 0)) == v2(0x21, TCP6_BLOCK)
    assert encode(("192.0.2.7", 56324), ("10.0.0.1", 5672), tls=True) == v2(0x11, TCP4_BLOCK + SSL_TLV)
    assert encode(("192.0.2.7", 56324), ("10.0.0.1", 5672), nonce=NONCE) == v2(0x11, TCP4_BLOCK + NONCE_TLV)
    # an IPv4 client of a dual-stack socket, and a link-local client with its zone
    assert encode(("::ffff:192.0.2.7", 56324, 0, 0), ("::ffff:10.0.0.1", 5672, 0, 0)) == v2(0x11, TCP4_BLOCK)
    assert parse(encode(("fe80::7%eth0", 1, 0, 2), ("fe80::1%eth0", 2, 0, 2))) == (
        Proxied((("fe80::7", 1), ("fe80::1", 2))), b"")
    # ends of both families are both named in IPv6, and read back as they were
    assert parse(encode(("192.0.2.7", 1), ("::1", 2))) == (Proxied((("192.0.2.7", 1), ("::1", 2))), b"")


ports = st.integers(0, 65535)
ipv4 = st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1))
ipv6 = st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1)).filter(
    lambda text: ipaddress.IPv6Address(text).ipv4_mapped is None)


@given(st.one_of(st.tuples(ipv4, ipv4), st.tuples(ipv6, ipv6), st.tuples(ipv4, ipv6)), ports, ports, st.booleans(),
       st.one_of(st.none(), st.binary(min_size=16, max_size=16)), st.booleans())
def test_what_encode_writes_parses_back(hosts, source_port, destination_port, tls, nonce, web):
    source, destination = (hosts[0], source_port), (hosts[1], destination_port)
    assert parse(encode(source, destination, tls, nonce, web) + b"rest") == (
        Proxied((source, destination), tls, nonce, web), b"rest")
