"""The PROXY protocol's version 2 header (HAProxy's proxy-protocol.txt, section 2.2): what one node sends before
the bytes of a client it forwards to another, to name that client, to say whether it spoke TLS to the forwarding
node, and to carry the forwarding node's nonce (a TLV of the spec's custom range) for the proof that it knows the
cluster's secret (protocol.node_proof, protocol.stream_start), and whether the client spoke MQTT over a WebSocket
to it (another TLV of that range). Version 1, a line of text, cannot carry a proof and is not read. Bytes in,
addresses out; no sockets."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

from protocol.node_proof import NONCE_SIZE

SIGNATURE_V2: Final = b"\r\n\r\n\x00\r\nQUIT\n"
_V2_FIXED: Final = struct.Struct(">12sBBH")  # signature, version and command, family and protocol, length of the rest
MAX_V2_LENGTH: Final = 1024  # bytes after version 2's fixed part taken at most: addresses and TLVs
_LOCAL, _PROXY = 0x0, 0x1  # version 2's commands: the proxy's own connection (a health check), or a client's
_UNSPEC, _TCP4, _TCP6 = 0x00, 0x11, 0x21  # version 2's families and protocols known here
_ADDRESSES = {_TCP4: struct.Struct(">4s4sHH"), _TCP6: struct.Struct(">16s16sHH")}  # source, destination, ports
_TLV = struct.Struct(">BH")  # type, length of the value
PP2_TYPE_SSL: Final = 0x20  # the TLV that says how the client spoke to the proxy: client flags, verify, sub-TLVs
PP2_CLIENT_SSL: Final = 0x01  # in its client flags: over SSL/TLS
PP2_TYPE_WARREN_NONCE: Final = 0xE0  # the forwarding node's nonce (0xE0-0xEF: the spec's range for applications)
PP2_TYPE_WARREN_WEB: Final = 0xE1  # no value: the client spoke MQTT over a WebSocket to the forwarding node

Address = tuple[str, int]  # host, port


class ProxyHeaderError(ValueError):
    """A header the spec does not allow; the message says what was wrong."""


@dataclass(frozen=True)
class Proxied:
    """What a PROXY header says of the client it forwards."""
    # (source, destination): the client and the address it connected to; None: the socket's own stand (the LOCAL
    # command, or the unspecified family)
    ends: tuple[Address, Address] | None
    tls: bool = False  # the client spoke TLS to the proxy (the SSL TLV)
    nonce: bytes | None = None  # the forwarding node's nonce (None: no such TLV, so nothing can be proven)
    web: bool = False  # the client spoke MQTT over a WebSocket to the proxy (Warren's TLV)


def could_start(data: bytes) -> bool:
    """data is the beginning of a version 2 header, or begins with one."""
    return data.startswith(SIGNATURE_V2) or SIGNATURE_V2.startswith(data)


def encode(source: tuple, destination: tuple, tls: bool = False, nonce: bytes | None = None,
           web: bool = False) -> bytes:
    """The version 2 header of a TCP connection from source to destination, (host, port, ...) as sockets name them,
    tls: the client speaks TLS to the proxy; nonce: the forwarding node's; web: the client speaks MQTT over a
    WebSocket to the proxy. An IPv4 client of an IPv6 socket (::ffff:a.b.c.d) is named as the IPv4 client it is;
    ends of both families are both named in IPv6."""
    source_ip, destination_ip = _ip_of(source[0]), _ip_of(destination[0])
    if source_ip.version != destination_ip.version:
        source_ip, destination_ip = _as_ipv6(source_ip), _as_ipv6(destination_ip)
    family = _TCP4 if source_ip.version == 4 else _TCP6
    block = _ADDRESSES[family].pack(source_ip.packed, destination_ip.packed, source[1], destination[1])
    if tls:  # client flags, then verify: 0, the client's certificate (if any) checked
        block += _TLV.pack(PP2_TYPE_SSL, 5) + bytes([PP2_CLIENT_SSL]) + bytes(4)
    if nonce is not None:
        block += _TLV.pack(PP2_TYPE_WARREN_NONCE, len(nonce)) + nonce
    if web:
        block += _TLV.pack(PP2_TYPE_WARREN_WEB, 0)
    return _V2_FIXED.pack(SIGNATURE_V2, 0x20 | _PROXY, family, len(block)) + block


def _as_ipv6(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(f"::ffff:{address}") if address.version == 4 else address


def _ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return _unmapped(ipaddress.ip_address(host.partition("%")[0]))  # without an IPv6 zone ("fe80::1%eth0")


def _unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4 address in IPv6 (::ffff:a.b.c.d) as the IPv4 address it is; any other as it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse(data: bytes) -> tuple[Proxied, bytes] | None:
    """The header at the start of data: what it says, and the bytes after it; None while data is a header's
    beginning that lacks its end. Raises ProxyHeaderError for anything else."""
    if not could_start(data):
        raise ProxyHeaderError("it does not start with version 2's signature")
    if len(data) < _V2_FIXED.size:
        return None
    _, version_command, family, length = _V2_FIXED.unpack_from(data)
    if version_command >> 4 != 2:
        raise ProxyHeaderError(f"version {version_command >> 4} in a version 2 signature")
    command = version_command & 0x0F
    if command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError(f"unknown command {command}")
    if length > MAX_V2_LENGTH:
        raise ProxyHeaderError(f"{length} bytes of addresses and TLVs, more than the {MAX_V2_LENGTH} taken")
    end = _V2_FIXED.size + length
    if len(data) < end:
        return None
    block, rest = data[_V2_FIXED.size:end], data[end:]
    if command == _LOCAL or family == _UNSPEC:  # the proxy's own connection, or a client it cannot name
        return Proxied(None), rest
    addresses = _ADDRESSES.get(family)
    if addresses is None:
        raise ProxyHeaderError(f"family and protocol 0x{family:02x}, not TCP over IPv4 or IPv6")
    if length < addresses.size:
        raise ProxyHeaderError(f"{length} bytes for {'TCP4' if family == _TCP4 else 'TCP6'} addresses of "
                               f"{addresses.size}")
    source, destination, source_port, destination_port = addresses.unpack_from(block)
    ends = ((_host_of(source), source_port), (_host_of(destination), destination_port))
    return Proxied(ends, *_tlvs(block[addresses.size:])), rest


def _host_of(packed: bytes) -> str:
    """A version 2 address as text; an IPv4 one in IPv6 (::ffff:a.b.c.d) as the IPv4 address it is."""
    return str(_unmapped(ipaddress.ip_address(packed)))


def _tlvs(tlvs: bytes) -> tuple[bool, bytes | None, bool]:
    """Whether the TLVs say the client spoke TLS to the proxy, the forwarding node's nonce if one is there, and
    whether the client spoke MQTT over a WebSocket; the other TLVs are skipped, as the spec wants of those a receiver
    does not know."""
    offset, tls, nonce, web = 0, False, None, False
    while offset < len(tlvs):
        if len(tlvs) - offset < _TLV.size:
            raise ProxyHeaderError(f"a TLV cut short after {len(tlvs) - offset} bytes")
        kind, length = _TLV.unpack_from(tlvs, offset)
        value = tlvs[offset + _TLV.size:offset + _TLV.size + length]
        if len(value) < length:
            raise ProxyHeaderError(f"TLV 0x{kind:02x} of {length} bytes with {len(value)} left")
        if kind == PP2_TYPE_SSL:
            if not value:
                raise ProxyHeaderError("an SSL TLV without its client flags")
            tls = bool(value[0] & PP2_CLIENT_SSL)
        elif kind == PP2_TYPE_WARREN_NONCE:
            if length != NONCE_SIZE:
                raise ProxyHeaderError(f"a nonce of {length} bytes, not {NONCE_SIZE}")
            nonce = value
        elif kind == PP2_TYPE_WARREN_WEB:
            web = True
        offset += _TLV.size + length
    return tls, nonce, web
