"""Content assembly, as RabbitMQ's rabbit_command_assembler: a method with content (basic.publish) is followed by
its content header, then by body frames up to the size the header announced. Pure: frames in, the assembled
content or RabbitMQ's error out; no I/O and no broker state. The channel keeps the one Content in progress and
decodes methods itself (the fast path); a body that arrives in one frame is never copied."""

from __future__ import annotations

from typing import Final

from protocol.constants import PRECONDITION_FAILED, UNEXPECTED_FRAME
from protocol.errors import AMQPError, frame_error
from protocol.fastpath import decode_content_header

PUBLISH: Final = (60, 40)  # class and method of basic.publish, named by errors in its content frames


class Content:
    """A basic.publish whose content header and body frames are still arriving."""
    __slots__ = ("exchange", "routing_key", "mandatory", "header", "body_size", "parts", "received")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool):
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.header = b""  # raw content-header payload, once it arrives
        self.body_size = -1  # announced by the content header; -1 until it arrives
        self.parts: list[bytes] = []  # body frames received so far
        self.received = 0  # bytes of body received so far


def out_of_order(content: Content | None) -> AMQPError:
    """A frame other than the one the content being assembled needs, with RabbitMQ's texts."""
    if content is None:
        return AMQPError(UNEXPECTED_FRAME, "expected method frame, got non method frame instead", 0, 0)
    if content.body_size < 0:
        return AMQPError(UNEXPECTED_FRAME, "expected content header for class 60, got non content header frame "
                                           "instead", *PUBLISH)
    return AMQPError(UNEXPECTED_FRAME, "expected content body, got non content body frame instead", *PUBLISH)


def content_header(content: Content, payload: bytes, max_message_size: int) -> int:
    """A content header frame for content: its body size, once RabbitMQ's checks pass (else their error)."""
    if content.body_size >= 0:
        raise out_of_order(content)
    class_id, body_size = decode_content_header(payload)
    if class_id != 60:
        raise AMQPError(UNEXPECTED_FRAME, f"expected content header for class 60, got one for class {class_id} "
                                          "instead", *PUBLISH)
    if body_size > max_message_size:
        raise AMQPError(PRECONDITION_FAILED,
                        f"message size {body_size} is larger than configured max size {max_message_size}")
    content.header = payload
    content.body_size = body_size
    return body_size


def content_body(content: Content, payload: bytes) -> bytes | None:
    """A body frame for content: the whole body once it is complete (the frame itself when it carries all of it),
    None while parts are missing."""
    if content.body_size < 0:
        raise out_of_order(content)
    received = content.received = content.received + len(payload)
    if received > content.body_size:
        raise frame_error(f"type 3, all octets = <<>>: {{content_too_large,{received},{content.body_size}}}")
    parts = content.parts
    if received == content.body_size and not parts:
        return payload
    parts.append(payload)
    if received < content.body_size:
        return None
    return b"".join(parts)
