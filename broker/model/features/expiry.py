"""Message TTL (x-message-ttl, the expiration property) and queue TTL (x-expires), in whole milliseconds."""

from __future__ import annotations

from broker.model.message import Message
from protocol import errors

MAX_EXPIRY_MS = 315360000000  # RabbitMQ's upper bound for TTLs: ten years in milliseconds


def parse_expiration(text: str) -> int:
    """A message's expiration property as milliseconds, with RabbitMQ's errors for what is not one."""
    try:
        value = int(text, 10)
    except ValueError:
        raise errors.precondition_failed(f"invalid expiration '{text}': no_integer") from None
    if value < 0:
        raise errors.precondition_failed(f"invalid expiration '{text}': {{value_negative,{value}}}")
    if value > MAX_EXPIRY_MS:
        raise errors.precondition_failed(f"invalid expiration '{text}': {{value_too_large,{value}}}")
    return value


def message_ttl(queue_ttl: int | None, message: Message) -> int | None:
    """The TTL that applies to message in a queue: the shorter of the queue's and the message's own."""
    expiration = message.header.scan.expiration
    if expiration is None:
        return queue_ttl
    own = parse_expiration(expiration)
    return own if queue_ttl is None else min(own, queue_ttl)
