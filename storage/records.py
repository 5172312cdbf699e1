"""Record framing and payload codecs for the message segments and the definitions log.

Every record on disk is ``[length u32][crc32 u32][payload]``; the CRC covers the payload, whose first byte is the
record type. Integers are little-endian. Names are UTF-8 with a u16 length prefix. ``plausible_end`` and
``record_end`` tell a record's head from stray bytes, for finding the next record after a damaged one.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

FRAME: Final = struct.Struct("<II")  # payload length, crc32 of the payload
FRAME_SIZE: Final = FRAME.size
MAX_PAYLOAD: Final = 1 << 31  # anything larger is a corrupt length field, not a record

# Segment records
PUBLISH: Final = 1  # a persistent message routed to one or more durable queues
REMOVED: Final = 2  # messages left a queue (ack, reject, expiry, purge...)
DELIVERED: Final = 3  # messages were handed to a consumer and may come back redelivered
ADOPTED: Final = 4  # messages written under a held key (HELD_PREFIX) are now the messages of the queue it names
# Definitions-log records
LEGACY_DEFINITION: Final = 10  # a DEFINITION of the first format (data: JSON with tagged values; still read)
QUEUE_DELETED: Final = 11  # every message of a queue with an id below a watermark is gone
DEFINITION: Final = 12  # latest state of one definition (or its deletion); data in the typed format of definitions.py

SEGMENT_TYPES: Final = frozenset((PUBLISH, REMOVED, DELIVERED, ADOPTED))
DEFINITIONS_TYPES: Final = frozenset((LEGACY_DEFINITION, QUEUE_DELETED, DEFINITION))
MAX_PLAUSIBLE_ID: Final = 1 << 48  # message ids count up from 1: a larger one is a stray byte pattern, not an id

_PUBLISH_HEAD: Final = struct.Struct("<BQH")  # type, msg id, number of queues
MSG_ID: Final = struct.Struct("<Q")  # a message id (in a publish record, after its type byte)
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_ID_LIST_HEAD: Final = struct.Struct("<BH")  # type, queue name length (ids follow the name)
_QUEUE_DELETED: Final = struct.Struct("<BQH")  # type, watermark, queue name length
_DEFINITION_HEAD: Final = struct.Struct("<BHH")  # type, kind length, name length
# Before the key a transaction's messages for one queue are written under until the transaction is decided: then an
# ADOPTED record makes them the queue's, or a REMOVED record drops them. "<prefix><transaction>|<queue's key>": no
# key made of names holds a NUL, and a transaction's name holds no "|".
HELD_PREFIX: Final = "\x00held|"


def held_key(transaction: str, queue: str) -> str:
    """The key a transaction's messages for queue (its key) are held under."""
    assert "|" not in transaction, "a transaction's name ends at the first separator"
    return f"{HELD_PREFIX}{transaction}|{queue}"


def held_parts(key: str) -> tuple[str, str] | None:
    """(transaction, queue's key) of a held key; None for any other key."""
    if not key.startswith(HELD_PREFIX):
        return None
    transaction, separator, queue = key[len(HELD_PREFIX):].partition("|")
    return (transaction, queue) if separator else None


class CorruptRecord(Exception):
    """A record whose frame or payload cannot be trusted."""


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def publish_head(
    msg_id: int, queues: Sequence[str] | Sequence[tuple[str, bool]], exchange: str, routing_key: str,
    header_payload: bytes, body: bytes,
) -> bytes:
    """Frame header + metadata of a publish record (the frame's CRC covers header_payload and body too).

    The caller writes ``head``, then ``header_payload``, then ``body``: no copy of the body is made here.
    ``queues`` holds names (fresh publish) or (name, delivered) pairs (a record rewritten by compaction).
    """
    parts = [_PUBLISH_HEAD.pack(PUBLISH, msg_id, len(queues))]
    for queue in queues:
        name, delivered = (queue, False) if isinstance(queue, str) else queue
        encoded = name.encode()
        parts.append(_U16.pack(len(encoded)))
        parts.append(encoded)
        parts.append(b"\x01" if delivered else b"\x00")
    exchange_b = exchange.encode()
    key_b = routing_key.encode()
    parts += (_U16.pack(len(exchange_b)), exchange_b, _U16.pack(len(key_b)), key_b, _U32.pack(len(header_payload)))
    meta = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(header_payload, zlib.crc32(meta)))
    length = len(meta) + len(header_payload) + len(body)
    return FRAME.pack(length, crc) + meta


