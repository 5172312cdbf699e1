"""The PROXY protocol v1 header: what the spec allows parses to the client's and the proxy's addresses, anything else
is refused with the reason, and a header that arrives in pieces is waited for."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.proxy_header import MAX_LENGTH, ProxyHeaderError, encode, parse


@pytest.mark.parametrize("line, ends", [
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 5672\r\n", (("192.0.2.7", 56324), ("10.0.0.1", 5672))),
    (b"PROXY TCP4 0.0.0.0 255.255.255.255 0 65535\r\n", (("0.0.0.0", 0), ("255.255.255.255", 65535))),
    (b"PROXY TCP6 2001:db8::7 ::1 56324 5672\r\n", (("2001:db8::7", 56324), ("::1", 5672))),
    (b"PROXY TCP6 2001:DB8:0:0:0:0:0:7 FE80::1 1 2\r\n", (("2001:db8::7", 1), ("fe80::1", 2))),  # canonical form
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN ffff:f::f anything at all 1\r\n", None),  # the rest of an UNKNOWN line is ignored
], ids=["tcp4", "tcp4-extremes", "tcp6", "tcp6-uppercase-long-form", "unknown", "unknown-with-rest"])
def test_a_valid_header_gives_both_ends_and_what_follows(line, ends):
    assert parse(line + b"AMQP\x00\x00\x09\x01") == (ends, b"AMQP\x00\x00\x09\x01")


def test_the_longest_headers_of_the_spec_are_accepted():
    v4 = b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n"
    group = "ffff:" * 7 + "ffff"
    v6 = f"PROXY TCP6 {group} {group} 65535 65535\r\n".encode()
    unknown = f"PROXY UNKNOWN {group} {group} 65535 65535\r\n".encode()
    assert (len(v4), len(v6), len(unknown)) == (56, 104, MAX_LENGTH)
    for line in (v4, v6, unknown):
        assert parse(line) is not None


@pytest.mark.parametrize("line, reason", [
    (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol 'TCP5'"),
    (b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol 'tcp4'"),
    (b"PROXY UNKNOWNX\r\n", "unknown protocol 'UNKNOWNX'"),
    (b"PROXY \r\n", "unknown protocol ''"),
    (b"PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol ''"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "3 fields after TCP4 instead of 4"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "5 fields after TCP4 instead of 4"),
    (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "5 fields after TCP4 instead of 4"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", "5 fields after TCP4 instead of 4"),
    (b"PROXY TCP4 1.2.3.4\t5.6.7.8 1 2\r\n", "3 fields after TCP4 instead of 4"),
    (b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", "'1.2.3' is not a TCP4 address"),
    (b"PROXY TCP4 1.2.3.4 256.0.0.1 1 2\r\n", "'256.0.0.1' is not a TCP4 address"),
    (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "'01.2.3.4' is not a TCP4 address"),  # heading zero
    (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "'::1' is not a TCP4 address"),  # the other family
    (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "'1.2.3.4' is not a TCP6 address"),
    (b"PROXY TCP6 ::ffff:1.2.3.4 ::1 1 2\r\n", "'::ffff:1.2.3.4' is not a TCP6 address"),  # dotted tail
    (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "'fe80::1%eth0' is not a TCP6 address"),  # zone
    (b"PROXY TCP6 1::2::3 ::1 1 2\r\n", "'1::2::3' is not a TCP6 address"),
    (b"PROXY TCP6 localhost ::1 1 2\r\n", "'localhost' is not a TCP6 address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "'65536' is not a port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 0443\r\n", "'0443' is not a port"),  # heading zero
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "'-1' is not a port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", "'+1' is not a port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1_0 2\r\n", "'1_0' is not a port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 0x10 2\r\n", "'0x10' is not a port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 000001 2\r\n", "'000001' is not a port"),
    ("PROXY TCP4 1.2.3.4 5.6.7.8 ١ 2\r\n".encode(), "bytes that are not ASCII"),  # an Arabic-Indic one
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "a line feed without a carriage return before it"),
    (b"PROXY TCP4 1.2.3.4\n5.6.7.8 1 2\r\n", "a line feed without a carriage return before it"),
    (b"PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n", "a carriage return without a line feed after it"),
    (b"PROXY UNKNOWN \r\r\n", "a carriage return without a line feed after it"),
    (b"PROXY\r\n", "it does not start with 'PROXY '"),
    (b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "it does not start with 'PROXY '"),
    (b"AMQP\x00\x00\x09\x01", "it does not start with 'PROXY '"),
])
def test_a_malformed_header_is_refused_with_its_reason(line, reason):
    with pytest.raises(ProxyHeaderError) as refused:
        parse(line)
    assert str(refused.value).startswith(reason)


def test_no_crlf_within_the_longest_header_is_refused():
    assert parse(b"PROXY UNKNOWN " + b"x" * (MAX_LENGTH - 15)) is None  # one byte short of the limit: wait for more
    with pytest.raises(ProxyHeaderError, match="no CRLF in its first 107 bytes"):
        parse(b"PROXY UNKNOWN " + b"x" * (MAX_LENGTH - 14))
    with pytest.raises(ProxyHeaderError, match="no CRLF in its first 107 bytes"):
        parse(b"PROXY UNKNOWN " + b"x" * (MAX_LENGTH - 14) + b"\r\n")  # 108 bytes with its CRLF


def test_a_header_that_arrives_in_pieces_is_waited_for_then_parsed_whole():
    line = b"PROXY TCP6 2001:db8::7 ::1 56324 5672\r\n"
    received = b""
    for byte in line[:-1]:
        received += bytes([byte])
        assert parse(received) is None, received
    assert parse(received + b"\nAMQP") == ((("2001:db8::7", 56324), ("::1", 5672)), b"AMQP")


def test_the_beginning_of_something_else_is_refused_at_once():
    with pytest.raises(ProxyHeaderError, match="it does not start with 'PROXY '"):
        parse(b"PROXI")


def test_encode_names_both_ends_in_the_family_of_the_client():
    assert encode(("192.0.2.7", 56324), ("10.0.0.1", 5672)) == b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 5672\r\n"
    assert encode(("2001:db8::7", 1, 0, 0), ("::1", 2, 0, 0)) == b"PROXY TCP6 2001:db8::7 ::1 1 2\r\n"
    # an IPv4 client of a dual-stack socket, and a link-local client with its zone
    dual_stack = encode(("::ffff:192.0.2.7", 1, 0, 0), ("::ffff:10.0.0.1", 2, 0, 0))
    assert dual_stack == b"PROXY TCP4 192.0.2.7 10.0.0.1 1 2\r\n"
    assert encode(("fe80::7%eth0", 1, 0, 2), ("fe80::1%eth0", 2, 0, 2)) == b"PROXY TCP6 fe80::7 fe80::1 1 2\r\n"


ports = st.integers(0, 65535)
ipv4 = st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1))
ipv6 = st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1)).filter(
    lambda text: ipaddress.IPv6Address(text).ipv4_mapped is None)


@given(st.one_of(st.tuples(ipv4, ipv4), st.tuples(ipv6, ipv6)), ports, ports)
def test_what_encode_writes_parses_back(hosts, source_port, destination_port):
    source, destination = (hosts[0], source_port), (hosts[1], destination_port)
    assert parse(encode(source, destination)) == ((source, destination), b"")
