"""protocol.errors.close_for: how an error closes things, as RabbitMQ's rabbit_binary_generator:map_exception."""

import struct

from protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from protocol.errors import AMQPError, close_for, not_found, precondition_failed, reply_text


def method(class_id: int, method_id: int) -> bytes:
    return struct.pack(">HH", class_id, method_id) + b"\x00\x00"


def test_a_soft_error_on_a_channel_closes_the_channel_and_names_the_method_frame():
    close = close_for(not_found("no queue 'q' in vhost '/'"), True, FRAME_METHOD, method(50, 10))
    assert close == (False, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10, True)


def test_a_content_frame_error_names_basic_publish():
    for frame_type in (FRAME_HEADER, FRAME_BODY):
        close = close_for(precondition_failed("too big"), True, frame_type, b"\x00\x3c")
        assert (close.connection, close.class_id, close.method_id) == (False, 60, 40)


def test_a_hard_error_on_a_channel_closes_the_connection():
    close = close_for(AMQPError(504, "second 'channel.open' seen"), True, FRAME_METHOD, method(20, 10))
    assert close == (True, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10, True)


def test_any_error_outside_an_open_channel_closes_the_connection():
    close = close_for(not_found("no such thing"), False, FRAME_METHOD, method(10, 40))
    assert (close.connection, close.class_id, close.method_id) == (True, 10, 40)
    assert close_for(not_found("no such thing"), False, FRAME_HEADER, b"").class_id == 0


def test_the_method_an_error_names_wins_and_send_close_is_kept():
    error = AMQPError(540, "unknown method id {60,99}", 60, 99, send_close=False)
    assert close_for(error, True, FRAME_METHOD, method(50, 10)) == (
        True, 540, "NOT_IMPLEMENTED - unknown method id {60,99}", 60, 99, False)


def test_an_error_without_a_frame_names_no_method():
    close = close_for(AMQPError(541, "persistent messages could not be written to disk"), True)
    assert (close.connection, close.class_id, close.method_id) == (True, 0, 0)


def test_reply_texts_are_cut_as_rabbitmq_cuts_them_and_may_be_the_bare_name():
    assert len(reply_text(404, "x" * 300).encode()) == 255
    assert AMQPError(541, None).reply_text == "INTERNAL_ERROR"