def id_list(kind: int, queue: str, msg_ids: list[int] | array[int]) -> bytes:
    """A framed REMOVED, DELIVERED or ADOPTED record."""
    name = queue.encode()
    ids = msg_ids if isinstance(msg_ids, array) else array("Q", msg_ids)
    return frame(_ID_LIST_HEAD.pack(kind, len(name)) + name + ids.tobytes())


def definition(kind: str, name: str, data_json: bytes) -> bytes:
    """A framed DEFINITION record; empty ``data_json`` (typed format) means the definition was deleted."""
    kind_b = kind.encode()
    name_b = name.encode()
    return frame(_DEFINITION_HEAD.pack(DEFINITION, len(kind_b), len(name_b)) + kind_b + name_b + data_json)


def queue_deleted(queue: str, below_id: int) -> bytes:
    name = queue.encode()
    return frame(_QUEUE_DELETED.pack(QUEUE_DELETED, below_id, len(name)) + name)


Metadata = tuple[tuple[tuple[str, bool], ...], str, str, bytes]  # (queue, delivered) pairs, exchange, key, header


@dataclass(slots=True)
class Publish:
    msg_id: int
    queues: list[tuple[str, bool]]  # (queue, delivered) pairs
    exchange: str
    routing_key: str
    header_payload: bytes
    body: bytes


def decode_publish(payload: memoryview) -> Publish:
    _, msg_id, count = _PUBLISH_HEAD.unpack_from(payload)
    pos = _PUBLISH_HEAD.size
    queues = []
    for _ in range(count):
        (size,) = _U16.unpack_from(payload, pos)
        pos += 2
        queues.append((str(payload[pos:pos + size], "utf-8"), payload[pos + size] == 1))
        pos += size + 1
    (size,) = _U16.unpack_from(payload, pos)
    exchange = str(payload[pos + 2:pos + 2 + size], "utf-8")
    pos += 2 + size
    (size,) = _U16.unpack_from(payload, pos)
    routing_key = str(payload[pos + 2:pos + 2 + size], "utf-8")
    pos += 2 + size
    (size,) = _U32.unpack_from(payload, pos)
    pos += 4
    header_payload = bytes(payload[pos:pos + size])
    return Publish(msg_id, queues, exchange, routing_key, header_payload, bytes(payload[pos + size:]))


# class id, weight, body size, property flags (big-endian, as on the wire)
_CONTENT_HEADER: Final = struct.Struct(">HHQH")
_TABLE_SIZE: Final = struct.Struct(">I")


def is_persistent(header_payload: bytes) -> bool:
    """Whether a content header says delivery mode 2 (persistent). Its properties come in flag order: content type
    and encoding (short strings) and headers (a table) before the delivery mode."""
    try:
        flags = _CONTENT_HEADER.unpack_from(header_payload)[3]
        pos = _CONTENT_HEADER.size
        for flag in (0x8000, 0x4000):  # content type, content encoding
            if flags & flag:
                pos += 1 + header_payload[pos]
        if flags & 0x2000:  # headers
            pos += 4 + _TABLE_SIZE.unpack_from(header_payload, pos)[0]
        return bool(flags & 0x1000) and header_payload[pos] == 2
    except (struct.error, IndexError):
        return False


