"""Direct reply-to: RPC replies that go straight to the requesting channel, with no queue in between.

A client consumes (no-ack) from the pseudo-queue amq.rabbitmq.reply-to, publishes requests with that name as their
reply_to property, and the broker rewrites it to amq.rabbitmq.reply-to.<token>; a reply published to the default
exchange with that routing key is delivered to the consumer directly, as RabbitMQ does.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from protocol import errors

if TYPE_CHECKING:
    from broker.model.interfaces import ReplyReceiver
    from broker.model.message import Message
    from broker.session.channel import Channel

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = PSEUDO_QUEUE + "."


class ReplyConsumer:
    """The one direct reply-to consumer a channel may have."""

    __slots__ = ("tag", "tag_bytes", "token")

    def __init__(self, tag: str):
        self.tag = tag
        self.tag_bytes = tag.encode()  # pre-encoded for basic.deliver
        self.token = base64.urlsafe_b64encode(os.urandom(18)).decode()  # names the channel in reply_to


def start(channel: "Channel", tag: str, no_ack: bool) -> None:
    if not no_ack:
        raise errors.precondition_failed("reply consumer cannot acknowledge")
    if channel.reply_consumer is not None:
        raise errors.precondition_failed("reply consumer already set")
    consumer = ReplyConsumer(tag)
    channel.reply_consumer = consumer
    channel.vhost.reply_channels[consumer.token] = channel


def stop(channel: "Channel") -> None:
    consumer = channel.reply_consumer
    if consumer is not None:
        channel.reply_consumer = None
        channel.vhost.reply_channels.pop(consumer.token, None)


def reply_address(channel: "Channel") -> str:
    """What a request's reply_to becomes; the channel must consume from the pseudo-queue."""
    if channel.reply_consumer is None:
        raise errors.precondition_failed("fast reply consumer does not exist")
    return REPLY_PREFIX + channel.reply_consumer.token


def deliver_reply(channels: dict[str, "ReplyReceiver"], routing_key: str, message: "Message") -> bool:
    """Hand a reply to the channel its routing key names; False if that channel is gone (the reply is dropped)."""
    channel = channels.get(routing_key[len(REPLY_PREFIX):])
    if channel is None or not channel.open:
        return False
    channel.deliver_reply(message)
    return True
