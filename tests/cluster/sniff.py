"""What a listener on the private network of tests/cluster/netns.py sees: every TCP segment through the bridge ports
of the namespaces named, captured from the test process (root's namespace) with a packet socket, as an attacker
with a tap on the network between nodes would capture it.

    with Sniffer(network, ["a", "b", "c"]) as sniffer:
        ...                                   # traffic between the nodes
    sniffer.payloads()                        # [(source, destination, bytes)] of every TCP segment with data

Capture stops at MAX_BYTES of payload, so that a long test cannot fill the memory.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Iterable

from tests.cluster.netns import Network

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
MAX_BYTES = 256 << 20  # payload kept at most
BUFFER = 64 << 20  # bytes each packet socket holds unread (the kernel drops what a full buffer cannot take)
SO_RCVBUFFORCE = 33  # (Linux: SO_RCVBUF past rmem_max, for root; the socket module does not name it)
Address = tuple[str, int]


class Sniffer:
    """Captures on the bridge port of each name, on a thread, from __enter__ to __exit__."""

    def __init__(self, network: Network, names: Iterable[str]) -> None:
        self.devices = [network.endpoints[name].port for name in names]
        self.sockets: list[socket.socket] = []
        self.segments: list[tuple[Address, Address, int, bytes]] = []  # (source, destination, sequence, payload)
        self.kept = 0  # payload bytes kept
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._capture, name="sniffer", daemon=True)

    def __enter__(self) -> Sniffer:
        for device in self.devices:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BUFFER)
            sock.bind((device, 0))
            sock.setblocking(False)
            self.sockets.append(sock)
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stopping.set()
        self.thread.join(5)
        for sock in self.sockets:
            sock.close()

    def _capture(self) -> None:
        while not self.stopping.is_set():
            readable, _, _ = select.select(self.sockets, [], [], 0.05)
            for sock in readable:
                try:
                    while self.kept < MAX_BYTES:
                        frame, (_, _, kind, *_) = sock.recvfrom(65536)
                        if kind != socket.PACKET_OUTGOING:  # (each segment once: as it enters the bridge)
                            self._take(frame)
                except BlockingIOError:
                    pass

    def _take(self, frame: bytes) -> None:
        if len(frame) < 34 or struct.unpack_from(">H", frame, 12)[0] != ETH_P_IP or frame[23] != socket.IPPROTO_TCP:
            return
        header = (frame[14] & 0x0F) * 4
        total = struct.unpack_from(">H", frame, 16)[0]
        source, destination = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
        tcp = 14 + header
        if len(frame) < tcp + 20:
            return
        source_port, destination_port, sequence = struct.unpack_from(">HHI", frame, tcp)
        offset = (frame[tcp + 12] >> 4) * 4
        payload = frame[tcp + offset:14 + total]
        if payload:
            self.segments.append(((source, source_port), (destination, destination_port), sequence, payload))
            self.kept += len(payload)

    def payloads(self) -> list[tuple[Address, Address, bytes]]:
        """Every segment with data, in the order captured."""
        return [(source, destination, payload) for source, destination, _, payload in self.segments]

    def streams(self) -> dict[tuple[Address, Address], bytes]:
        """Each direction of each TCP connection as one byte stream, its segments in sequence order (a
        retransmitted one once)."""
        parts: dict[tuple[Address, Address], dict[int, bytes]] = {}
        for source, destination, sequence, payload in self.segments:
            parts.setdefault((source, destination), {})[sequence] = payload
        return {flow: b"".join(payload for _, payload in sorted(segments.items()))
                for flow, segments in parts.items()}
