"""The frames an MQTT connection's AMQP channel writes back, read as events: deliveries, publisher confirms, the
replies of the methods the connection sent it, and its close. The channel is the one AMQP clients use (every check,
confirm and settlement its own), so MQTT is a front end of it rather than a second broker; this is the seam."""

from __future__ import annotations

import struct
from typing import Final, Protocol

from protocol.constants import (
    BASIC_ACK, BASIC_CANCEL, BASIC_DELIVER, BASIC_NACK, CHANNEL_CLOSE, FRAME_BODY, FRAME_HEADER, FRAME_METHOD,
)

_FRAME_HEAD: Final = struct.Struct(">BHI")
_METHOD: Final = struct.Struct(">I")
_TAG_BITS: Final = struct.Struct(">QB")
_BODY_SIZE: Final = struct.Struct(">Q")
_REPLY_CODE: Final = struct.Struct(">H")


class ReplyListener(Protocol):
    """What the MQTT connection does with its channel's frames."""

    def delivered(self, consumer_tag: bytes, delivery_tag: int, redelivered: bool, routing_key: bytes,
                  header_payload: bytes, body: bytes) -> None: ...

    def confirmed(self, seq: int, multiple: bool, ack: bool) -> None: ...

    def replied(self, method_index: int) -> None: ...

    def cancelled(self) -> None: ...

    def channel_closed(self, reply_code: int, reply_text: str) -> None: ...


class _Delivery:
    """A basic.deliver waiting for its content."""

    __slots__ = ("consumer_tag", "delivery_tag", "redelivered", "routing_key", "header", "size", "parts")

    def __init__(self, consumer_tag: bytes, delivery_tag: int, redelivered: bool, routing_key: bytes):
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.routing_key = routing_key
        self.header = b""  # the content header's payload, once it came
        self.size = -1  # the body's size, from the content header
        self.parts: list[bytes] = []  # body frames so far


class ChannelReplies:
    """Reads whole frames (a channel writes nothing else) and tells listener what they are."""

    def __init__(self, listener: ReplyListener):
        self.listener = listener
        self.delivery: _Delivery | None = None  # a delivery whose body has not all come

    def feed(self, data: bytes) -> None:
        at = 0
        end = len(data)
        listener = self.listener
        while at < end:
            frame_type, _, size = _FRAME_HEAD.unpack_from(data, at)
            start = at + 7
            at = start + size + 1
            if frame_type == FRAME_METHOD:
                method = _METHOD.unpack_from(data, start)[0]
                if method == BASIC_DELIVER:
                    self._deliver(data, start + 4)
                elif method == BASIC_ACK or method == BASIC_NACK:
                    seq, bits = _TAG_BITS.unpack_from(data, start + 4)
                    listener.confirmed(seq, bool(bits & 1), method == BASIC_ACK)
                elif method == CHANNEL_CLOSE:
                    code = _REPLY_CODE.unpack_from(data, start + 4)[0]
                    length = data[start + 6]
                    text = data[start + 7:start + 7 + length].decode(errors="replace")
                    listener.channel_closed(code, text)
                elif method == BASIC_CANCEL:
                    listener.cancelled()
                else:
                    listener.replied(method)
            elif frame_type == FRAME_HEADER:
                delivery = self.delivery
                assert delivery is not None, "a content header follows its basic.deliver"
                delivery.header = data[start:start + size]
                delivery.size = _BODY_SIZE.unpack_from(data, start + 4)[0]
                if not delivery.size:
                    self._complete(delivery, b"")
            elif frame_type == FRAME_BODY:
                delivery = self.delivery
                assert delivery is not None, "a body frame follows its content header"
                delivery.parts.append(data[start:start + size])
                if sum(map(len, delivery.parts)) >= delivery.size:
                    self._complete(delivery, b"".join(delivery.parts))

    def _deliver(self, data: bytes, at: int) -> None:
        tag_size = data[at]
        consumer_tag = data[at + 1:at + 1 + tag_size]
        at += 1 + tag_size
        delivery_tag, redelivered = _TAG_BITS.unpack_from(data, at)
        at += 9
        at += 1 + data[at]  # the exchange
        key_size = data[at]
        self.delivery = _Delivery(consumer_tag, delivery_tag, bool(redelivered), data[at + 1:at + 1 + key_size])

    def _complete(self, delivery: _Delivery, body: bytes) -> None:
        self.delivery = None
        self.listener.delivered(delivery.consumer_tag, delivery.delivery_tag, delivery.redelivered,
                                delivery.routing_key, delivery.header, body)
