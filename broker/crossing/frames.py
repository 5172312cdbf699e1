"""The frames of a link between two processes of one node (no I/O here).

Every frame is ``[kind u8][length u32][payload]``: the link is a Unix stream socket between two processes of one
node, which the kernel neither loses nor corrupts, so no checksum. The process that serves a vhost (the home) sends
PUBLISH and CONTROL frames, each numbered by its place in the stream; the process that owns the queues answers with
ACKs of those numbers, DELIVER frames for the subscribers the home registered, and NOTICEs.

A PUBLISH frame holds a batch of messages, each ``[vhost u16][queue u16][exchange u8][routing key u8][header u32]
[body u32]`` lengths then those bytes; a DELIVER frame a batch of deliveries, each ``[subscriber u32][delivery id
i64][redelivered u8][exchange u8][routing key u8][header u32][body u32]`` then those bytes; an ACKED frame (home to
owner) a batch of delivery ids acked (i64 each). CONTROL and NOTICE hold one operation as a table in the store's
typed JSON (storage.definitions_log), which keeps AMQP's field types; DEAD_LETTER a table's length (u32), the table
(its vhost, exchange, routing keys) and the message as a PUBLISH batch holds one.
"""

from __future__ import annotations

import struct
from typing import Final, Iterator

from broker.model.message import Address, Header, Message
from storage.definitions_log import decode_data, encode_data

PUBLISH: Final = 1  # home -> owner: a batch of messages for its queues
CONTROL: Final = 2  # home -> owner: one operation (declare, delete, purge, consume, cancel, settle, credit)
ACKED: Final = 3  # home -> owner: a batch of delivery ids acked
ACK: Final = 4  # owner -> home: the frames up to a number are applied, and safe on its disk (ok) or not
DELIVER: Final = 5  # owner -> home: a batch of deliveries
NOTICE: Final = 6  # owner -> home: one event (a subscriber cancelled, a queue gone, the queues' counts)
DEAD_LETTER: Final = 7  # owner -> home: a message a queue dead-lettered, to route from its dead-letter exchange
GOT: Final = 8  # owner -> home: the answer to a get (its id, the messages left, and the message unless there was none)
KINDS: Final = (PUBLISH, CONTROL, ACKED, ACK, DELIVER, NOTICE, DEAD_LETTER, GOT)

HEADER: Final = struct.Struct(">BI")
MESSAGE: Final = struct.Struct(">HHBBII")  # the lengths of a message's vhost, queue, exchange, key, header, body
# a delivery's subscriber, delivery id, redelivered, and the lengths of its exchange, routing key, header, body
DELIVERY: Final = struct.Struct(">IqBBBII")
ACK_BODY: Final = struct.Struct(">qB")  # the last frame applied, whether the store wrote them; then failed frames
ID: Final = struct.Struct(">q")
MAX_PAYLOAD: Final = 1 << 30  # far above a batch of the largest messages


class FrameError(ValueError):
    """The stream holds something that is not a frame: the link must be closed."""


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def encode_message(vhost: bytes, queue: bytes, message: Message) -> bytes:
    address = message.address
    exchange, routing_key = address.exchange_bytes, address.routing_key_bytes
    header, body = message.header_payload, message.body
    return b"".join((MESSAGE.pack(len(vhost), len(queue), len(exchange), len(routing_key), len(header), len(body)),
                     vhost, queue, exchange, routing_key, header, body))


def encode_delivery(subscriber: int, delivery_id: int, redelivered: bool, message: Message) -> bytes:
    address = message.address
    exchange, routing_key = address.exchange_bytes, address.routing_key_bytes
    header, body = message.header_payload, message.body
    return b"".join((DELIVERY.pack(subscriber, delivery_id, redelivered, len(exchange), len(routing_key), len(header),
                                   len(body)), exchange, routing_key, header, body))


def decode_table(payload: bytes) -> dict:
    try:
        table = decode_data(payload)
    except (ValueError, RecursionError) as error:
        raise FrameError(f"malformed operation: {error}") from None
    if table is None:
        raise FrameError("empty operation")
    return table


TABLE_LENGTH: Final = struct.Struct(">I")
GOT_HEAD: Final = struct.Struct(">II")  # the get's id, the queue's ready messages after it


def encode_got(request: int, ready: int, delivery: bytes) -> bytes:
    """A get's answer: delivery is the message's record as a DELIVER batch holds it (its subscriber 0), or empty."""
    return GOT_HEAD.pack(request, ready) + delivery


def decode_got(payload: bytes, messages: "Messages") -> tuple[int, int, tuple[int, Message, bool] | None]:
    """(the get's id, the ready messages left, (delivery id, message, redelivered) or None)."""
    try:
        request, ready = GOT_HEAD.unpack_from(payload)
    except struct.error:
        raise FrameError("a get's answer without its head") from None
    found = list(messages.delivered(payload[GOT_HEAD.size:]))
    if len(found) > 1:
        raise FrameError(f"{len(found)} messages in a get's answer")
    return request, ready, (found[0][1], found[0][3], found[0][2]) if found else None


def encode_dead_letter(vhost: str, exchange: str, keys: list[str], message: Message, no_cycles: bool) -> bytes:
    table = encode_data({"vhost": vhost, "exchange": exchange, "keys": keys, "no_cycles": no_cycles})
    return TABLE_LENGTH.pack(len(table)) + table + encode_message(b"", b"", message)