class PublishReader:
    """Decodes the publish records of a log read back whole, sharing equal values across records.

    What sits between a record's msg id and its body (queues, exchange, routing key, content header) is usually the
    same as in the record before: then it is recognised by comparing bytes, and the decoded values of that record
    are returned again, the same objects. Otherwise names and headers seen recently are still shared.
    """

    CACHE_ENTRIES: Final = 4096  # distinct names and headers remembered (forgotten all at once beyond this)

    def __init__(self) -> None:
        self._meta: bytes | None = None  # the metadata bytes of the last record decoded
        self._decoded: Metadata = ((), "", "", b"")  # what they decode to
        self._names: dict[bytes, str] = {}
        self._headers: dict[bytes, bytes] = {}

    def read(self, data: bytes, start: int, end: int) -> tuple[int, Metadata, int]:
        """(msg id, (queues, exchange, routing key, header payload), where the body starts) of the record
        ``data[start:end]`` (its body runs to end)."""
        (msg_id,) = MSG_ID.unpack_from(data, start + 1)
        meta_start = start + _PUBLISH_HEAD.size - 2  # the queue count is part of the metadata
        meta = self._meta
        if meta is not None and data.startswith(meta, meta_start):
            return msg_id, self._decoded, meta_start + len(meta)
        body_start = self._decode_metadata(data, meta_start)
        return msg_id, self._decoded, body_start

    @property
    def metadata_bytes(self) -> bytes:
        """The metadata bytes of the record read last."""
        return self._meta or b""

    def _decode_metadata(self, data: bytes, pos: int) -> int:
        meta_start = pos
        (count,) = _U16.unpack_from(data, pos)
        pos += 2
        queues = []
        for _ in range(count):
            (size,) = _U16.unpack_from(data, pos)
            pos += 2
            queues.append((self._name(data[pos:pos + size]), data[pos + size] == 1))
            pos += size + 1
        (size,) = _U16.unpack_from(data, pos)
        exchange = self._name(data[pos + 2:pos + 2 + size])
        pos += 2 + size
        (size,) = _U16.unpack_from(data, pos)
        routing_key = self._name(data[pos + 2:pos + 2 + size])
        pos += 2 + size
        (size,) = _U32.unpack_from(data, pos)
        pos += 4
        header_payload = self._header(data[pos:pos + size])
        pos += size
        self._meta = data[meta_start:pos]
        self._decoded = (tuple(queues), exchange, routing_key, header_payload)
        return pos

    def _name(self, encoded: bytes) -> str:
        name = self._names.get(encoded)
        if name is None:
            if len(self._names) >= self.CACHE_ENTRIES:
                self._names.clear()
            name = self._names[encoded] = str(encoded, "utf-8")
        return name

    def _header(self, payload: bytes) -> bytes:
        shared = self._headers.get(payload)
        if shared is None:
            if len(self._headers) >= self.CACHE_ENTRIES:
                self._headers.clear()
            shared = self._headers[payload] = payload
        return shared


def decode_id_list(payload: memoryview) -> tuple[str, array[int]]:
    _, size = _ID_LIST_HEAD.unpack_from(payload)
    start = _ID_LIST_HEAD.size
    ids = array("Q")
    ids.frombytes(payload[start + size:])
    return str(payload[start:start + size], "utf-8"), ids


def decode_definition(payload: memoryview) -> tuple[str, str, bytes]:
    _, kind_size, name_size = _DEFINITION_HEAD.unpack_from(payload)
    pos = _DEFINITION_HEAD.size
    kind = str(payload[pos:pos + kind_size], "utf-8")
    pos += kind_size
    name = str(payload[pos:pos + name_size], "utf-8")
    return kind, name, bytes(payload[pos + name_size:])


def decode_queue_deleted(payload: memoryview) -> tuple[str, int]:
    _, below_id, size = _QUEUE_DELETED.unpack_from(payload)
    return str(payload[_QUEUE_DELETED.size:_QUEUE_DELETED.size + size], "utf-8"), below_id


