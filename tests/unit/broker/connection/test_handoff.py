"""Handing a client's socket to another worker process (broker.connection.handoff)."""

import dataclasses
import socket

from broker.connection.handoff import HandedOver, decode, encode, hand_over, handoff_pair, receive_all, send

HANDED = HandedOver(user="guest", peer=["127.0.0.2", 40000], local=["127.0.0.1", 5672],
                    connected_at=1_700_000_000_000, received_bytes=8, sent_bytes=654, answered=2,
                    data=b"\x01\x00\x00rest of the bytes")


def test_the_state_and_bytes_come_back_as_sent():
    assert decode(encode(HANDED)) == HANDED


def test_a_socket_goes_across_with_its_state():
    receiving, sending = handoff_pair()
    client, server_end = socket.socketpair()
    try:
        send(sending, server_end.fileno(), HANDED)
        server_end.close()  # the receiver's copy keeps the connection open
        taken = []
        receive_all(receiving, lambda sock, handed: taken.append((sock, handed)))
        (sock, handed), = taken
        assert handed == HANDED
        client.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        sock.close()
    finally:
        for each in (client, receiving, sending):
            each.close()


class PlainTransport:
    """A plain TCP transport's part that hand_over reads: its socket, and no TLS session."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def get_extra_info(self, name: str):
        return {"socket": self.sock, "sslcontext": None}.get(name)

    def close(self) -> None:
        self.closed = True


def test_a_client_that_spoke_tls_to_another_node_goes_across_itself_not_through_a_splice():
    """Its TLS session ended at the node that forwarded it: the socket here is plain, and goes to the worker as it
    is, so that no byte passes through this process afterwards."""
    receiving, sending = handoff_pair()
    client, server_end = socket.socketpair()
    transport = PlainTransport(server_end)
    splicing = set()
    try:
        hand_over(transport, sending, dataclasses.replace(HANDED, tls=True), splicing.add)
        assert transport.closed and not splicing  # let go here, nothing spliced
        taken = []
        receive_all(receiving, lambda sock, handed: taken.append((sock, handed)))
        (sock, handed), = taken
        assert handed.tls
        client.sendall(b"ping")
        assert sock.recv(4) == b"ping"  # the client's own socket
        sock.close()
    finally:
        for each in (client, server_end, receiving, sending):
            each.close()


def test_a_datagram_without_a_socket_is_dropped():
    receiving, sending = handoff_pair()
    try:
        sending.send(encode(HANDED))
        taken = []
        receive_all(receiving, lambda sock, handed: taken.append(handed))
        assert taken == []
    finally:
        receiving.close()
        sending.close()
