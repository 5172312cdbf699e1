"""Protocol errors: the one exception type raised for every AMQP error (malformed frames, refused methods), and the
one pure function that decides how an error closes things (rabbit_binary_generator:map_exception)."""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol.constants import (
    ACCESS_REFUSED, BASIC_PUBLISH, CHANNEL_ERROR, COMMAND_INVALID, FRAME_ERROR, FRAME_METHOD, HARD_ERRORS,
    INTERNAL_ERROR, NOT_ALLOWED, NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED, REPLY_NAMES, RESOURCE_LOCKED,
    UNEXPECTED_FRAME,
)

_CLASS_METHOD = struct.Struct(">HH")
_BASIC_PUBLISH = divmod(BASIC_PUBLISH, 0x10000)  # the method content frames belong to (class id, method id)


def reply_text(reply_code: int, explanation: str) -> str:
    """"NAME - explanation", cut to 255 bytes as RabbitMQ does (short_text)."""
    return short_text(f"{REPLY_NAMES[reply_code]} - {explanation}")


def short_text(text: str) -> str:
    """text cut to a short string's 255 bytes as RabbitMQ cuts a reply text (252 bytes and "...")."""
    encoded = text.encode()
    if len(encoded) <= 255:
        return text
    return encoded[:252].decode(errors="ignore") + "..."


class AMQPError(Exception):
    """An AMQP error: raised by the protocol decoders and by the broker's handlers alike."""

    def __init__(self, reply_code: int, explanation: str | None, class_id: int | None = None,
                 method_id: int | None = None, send_close: bool = True):
        text = REPLY_NAMES[reply_code] if explanation is None else reply_text(reply_code, explanation)
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text  # the reply text as sent: "NAME - explanation" (the bare name when explanation is None)
        self.class_id = class_id  # the method that failed; None: the frame being handled names it
        self.method_id = method_id
        self.send_close = send_close  # False where RabbitMQ drops the socket without a connection.close
        self.frames: list = []  # complete frames that preceded a malformed one in the same read, in order

    @property
    def reply_text(self) -> str:
        return self.text


class Close(NamedTuple):
    """How an error ends things: channel.close, or connection.close (or a dropped socket)."""
    connection: bool  # True: the connection goes; False: only the channel
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int
    send_close: bool  # False: drop the socket without connection.close


def made_elsewhere(reply_code: int, text: str, class_id: int, method_id: int) -> AMQPError:
    """An error another process of the broker refused a method with: its reply text as made there."""
    error = AMQPError(reply_code, None, class_id, method_id)
    error.text = text
    return error


def close_for(error: AMQPError, on_channel: bool, frame_type: int = 0, payload: bytes = b"") -> Close:
    """The close an error calls for (rabbit_binary_generator:map_exception): a hard error, or one outside an open
    channel, closes the connection; a soft one closes its channel. The failed method is the error's own, else the
    frame's: a method frame names itself, a content frame on a channel names basic.publish."""
    class_id, method_id = error.class_id, error.method_id
    if class_id is None:
        if frame_type == FRAME_METHOD and len(payload) >= 4:
            class_id, method_id = _CLASS_METHOD.unpack_from(payload)
        elif frame_type == FRAME_METHOD or (on_channel and frame_type):
            class_id, method_id = _BASIC_PUBLISH
        else:
            class_id, method_id = 0, 0
    hard = not on_channel or error.reply_code in HARD_ERRORS
    return Close(hard, error.reply_code, error.text, class_id, method_id or 0, error.send_close)


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