def scan(data: bytes | bytearray | memoryview, offset: int = 0) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (offset, end, payload) for each intact record from ``offset``; raise CorruptRecord at the first bad one.

    ``CorruptRecord.args`` are the offset of the bad record and the reason.
    """
    view = memoryview(data)
    total = len(view)
    pos = offset
    unpack = FRAME.unpack_from
    crc32 = zlib.crc32
    while pos < total:
        if total - pos < FRAME_SIZE:
            raise CorruptRecord(pos, "truncated frame header")
        length, crc = unpack(view, pos)
        start = pos + FRAME_SIZE
        end = start + length
        if length == 0 or length > MAX_PAYLOAD or end > total:
            raise CorruptRecord(pos, "length runs past the end of the file")
        payload = view[start:end]
        if crc32(payload) != crc:
            raise CorruptRecord(pos, "CRC mismatch")
        yield pos, end, payload
        pos = end


# --- telling a record header from stray bytes (resynchronising after corruption) -------------------------------
def plausible_end(view: memoryview, pos: int, types: frozenset[int]) -> int | None:
    """Where the record at ``pos`` ends if its frame and payload layout hold together (a known type, sizes that fit,
    flags that are 0 or 1, ids in range); None if they do not. Costs no more than reading the record's head."""
    total = len(view)
    if total - pos < FRAME_SIZE + 1:
        return None
    (length,) = _U32.unpack_from(view, pos)
    start = pos + FRAME_SIZE
    end = start + length
    if length == 0 or end > total:
        return None
    kind = view[start]
    if kind not in types or not _LAYOUTS[kind](view, start, end):
        return None
    return end


def record_end(view: memoryview, pos: int, types: frozenset[int]) -> int | None:
    """Where the record at ``pos`` ends if it is an intact record of one of ``types``, else None."""
    end = plausible_end(view, pos, types)
    if end is None or zlib.crc32(view[pos + FRAME_SIZE:end]) != _U32.unpack_from(view, pos + 4)[0]:
        return None
    return end


def _publish_layout(view: memoryview, start: int, end: int) -> bool:
    if end - start < _PUBLISH_HEAD.size:
        return False
    _, msg_id, count = _PUBLISH_HEAD.unpack_from(view, start)
    if msg_id >= MAX_PLAUSIBLE_ID or count == 0:
        return False
    pos = start + _PUBLISH_HEAD.size
    for _ in range(count):
        if pos + 2 > end:
            return False
        pos += 2 + _U16.unpack_from(view, pos)[0]
        if pos >= end or view[pos] > 1:
            return False
        pos += 1
    for _ in range(2):  # exchange, routing key
        if pos + 2 > end:
            return False
        pos += 2 + _U16.unpack_from(view, pos)[0]
    return pos + 4 <= end and pos + 4 + _U32.unpack_from(view, pos)[0] <= end


def _id_list_layout(view: memoryview, start: int, end: int) -> bool:
    if end - start < _ID_LIST_HEAD.size:
        return False
    ids_start = start + _ID_LIST_HEAD.size + _ID_LIST_HEAD.unpack_from(view, start)[1]
    if ids_start > end or (end - ids_start) % MSG_ID.size:
        return False
    return ids_start == end or MSG_ID.unpack_from(view, ids_start)[0] < MAX_PLAUSIBLE_ID


def _definition_layout(view: memoryview, start: int, end: int) -> bool:
    if end - start < _DEFINITION_HEAD.size:
        return False
    _, kind_size, name_size = _DEFINITION_HEAD.unpack_from(view, start)
    kind_start = start + _DEFINITION_HEAD.size
    return kind_start + kind_size + name_size <= end and bytes(view[kind_start:kind_start + kind_size]) in _KINDS


def _queue_deleted_layout(view: memoryview, start: int, end: int) -> bool:
    if end - start < _QUEUE_DELETED.size:
        return False
    _, below_id, size = _QUEUE_DELETED.unpack_from(view, start)
    return below_id < MAX_PLAUSIBLE_ID and start + _QUEUE_DELETED.size + size == end


_KINDS: Final = frozenset((b"exchange", b"queue", b"binding", b"vhost", b"user", b"policy", b"permission",
                           b"operator_policy", b"parameter", b"transaction",
                           b"retained", b"topic_permission", b"mqtt_session",
                           b"mqtt_will"))  # definitions.KINDS, encoded
_LAYOUTS: Final[dict[int, Callable[[memoryview, int, int], bool]]] = {
    PUBLISH: _publish_layout, REMOVED: _id_list_layout, DELIVERED: _id_list_layout, ADOPTED: _id_list_layout,
    LEGACY_DEFINITION: _definition_layout, DEFINITION: _definition_layout, QUEUE_DELETED: _queue_deleted_layout,
}
