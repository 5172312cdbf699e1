"""protocol.assembler: basic.publish content assembled from its header and body frames, with RabbitMQ's errors
(texts read from rabbit_command_assembler and checked against a 3.10 node by the integration tests)."""

import struct

import pytest

from protocol.assembler import Content, content_body, content_header, out_of_order
from protocol.errors import AMQPError


def header(body_size: int, class_id: int = 60) -> bytes:
    return struct.pack(">HHQH", class_id, 0, body_size, 0)


def started() -> Content:
    return Content("amq.direct", "key", False)


def error_of(call, *args) -> tuple:
    with pytest.raises(AMQPError) as caught:
        call(*args)
    error = caught.value
    return error.reply_code, error.reply_text, error.class_id, error.method_id


def test_a_body_in_one_frame_is_that_frame_itself():
    content = started()
    assert content_header(content, header(5), 1000) == 5
    payload = b"hello"
    assert content_body(content, payload) is payload
    assert content.header == header(5)


def test_a_body_in_parts_is_joined_once_complete():
    content = started()
    content_header(content, header(6), 1000)
    assert content_body(content, b"abc") is None
    assert content_body(content, b"de") is None
    assert (content.received, content.parts) == (5, [b"abc", b"de"])
    assert content_body(content, b"f") == b"abcdef"


def test_an_empty_body_is_announced_by_the_header_alone():
    assert content_header(started(), header(0), 1000) == 0


def test_a_body_larger_than_announced_is_a_frame_error():
    content = started()
    content_header(content, header(3), 1000)
    assert error_of(content_body, content, b"abcd") == (
        501, "FRAME_ERROR - type 3, all octets = <<>>: {content_too_large,4,3}", None, None)


def test_a_message_over_the_max_size_is_refused_at_its_header():
    assert error_of(content_header, started(), header(2001), 2000) == (
        406, "PRECONDITION_FAILED - message size 2001 is larger than configured max size 2000", None, None)


def test_a_header_of_another_class_is_unexpected():
    assert error_of(content_header, started(), header(1, class_id=50), 1000) == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead", 60, 40)


def test_frames_out_of_order_get_rabbitmqs_texts():
    error = out_of_order(None)  # a content frame with no publish before it
    assert (error.reply_code, error.reply_text, error.class_id, error.method_id) == (
        505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)
    assert error_of(content_body, started(), b"x") == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead", 60, 40)
    content = started()
    content_header(content, header(1), 1000)
    assert error_of(content_header, content, header(1), 1000)[1] == (
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead")
    assert out_of_order(content).reply_code == 505


def test_a_header_cut_short_is_an_unknown_frame():
    assert error_of(content_header, started(), b"\x00\x3c\x00\x00", 1000)[:2] == (
        501, "FRAME_ERROR - type 2, all octets = <<0,60,0,0>>: unknown_frame")