def decode_dead_letter(payload: bytes, messages: "Messages") -> tuple[dict, Message]:
    try:
        (length,) = TABLE_LENGTH.unpack_from(payload)
    except struct.error:
        raise FrameError("a dead-lettered message without its table") from None
    table = decode_table(payload[TABLE_LENGTH.size:TABLE_LENGTH.size + length])
    found = list(messages.published(payload[TABLE_LENGTH.size + length:]))
    if len(found) != 1:
        raise FrameError(f"{len(found)} messages in a dead-letter frame")
    return table, found[0][2]


def encode_ack(number: int, stored: bool, failed: list[int]) -> bytes:
    """The frames up to number are applied (and on disk, if stored), those of failed not as asked."""
    return ACK_BODY.pack(number, stored) + b"".join(ID.pack(frame_number) for frame_number in failed)


def decode_ack(payload: bytes) -> tuple[int, bool, list[int]]:
    if len(payload) < ACK_BODY.size or (len(payload) - ACK_BODY.size) % ID.size:
        raise FrameError(f"ack of {len(payload)} bytes")
    number, stored = ACK_BODY.unpack_from(payload)
    return number, bool(stored), decode_ids(payload[ACK_BODY.size:])


def decode_ids(payload: bytes) -> list[int]:
    if len(payload) % ID.size:
        raise FrameError(f"a batch of ids of {len(payload)} bytes")
    return [value for (value,) in ID.iter_unpack(payload)]


class Messages:
    """Makes messages of the bytes of a batch, reusing the address and header of the one before when their bytes are
    the same (a publisher's batch often repeats both), so that most records cost three slices and no decoding, and
    nothing grows with the link's life."""

    def __init__(self) -> None:
        self.address_bytes = b""  # the exchange and routing key of the last address made, as sent
        self.address = Address("", "")
        self.header = Header(b"")

    def make(self, address: bytes, exchange_length: int, header: bytes, body: bytes) -> Message:
        shared_address = self.address
        if address != self.address_bytes:
            shared_address = self.address = Address(address[:exchange_length].decode(),
                                                    address[exchange_length:].decode())
            self.address_bytes = address
        shared_header = self.header
        if shared_header.payload != header:
            shared_header = self.header = Header(header)
        return Message(shared_address, shared_header, body)

    def published(self, payload: bytes) -> Iterator[tuple[bytes, int, Message]]:
        """(its vhost's and queue's names as sent, the vhost's length, message) of each message of a PUBLISH
        payload (queue_of reads the names)."""
        at, end = 0, len(payload)
        try:
            while at < end:
                vhost, queue, exchange, key, header, body = MESSAGE.unpack_from(payload, at)
                at += MESSAGE.size
                names_end = at + vhost + queue
                address_end = names_end + exchange + key
                header_end = address_end + header
                body_end = header_end + body
                if body_end > end:
                    raise FrameError("a message runs past its batch")
                yield payload[at:names_end], vhost, self.make(payload[names_end:address_end], exchange,
                                                              payload[address_end:header_end],
                                                              payload[header_end:body_end])
                at = body_end
        except (struct.error, UnicodeDecodeError) as error:
            raise FrameError(f"malformed batch of messages: {error}") from None

    def delivered(self, payload: bytes) -> Iterator[tuple[int, int, bool, Message]]:
        """(subscriber, delivery id, redelivered, message) of each delivery of a DELIVER payload."""
        at, end = 0, len(payload)
        try:
            while at < end:
                subscriber, delivery_id, redelivered, exchange, key, header, body = DELIVERY.unpack_from(payload, at)
                at += DELIVERY.size
                address_end = at + exchange + key
                header_end = address_end + header
                body_end = header_end + body
                if body_end > end:
                    raise FrameError("a delivery runs past its batch")
                yield subscriber, delivery_id, bool(redelivered), self.make(
                    payload[at:address_end], exchange, payload[address_end:header_end], payload[header_end:body_end])
                at = body_end
        except (struct.error, UnicodeDecodeError) as error:
            raise FrameError(f"malformed batch of deliveries: {error}") from None


def queue_of(names: bytes, vhost_length: int) -> tuple[str, str]:
    """(vhost, queue) of a message's names as published() gives them."""
    try:
        return names[:vhost_length].decode(), names[vhost_length:].decode()
    except UnicodeDecodeError as error:
        raise FrameError(f"a message's names: {error}") from None


class Reader:
    """Cuts a byte stream into (kind, payload) frames; one it cannot read raises FrameError."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self._buffer
        buffer += data
        frames: list[tuple[int, bytes]] = []
        start = 0
        while len(buffer) - start >= HEADER.size:
            kind, length = HEADER.unpack_from(buffer, start)
            if kind not in KINDS:
                raise FrameError(f"unknown frame kind {kind}")
            if length > MAX_PAYLOAD:
                raise FrameError(f"frame of {length} bytes exceeds the limit of {MAX_PAYLOAD}")
            end = start + HEADER.size + length
            if len(buffer) < end:
                break
            frames.append((kind, bytes(buffer[start + HEADER.size:end])))
            start = end
        if start:
            del buffer[:start]
        return frames
