"""The replication stream between a leader and a follower, as bytes (no I/O here).

Every message is ``[kind u8][length u32][crc32 u32 of the payload][payload]``. A follower opens with HELLO, which
carries a nonce; the leader answers with a CHALLENGE, its own nonce and its proof of the cluster's secret over both
and the hello (protocol.node_proof), and the follower, once it has checked that proof, sends its own PROOF and a
MANIFEST of the files it holds (so that a join sends only what they lack). The secret never crosses the wire: each
side proves it knows it. The leader then sends FRAMEs (the store writer's batches, ``storage.replica`` ops) and the
follower answers ACKs of the highest sequence it has made durable. A leader with nothing else to send sends a
HEARTBEAT, which the follower answers with one, so that either side notices a silent link (a cut, a dropped peer)
within the ack timeout rather than when TCP gives up. REFUSE says why one side is closing. A message whose checksum
does not match, whose kind is unknown or whose length is out of bounds raises ``FrameError``: the reader stops there
and the stream is closed, so a torn or corrupt frame is never applied, not even in part.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from protocol import node_proof
from protocol.node_proof import NONCE_SIZE, from_hex

HELLO: Final = 1  # follower -> leader: {"node", "dir", "epoch", "nonce", "version", "format"} as JSON (nonce in hex)
FRAME: Final = 2  # leader -> follower: epoch, sequence, ops
ACK: Final = 3  # follower -> leader: the highest sequence on its disk
REFUSE: Final = 4  # either way: why the sender closes the stream (UTF-8 text)
HEARTBEAT: Final = 5  # either way, empty: the link is alive (the leader's when idle, the follower's in answer)
MANIFEST: Final = 6  # follower -> leader, after its proof: {"files": [[path, size, sha256 hex], ...]} as JSON
CHALLENGE: Final = 7  # leader -> follower, after its hello: the leader's nonce and proof (node_proof.challenge)
PROOF: Final = 8  # follower -> leader, after the challenge: the follower's proof over both nonces and its hello
KINDS: Final = (HELLO, FRAME, ACK, REFUSE, HEARTBEAT, MANIFEST, CHALLENGE, PROOF)

HEADER: Final = struct.Struct(">BII")
FRAME_HEAD: Final = struct.Struct(">qq")  # epoch, sequence (-1 for the files of a join before its cut)
ACK_BODY: Final = struct.Struct(">q")
UNSAID_VERSION: Final = "0.1.0 or older"  # what a hello without a version comes from
UNSAID_FORMAT: Final = 3  # the store format such a follower reads up to
MAX_HELLO: Final = 4096  # bytes of a message a peer may send before it has proven it knows the cluster's secret
MAX_MANIFEST: Final = 16 << 20  # bytes of a follower's manifest (some 100 bytes a file)
MAX_PAYLOAD: Final = 1 << 30  # a batch holding the largest messages, or a compacted segment, fits well below
Parts: TypeAlias = list[bytes | bytearray | memoryview]  # a message's bytes in parts, to be sent one after another


class FrameError(ValueError):
    """The stream holds something that is not a valid message: it must be closed."""


def encode(kind: int, payload: bytes | bytearray | memoryview) -> bytes:
    return b"".join(in_parts(kind, [payload]))


def in_parts(kind: int, payload: Sequence[bytes | bytearray | memoryview]) -> Parts:
    """The message whose payload is these parts joined, as its header and then the parts themselves, not copied: a
    frame of the store's batch can be tens of MB, and each copy of it held the leader's interpreter (its event loop
    with it) for tens of milliseconds, where zlib lets the interpreter go as it checks a part of more than 5 KiB."""
    crc = size = 0
    for part in payload:
        crc = zlib.crc32(part, crc)
        size += len(part)
    return [HEADER.pack(kind, size, crc), *payload]


def encode_frame(epoch: int, sequence: int, ops: bytes) -> bytes:
    return b"".join(frame_parts(epoch, sequence, [ops]))


def frame_parts(epoch: int, sequence: int, ops: Sequence[bytes | bytearray | memoryview]) -> Parts:
    """A FRAME of the ops in parts (storage.replica.ops_parts), in parts (in_parts())."""
    return in_parts(FRAME, [FRAME_HEAD.pack(epoch, sequence), *ops])


def link_key(secret: str, group: str) -> bytes:
    """The key the proofs of one replication group's stream are made with (``group``: the cluster's name and the
    group's number): a leader of another group, or of another cluster with the same secret, proves nothing to it."""
    return node_proof.link_key(secret, f"replication {group}")


def hello_payload(node: str, dir: str, epoch: int, nonce: bytes, version: str, store_format: int) -> bytes:
    """A HELLO's payload: what the proofs of both sides bind, and the message's."""
    return json.dumps({"node": node, "dir": dir, "epoch": epoch, "nonce": nonce.hex(), "version": version,
                       "format": store_format}).encode()


