"""Struct-based codecs for the hottest frames; each gives the same result as pamqp, byte for byte.

Decoders take a method frame payload (starting with the 4-byte class/method id, already checked by the
caller) and are as strict as RabbitMQ: fields cut short or followed by extra bytes raise AMQPError
"cannot decode", like codec.decode_method. Short strings decode as UTF-8; invalid UTF-8 raises that same
error, because pamqp rejects it too.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_METHOD,
    FRAME_OVERHEAD,
)
from protocol.codec import encode_content
from protocol.erlang_terms import Atom, write
from protocol.errors import AMQPError
from protocol.framing import frame_error

# basic.deliver: frame header, method id, consumer_tag length | consumer_tag | delivery_tag, redelivered,
# exchange length | exchange | routing_key length | routing_key | end byte.
_DELIVER_HEAD: Final = struct.Struct(">BHIIB")
_DELIVER_MIDDLE: Final = struct.Struct(">QBB")
_DELIVER_FIXED_SIZE: Final = 16  # payload bytes besides the three strings: id 4, 3 lengths, tag 8, bit octet 1
_END: Final = bytes((FRAME_END,))
_END_THEN_FRAME_HEAD: Final = struct.Struct(">BBHI")  # the end byte of one frame, then the next frame's header

# basic.ack / basic.nack: complete frame with a 13-byte payload (id, delivery_tag, bit octet).
_TAG_FRAME: Final = struct.Struct(">BHIIQBB")
_TAG_PAYLOAD_SIZE: Final = 13
_TAG_FIELDS: Final = struct.Struct(">QB")  # delivery_tag, bit octet; after the method id

_CONTENT_HEADER_PREFIX: Final = struct.Struct(">HxxQ")  # class_id, (weight), body_size


def _cannot_decode(payload: bytes) -> AMQPError:
    method_index = int.from_bytes(payload[:4])
    text = "cannot decode " + write(payload[4:132])
    return AMQPError(FRAME_ERROR, text, method_index >> 16, method_index & 0xFFFF)


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool]:
    """basic.publish method payload (incl. 4-byte id) -> (exchange, routing_key, mandatory, immediate)."""
    try:
        exchange_end = 7 + payload[6]  # after id (4) and ticket (2) comes the exchange length
        routing_key_end = exchange_end + 1 + payload[exchange_end]
        bits = payload[routing_key_end]
        if len(payload) != routing_key_end + 1:
            raise _cannot_decode(payload)
        exchange = payload[7:exchange_end].decode()
        routing_key = payload[exchange_end + 1 : routing_key_end].decode()
    except (IndexError, UnicodeDecodeError):
        raise _cannot_decode(payload) from None
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack -> (delivery_tag, multiple)."""
    if len(payload) != _TAG_PAYLOAD_SIZE:
        raise _cannot_decode(payload)
    delivery_tag, bits = _TAG_FIELDS.unpack_from(payload, 4)
    return delivery_tag, bool(bits & 1)


def decode_nack(payload: bytes) -> tuple[int, bool, bool]:
    """basic.nack -> (delivery_tag, multiple, requeue)."""
    if len(payload) != _TAG_PAYLOAD_SIZE:
        raise _cannot_decode(payload)
    delivery_tag, bits = _TAG_FIELDS.unpack_from(payload, 4)
    return delivery_tag, bool(bits & 1), bool(bits & 2)


def decode_reject(payload: bytes) -> tuple[int, bool]:
    """basic.reject -> (delivery_tag, requeue)."""
    if len(payload) != _TAG_PAYLOAD_SIZE:
        raise _cannot_decode(payload)
    delivery_tag, bits = _TAG_FIELDS.unpack_from(payload, 4)
    return delivery_tag, bool(bits & 1)


def decode_content_header(payload: bytes) -> tuple[int, int]:
    """Content header payload -> (class_id, body_size); AMQPError (501 unknown_frame, as RabbitMQ's
    analyze_frame) on input shorter than 12 bytes."""
    try:
        return _CONTENT_HEADER_PREFIX.unpack_from(payload)
    except struct.error:
        raise frame_error(Atom("unknown_frame"), FRAME_HEADER, payload) from None


def encode_delivery(
    channel: int, consumer_tag: bytes, delivery_tag: int, redelivered: bool, exchange: bytes, routing_key: bytes,
    header_payload: bytes, body: bytes, frame_max: int,
) -> bytes:
    """A complete basic.deliver method frame followed by its content frames (as codec.encode_content), as one bytes;
    a body that fits one frame is joined with the rest in a single pass. consumer_tag/exchange/routing_key are
    already UTF-8 encoded bytes (the broker caches them), each <= 255 bytes."""
    routing_key_size = len(routing_key)
    payload_size = _DELIVER_FIXED_SIZE + len(consumer_tag) + len(exchange) + routing_key_size
    method = (
        _DELIVER_HEAD.pack(FRAME_METHOD, channel, payload_size, BASIC_DELIVER, len(consumer_tag)),
        consumer_tag,
        _DELIVER_MIDDLE.pack(delivery_tag, redelivered, len(exchange)),
        exchange,
        routing_key_size.to_bytes(),
        routing_key,
    )  # the method frame but its end byte
    size = len(body)
    if not size or (frame_max and size > frame_max - FRAME_OVERHEAD):
        return b"".join((*method, _END)) + encode_content(channel, header_payload, body, frame_max)
    return b"".join(
        (
            *method,
            _END_THEN_FRAME_HEAD.pack(FRAME_END, FRAME_HEADER, channel, len(header_payload)),
            header_payload,
            _END_THEN_FRAME_HEAD.pack(FRAME_END, FRAME_BODY, channel, size),
            body,
            _END,
        )
    )


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Complete basic.ack frame."""
    return _TAG_FRAME.pack(FRAME_METHOD, channel, _TAG_PAYLOAD_SIZE, BASIC_ACK, delivery_tag, multiple, FRAME_END)


def encode_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """Complete basic.nack frame."""
    bits = multiple | requeue << 1
    return _TAG_FRAME.pack(FRAME_METHOD, channel, _TAG_PAYLOAD_SIZE, BASIC_NACK, delivery_tag, bits, FRAME_END)

