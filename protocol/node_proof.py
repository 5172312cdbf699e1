"""Proof that the peer of a link between nodes knows the cluster's secret, the secret itself never crossing the wire
(as Erlang's nodes prove their cookie). The side that connects ("asks") sends a random nonce; the side that accepts
("answers") sends one of its own with a proof over both; the asking side checks it and proves itself over both
again. Each proof is an HMAC under a key derived from the secret for one kind of link, over its role, both nonces
and what the link binds (a PROXY header, a replication hello, a forwarded request): a proof seen on the wire proves
nothing on another connection, in the other role, or on another kind of link. Bytes in, bytes out; no sockets.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

NONCE_SIZE: Final = 16  # random bytes each side adds: a proof is never asked twice for the same pair
PROOF_SIZE: Final = 32  # an HMAC-SHA256
CHALLENGE_SIZE: Final = NONCE_SIZE + PROOF_SIZE  # the answering side's nonce, then its proof
ASKS: Final = "asks"  # the role of the side that connects
ANSWERS: Final = "answers"  # the role of the side that accepts
HEX_DIGITS: Final = frozenset("0123456789abcdef")


class ProofError(ValueError):
    """The peer does not prove that it knows the cluster's secret; the message says how."""


def link_key(secret: str, link: str) -> bytes:
    """The key of one kind of link ("replication", "amqp", "api", "body"), derived from the cluster's secret."""
    return hmac.new(secret.encode(), b"warren link\x00" + link.encode(), hashlib.sha256).digest()


def nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def proof(key: bytes, role: str, *parts: bytes) -> bytes:
    """The HMAC of the role and the parts, each part preceded by its length, so that no two lists of parts make the
    same message."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (role.encode(), *parts):
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def body_mac(key: bytes) -> "hmac.HMAC":
    """The HMAC that follows a body sent between nodes, fed as the body goes (a key per request: its proof's)."""
    return hmac.new(key, digestmod=hashlib.sha256)


def challenge(key: bytes, asked: bytes, bound: bytes = b"") -> tuple[bytes, bytes]:
    """The answering side's nonce, and the challenge it sends: that nonce and its proof over both nonces and bound."""
    answered = nonce()
    return answered, answered + proof(key, ANSWERS, asked, answered, bound)


def read_challenge(key: bytes, asked: bytes, data: bytes, bound: bytes = b"") -> bytes:
    """The answering side's nonce, from its challenge; ProofError unless its proof is right."""
    if len(data) != CHALLENGE_SIZE:
        raise ProofError(f"a challenge of {len(data)} bytes, not {CHALLENGE_SIZE}")
    answered, given = data[:NONCE_SIZE], data[NONCE_SIZE:]
    if not hmac.compare_digest(proof(key, ANSWERS, asked, answered, bound), given):
        raise ProofError("its proof of the cluster's secret is wrong")
    return answered


def from_hex(text: str, size: int) -> bytes | None:
    """The ``size`` bytes text writes in lowercase hexadecimal, as nonces, challenges and proofs travel in text;
    None for anything else."""
    if len(text) != 2 * size or not all(digit in HEX_DIGITS for digit in text):
        return None
    return bytes.fromhex(text)


def check(expected: bytes, given: bytes) -> bool:
    """Whether a proof given is the one expected (in constant time)."""
    return hmac.compare_digest(expected, given)
