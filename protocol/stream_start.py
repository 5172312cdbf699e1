"""The start of a client's byte stream: AMQP's 8-byte protocol header (MQTT has none), after a PROXY header where
another node of the cluster forwards the client. A broker's connection and a cluster's front door read it alike (StartReader); a node
that forwards a client writes it (Forwarding).

A PROXY header is believed for what its sender proves, never for the address it comes from: it carries the
forwarding node's nonce, the receiving node answers with a challenge (its nonce and its proof of the cluster's
secret), and the forwarding node, once it has checked that, sends its proof over both nonces and the header before
the client's bytes (protocol.node_proof). A node of a cluster that has not learnt the secret yet refuses every
PROXY header; a broker outside a cluster reads one as a wrong protocol header. Bytes in, what they say and what to
answer out; no sockets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from protocol import node_proof, proxy_header
from protocol.constants import PROTOCOL_HEADER

LINK: Final = "amqp"  # the kind of link the proofs of a forwarded client are made for (node_proof.link_key)
MQTT_LINK: Final = "mqtt"  # that of a forwarded MQTT client (its proofs are no AMQP client's, nor the other way)
PROXY, PROOF, HEADER = "a PROXY header", "a proof", "the protocol header"  # what a StartReader reads next


class WrongProtocolHeader(Exception):
    """The stream does not start with AMQP 0-9-1's protocol header (after a proven PROXY header): the peer is
    answered with ours and the socket closed, as the spec says."""


class NotProven(Exception):
    """A PROXY header whose sender does not prove it knows the cluster's secret: the socket is closed; the message
    says why, for the log."""


@dataclass(frozen=True)
class StreamStart:
    # (the client, the address it connected to) as the proven PROXY header of the node that forwards it names them;
    # None without one
    forwarded: tuple[proxy_header.Address, proxy_header.Address] | None
    tls: bool  # the forwarded client spoke TLS to the node that forwarded it
    rest: bytes  # what followed the protocol header
    web: bool = False  # the forwarded client spoke MQTT over a WebSocket to the node that forwarded it


class StartReader:
    """The start of one stream, read as it arrives: a PROXY header may come first, then its sender's proof, then the
    protocol header."""

    def __init__(self, secret: str | None, link: str = LINK, protocol_header: bytes = PROTOCOL_HEADER) -> None:
        self.secret = secret  # the cluster's ("": not learnt yet; None: not in a cluster, no PROXY header is read)
        self.link = link  # the kind of link the proofs are made for
        self.protocol_header = protocol_header  # what must follow (b"": nothing, as for MQTT)
        self.data = b""  # what arrived and is not read yet
        self.stage = PROXY  # what is read next: PROXY (a PROXY header may come), PROOF or HEADER
        self.header = b""  # a PROXY header read whole, whose sender is to prove itself
        self.proxied: proxy_header.Proxied | None = None  # what it says
        self.answered = b""  # this node's nonce, sent in its challenge

    def feed(self, data: bytes) -> tuple[bytes, StreamStart | None]:
        """What to send the peer now (a challenge), and the start once it is whole (None while more may make one).
        Raises proxy_header.ProxyHeaderError for a malformed PROXY header, NotProven for one whose sender proves
        nothing, and WrongProtocolHeader for anything else that is not a valid start."""
        self.data += data
        reply = b""
        if self.stage is PROXY:
            if self.secret is None or not proxy_header.could_start(self.data):
                self.stage = HEADER  # (a PROXY header from a node outside a cluster is a wrong protocol header)
            else:
                parsed = proxy_header.parse(self.data)
                if parsed is None:
                    return b"", None
                self.proxied, rest = parsed
                self.header, self.data = self.data[:len(self.data) - len(rest)], rest
                reply = self._challenge()
                self.stage = PROOF
        if self.stage is PROOF:
            if len(self.data) < node_proof.PROOF_SIZE:
                return reply, None
            self._check(self.data[:node_proof.PROOF_SIZE])
            self.data = self.data[node_proof.PROOF_SIZE:]
            self.stage = HEADER
        return reply, self._protocol_header()

    def _challenge(self) -> bytes:
        """This node's challenge to the sender of the PROXY header: its nonce, and its proof over both and the
        header."""
        assert self.proxied is not None
        if not self.secret:
            raise NotProven("this node has not learnt the cluster's secret yet")
        if self.proxied.nonce is None:  # (one that names no client carries none either: LOCAL, UNSPEC)
            raise NotProven("its PROXY header carries no nonce: it is not another node's")
        self.answered, challenge = node_proof.challenge(self._key(), self.proxied.nonce, self.header)
        return challenge

    def _check(self, given: bytes) -> None:
        assert self.proxied is not None and self.proxied.nonce is not None
        expected = node_proof.proof(self._key(), node_proof.ASKS, self.proxied.nonce, self.answered, self.header)
        if not node_proof.check(expected, given):
            raise NotProven("its proof of the cluster's secret is wrong")

    def _key(self) -> bytes:
        assert self.secret
        return node_proof.link_key(self.secret, self.link)

    def _protocol_header(self) -> StreamStart | None:
        data, header = self.data, self.protocol_header
        if len(data) < len(header) and header.startswith(data):
            return None
        if data[:len(header)] != header:
            raise WrongProtocolHeader()
        proxied = self.proxied
        return StreamStart(proxied.ends if proxied else None, proxied is not None and proxied.tls, data[len(header):],
                           proxied is not None and proxied.web)


class Forwarding:
    """The start a node writes for a client it forwards to another node: a PROXY header naming the client and
    carrying this node's nonce; then, once the other node's challenge proves it knows the cluster's secret, this
    node's proof, and the client's bytes behind it."""

    def __init__(self, secret: str, client: tuple, local: tuple, tls: bool, link: str = LINK,
                 web: bool = False) -> None:
        self.key = node_proof.link_key(secret, link)
        self.asked = node_proof.nonce()
        self.header = proxy_header.encode(client, local, tls, self.asked, web)  # written first
        self.received = b""  # the challenge as it arrives

    def feed(self, data: bytes) -> tuple[bytes | None, bytes]:
        """This node's proof once the challenge is whole (None before), and what followed the challenge. Raises
        node_proof.ProofError when the other node's proof is wrong."""
        self.received += data
        if len(self.received) < node_proof.CHALLENGE_SIZE:
            return None, b""
        challenge, rest = self.received[:node_proof.CHALLENGE_SIZE], self.received[node_proof.CHALLENGE_SIZE:]
        answered = node_proof.read_challenge(self.key, self.asked, challenge, self.header)
        return node_proof.proof(self.key, node_proof.ASKS, self.asked, answered, self.header), rest
