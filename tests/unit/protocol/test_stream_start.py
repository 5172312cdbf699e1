"""The start of a client's stream: AMQP 0-9-1's protocol header, after the PROXY header of another node that proves
it knows the cluster's secret (as the receiving node proves it to that one); what follows is kept, and a start that
is not valid says so as soon as it cannot become one."""

from __future__ import annotations

import pytest

from protocol import node_proof
from protocol.constants import PROTOCOL_HEADER
from protocol.proxy_header import ProxyHeaderError, encode
from protocol.stream_start import Forwarding, NotProven, StartReader, StreamStart, WrongProtocolHeader

SECRET = "the cluster's secret"
ENDS = (("192.0.2.7", 56324), ("10.0.0.1", 5672))
FRAME = b"\x01\x00\x00"  # the beginning of what a client sends next


def read(data: bytes, secret: str | None = SECRET) -> StreamStart | None:
    """The start data makes, read at once, by a node that knows secret (None: a broker outside a cluster)."""
    return StartReader(secret).feed(data)[1]


def forwarded(forwarding: Forwarding, reader: StartReader, after: bytes) -> StreamStart | None:
    """The whole exchange between a forwarding node and a receiving one, the client's bytes after it."""
    challenge, start = reader.feed(forwarding.header)
    assert start is None and len(challenge) == node_proof.CHALLENGE_SIZE
    proof, rest = forwarding.feed(challenge)
    assert proof is not None and rest == b""
    return reader.feed(proof + after)[1]


@pytest.mark.parametrize("secret", [None, "", SECRET])
def test_the_protocol_header_alone_starts_a_stream(secret):
    assert read(PROTOCOL_HEADER + FRAME, secret) == StreamStart(None, False, FRAME)


@pytest.mark.parametrize("tls, web", [(False, False), (True, False), (False, True)])
def test_a_node_that_proves_the_secret_names_the_client_it_forwards(tls, web):
    forwarding = Forwarding(SECRET, *ENDS, tls=tls, web=web)
    start = forwarded(forwarding, StartReader(SECRET), PROTOCOL_HEADER + FRAME)
    assert start == StreamStart(ENDS, tls, FRAME, web)


def test_every_piece_of_the_exchange_may_come_a_byte_at_a_time():
    forwarding, reader = Forwarding(SECRET, *ENDS, tls=False), StartReader(SECRET)
    challenge = b""
    for byte in forwarding.header:
        answer, start = reader.feed(bytes([byte]))
        assert start is None
        challenge += answer
    proof = None
    for index, byte in enumerate(challenge):
        proof, _ = forwarding.feed(bytes([byte]))
        assert (proof is None) == (index < len(challenge) - 1)
    assert proof is not None
    sent = proof + PROTOCOL_HEADER
    for index, byte in enumerate(sent):
        _, start = reader.feed(bytes([byte]))
        assert (start is None) == (index < len(sent) - 1)


def test_a_forwarding_node_refuses_a_node_that_does_not_know_the_secret():
    forwarding = Forwarding(SECRET, *ENDS, tls=False)
    challenge, _ = StartReader("another secret").feed(forwarding.header)
    with pytest.raises(node_proof.ProofError, match="its proof of the cluster's secret is wrong"):
        forwarding.feed(challenge)


def test_a_receiving_node_refuses_a_node_that_does_not_know_the_secret():
    impostor = Forwarding("another secret", *ENDS, tls=False)
    reader = StartReader(SECRET)
    challenge, _ = reader.feed(impostor.header)
    with pytest.raises(NotProven, match="its proof of the cluster's secret is wrong"):
        reader.feed(bytes(node_proof.PROOF_SIZE) + PROTOCOL_HEADER)


def test_a_proof_seen_on_the_wire_proves_nothing_when_sent_again():
    forwarding = Forwarding(SECRET, *ENDS, tls=False)
    reader = StartReader(SECRET)
    challenge, _ = reader.feed(forwarding.header)
    proof, _ = forwarding.feed(challenge)
    assert proof is not None
    replayed = StartReader(SECRET)  # another connection: another challenge
    replayed.feed(forwarding.header)
    with pytest.raises(NotProven, match="wrong"):
        replayed.feed(proof + PROTOCOL_HEADER)


def test_a_proof_binds_the_header_it_follows():
    forwarding = Forwarding(SECRET, *ENDS, tls=False)
    reader = StartReader(SECRET)
    challenge, _ = reader.feed(forwarding.header)
    other = Forwarding(SECRET, ("127.0.0.1", 1), ENDS[1], tls=False)  # the same nonce, another client named
    other.asked, other.header = forwarding.asked, encode(("127.0.0.1", 1), ENDS[1], False, forwarding.asked)
    with pytest.raises(node_proof.ProofError):
        other.feed(challenge)


@pytest.mark.parametrize("header, why", [
    (encode(*ENDS), "its PROXY header carries no nonce: it is not another node's"),
    (encode(*ENDS, tls=True), "its PROXY header carries no nonce"),
])
def test_a_proxy_header_without_a_nonce_is_refused(header, why):
    with pytest.raises(NotProven, match=why):
        read(header + PROTOCOL_HEADER)


def test_a_node_that_has_not_learnt_the_secret_refuses_every_proxy_header():
    with pytest.raises(NotProven, match="has not learnt the cluster's secret yet"):
        read(Forwarding(SECRET, *ENDS, tls=False).header, "")


@pytest.mark.parametrize("data", [
    encode(*ENDS, nonce=bytes(16)) + PROTOCOL_HEADER,  # a broker outside a cluster reads no PROXY header
    b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 5672\r\n" + PROTOCOL_HEADER,  # version 1, which can prove nothing
    b"AMQP\x00\x00\x09\x00",  # another version of the protocol
    b"AMQP\x01\x01\x00\x09",  # AMQP 0-9's header
    b"GET / HTTP/1.1\r\n",
    b"A" + b"\x00",  # wrong as soon as it cannot become the header
], ids=["not-clustered", "v1", "version", "0-9", "http", "early"])
def test_anything_else_is_a_wrong_protocol_header(data):
    with pytest.raises(WrongProtocolHeader):
        read(data, None if data.startswith(b"\r\n") else SECRET)


def test_a_wrong_protocol_header_after_a_proven_proxy_header_is_wrong_too():
    with pytest.raises(WrongProtocolHeader):
        forwarded(Forwarding(SECRET, *ENDS, tls=False), StartReader(SECRET), b"HTTP/1.1")


def test_a_malformed_proxy_header_says_what_is_wrong():
    with pytest.raises(ProxyHeaderError, match="unknown command 2"):
        read(b"\r\n\r\n\x00\r\nQUIT\n\x22\x11\x00\x0c" + bytes(12) + PROTOCOL_HEADER)
