"""AMQP errors raised by handlers, and the one place that decides whether they close a channel or the connection."""

from __future__ import annotations

from protocol.constants import (
    ACCESS_REFUSED, CHANNEL_ERROR, COMMAND_INVALID, FRAME_ERROR, HARD_ERRORS, INTERNAL_ERROR, NOT_ALLOWED,
    NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED, RESOURCE_LOCKED, UNEXPECTED_FRAME,
)
from protocol.framing import reply_text


class AMQPError(Exception):
    """A protocol error: reply_code and the text after RabbitMQ's 'NAME - ' prefix."""

    def __init__(self, reply_code: int, text: str, class_id: int | None = None, method_id: int | None = None):
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id  # the method that failed; None: the dispatcher names the frame being handled
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """'NAME - text', cut like RabbitMQ's to fit a shortstr."""
        return reply_text(self.reply_code, self.text)

    @property
    def closes_connection(self) -> bool:
        return self.reply_code in HARD_ERRORS


def not_found(text: str) -> AMQPError:
    return AMQPError(NOT_FOUND, text)


def access_refused(text: str) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, text)


def precondition_failed(text: str) -> AMQPError:
    return AMQPError(PRECONDITION_FAILED, text)


def resource_locked(text: str) -> AMQPError:
    return AMQPError(RESOURCE_LOCKED, text)


def not_allowed(text: str) -> AMQPError:
    return AMQPError(NOT_ALLOWED, text)


def channel_error(text: str) -> AMQPError:
    return AMQPError(CHANNEL_ERROR, text)


def command_invalid(text: str) -> AMQPError:
    return AMQPError(COMMAND_INVALID, text)


def unexpected_frame(text: str) -> AMQPError:
    return AMQPError(UNEXPECTED_FRAME, text)


def frame_error(text: str) -> AMQPError:
    return AMQPError(FRAME_ERROR, text)


def not_implemented(text: str) -> AMQPError:
    return AMQPError(NOT_IMPLEMENTED, text)


def internal_error(text: str) -> AMQPError:
    return AMQPError(INTERNAL_ERROR, text)
