"""The PROXY protocol's version 1 header (HAProxy's proxy-protocol.txt, section 2.1): the one line a TCP proxy sends
before the client's bytes to name the client it forwards. Bytes in, addresses out; no sockets."""

from __future__ import annotations

import ipaddress
from typing import Final

SIGNATURE: Final = b"PROXY "
MAX_LENGTH: Final = 107  # bytes of the longest header the spec allows, CRLF included

Address = tuple[str, int]  # host, port


class ProxyHeaderError(ValueError):
    """A header the spec does not allow; the message says what was wrong."""


def encode(source: tuple, destination: tuple) -> bytes:
    """The header of a TCP connection from source to destination, (host, port, ...) as sockets name them. An IPv4
    client of an IPv6 socket (::ffff:a.b.c.d) is named as the IPv4 client it is."""
    source_ip, destination_ip = _ip_of(source[0]), _ip_of(destination[0])
    family = "TCP4" if source_ip.version == 4 else "TCP6"
    return f"PROXY {family} {source_ip} {destination_ip} {source[1]} {destination[1]}\r\n".encode("ascii")


def _ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(host.partition("%")[0])  # without an IPv6 zone ("fe80::1%eth0")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse(data: bytes) -> tuple[tuple[Address, Address] | None, bytes] | None:
    """The header at the start of data: ((source, destination), or None for UNKNOWN, and the bytes after it); None
    while data is a header's beginning that lacks its CRLF. Raises ProxyHeaderError for anything else."""
    if not (data.startswith(SIGNATURE) or SIGNATURE.startswith(data)):
        raise ProxyHeaderError("it does not start with 'PROXY '")
    end = data.find(b"\n", 0, MAX_LENGTH)
    if end < 0:
        if len(data) >= MAX_LENGTH:
            raise ProxyHeaderError(f"no CRLF in its first {MAX_LENGTH} bytes")
        return None
    if data[end - 1] != 0x0D:
        raise ProxyHeaderError("a line feed without a carriage return before it")
    line = data[:end - 1]
    if b"\r" in line:
        raise ProxyHeaderError("a carriage return without a line feed after it")
    return _addresses(line), data[end + 1:]


def _addresses(line: bytes) -> tuple[Address, Address] | None:
    """(source, destination) of a header line without its CRLF; None for UNKNOWN, whose rest is to be ignored."""
    try:
        fields = line.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("bytes that are not ASCII") from None
    family = fields[1]
    if family == "UNKNOWN":
        return None
    if family not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"unknown protocol {family!r}")
    if len(fields) != 6:
        raise ProxyHeaderError(f"{len(fields) - 2} fields after {family} instead of 4 (single spaces between them)")
    version = 4 if family == "TCP4" else 6
    return ((_host(fields[2], version), _port(fields[4])),
            (_host(fields[3], version), _port(fields[5])))


def _host(text: str, version: int) -> str:
    """An address of the family in the spec's form: IPv4 in dotted decimal without heading zeroes, IPv6 in
    hexadecimal groups (no dotted IPv4 tail, no zone)."""
    try:
        address = ipaddress.IPv4Address(text) if version == 4 else ipaddress.IPv6Address(text)
        if version == 6 and ("." in text or "%" in text):
            raise ValueError(text)
    except ValueError:
        raise ProxyHeaderError(f"{text!r} is not a TCP{version} address") from None
    return str(address)


def _port(text: str) -> int:
    """A port in decimal, 0 to 65535, without heading zeroes."""
    if not (text.isascii() and text.isdigit()) or len(text) > 5 or (text[0] == "0" and text != "0") \
            or int(text) > 65535:
        raise ProxyHeaderError(f"{text!r} is not a port")
    return int(text)