HEARTBEAT_MESSAGE: Final = encode(HEARTBEAT, b"")


def encode_manifest(files: list[tuple[str, int, str]]) -> bytes:
    return encode(MANIFEST, json.dumps({"files": files}, separators=(",", ":")).encode())


def decode_manifest(payload: bytes) -> dict[str, tuple[int, str]]:
    """A follower's files: path -> (size, sha256 hex)."""
    try:
        files = json.loads(payload)["files"]
    except (ValueError, RecursionError, KeyError, TypeError) as error:
        raise FrameError(f"malformed manifest: {error!r}") from None
    if not isinstance(files, list) or not all(
            isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and type(entry[1]) is int
            and entry[1] >= 0 and isinstance(entry[2], str) for entry in files):
        raise FrameError("malformed manifest: a list of [path, size, digest] expected")
    return {path: (size, digest) for path, size, digest in files}


def encode_ack(sequence: int) -> bytes:
    return encode(ACK, ACK_BODY.pack(sequence))


def encode_refuse(reason: str) -> bytes:
    return encode(REFUSE, reason.encode()[:1000])


@dataclass(frozen=True, slots=True)
class Hello:
    node: str  # the follower's node id
    dir: str  # the identity of the follower's data dir (cluster.state)
    epoch: int  # the newest leader epoch the follower has accepted frames of (0: none)
    nonce: bytes  # the follower's nonce, which the leader's challenge proves the secret over
    version: str  # the follower's Warren
    store_format: int  # the newest store format it reads (storage.format)


def decode_hello(payload: bytes) -> Hello:
    try:
        fields = json.loads(payload)
    except (ValueError, RecursionError) as error:  # RecursionError: a hostile nesting of brackets
        raise FrameError(f"malformed hello: {error}") from None
    if not isinstance(fields, dict) or not {"node", "dir", "epoch", "nonce"} <= fields.keys():
        raise FrameError("malformed hello: an object with node, dir, epoch and nonce expected")
    node, dir, epoch, text = fields["node"], fields["dir"], fields["epoch"], fields["nonce"]
    nonce = from_hex(text, NONCE_SIZE) if isinstance(text, str) else None
    # (a follower of a release that did not say read format 3, as every release up to the one that began to)
    version, store_format = fields.get("version", UNSAID_VERSION), fields.get("format", UNSAID_FORMAT)
    if not (isinstance(node, str) and isinstance(dir, str) and type(epoch) is int and nonce is not None
            and isinstance(version, str) and type(store_format) is int):
        raise FrameError(f"malformed hello: node, dir and version must be strings, epoch and format integers, nonce "
                         f"{NONCE_SIZE} bytes in lowercase hex")
    return Hello(node, dir, epoch, nonce, version[:100], store_format)


def decode_frame(payload: bytes) -> tuple[int, int, memoryview]:
    """(epoch, sequence, ops bytes) of a FRAME: the ops in a view of the payload, not copied."""
    if len(payload) < FRAME_HEAD.size:
        raise FrameError(f"frame of {len(payload)} bytes is shorter than its head")
    epoch, sequence = FRAME_HEAD.unpack_from(payload)
    return epoch, sequence, memoryview(payload)[FRAME_HEAD.size:]


def decode_ack(payload: bytes) -> int:
    if len(payload) != ACK_BODY.size:
        raise FrameError(f"ack of {len(payload)} bytes, expected {ACK_BODY.size}")
    return ACK_BODY.unpack(payload)[0]


class Reader:
    """Cuts a byte stream into (kind, payload) messages, checking each; the first bad one raises FrameError."""

    def __init__(self, limit: int = MAX_HELLO) -> None:
        self._buffer = bytearray()
        self.limit = limit  # the largest payload accepted now (raised once the peer is known)

    def feed(self, data: bytes, at_most: int | None = None) -> list[tuple[int, bytes]]:
        """The complete messages the stream holds with ``data`` (``at_most`` of them: the rest stays buffered, to be
        read once ``limit`` changes)."""
        buffer = self._buffer
        buffer += data
        messages: list[tuple[int, bytes]] = []
        start = 0
        while len(buffer) - start >= HEADER.size and (at_most is None or len(messages) < at_most):
            kind, length, crc = HEADER.unpack_from(buffer, start)
            if kind not in KINDS:
                raise FrameError(f"unknown message kind {kind}")
            if length > self.limit:
                raise FrameError(f"message of {length} bytes exceeds the limit of {self.limit}")
            end = start + HEADER.size + length
            if len(buffer) < end:
                break
            payload = bytes(memoryview(buffer)[start + HEADER.size:end])  # (one copy: a slice would be another)
            if zlib.crc32(payload) != crc:
                raise FrameError(f"checksum mismatch in a message of {length} bytes")
            messages.append((kind, payload))
            start = end
        if start:
            del buffer[:start]
        return messages
