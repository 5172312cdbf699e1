"""Hostile field tables sent to a real broker: tables nested thousands of levels deep, and 130 KB tables of tiny
values. Decoding is linear and depth-limited: a deep table is a protocol error (never a RecursionError and its
traceback), and a frame of many empty values costs milliseconds, not the 0.3-1.1 s pamqp's decoder took."""

from __future__ import annotations

import struct
import time

import pytest
from pamqp import commands

from tests.integration.rawclient import PeerClosed, RawClient, raw_frame

pytestmark = pytest.mark.alone  # it times how long hostile frames take to decode

QUEUE_DECLARE = struct.pack(">HH", 50, 10)
BASIC_PUBLISH = struct.pack(">HH", 60, 40)
WIDE_FRAMES = 30  # frames of 130 KB tables; pamqp needed 0.3-0.5 s for each on this machine
WIDE_FRAMES_SECONDS = 5.0  # generous for a shared machine: decoding them all now takes well under 1 s


def nested_table(depth: int) -> bytes:
    """A field table holding a table holding a table... `depth` tables in all."""
    content = b""
    for _ in range(depth - 1):
        content = b"\x01kF" + struct.pack(">I", len(content)) + content
    return struct.pack(">I", len(content)) + content


def array_of_voids(size: int) -> bytes:
    """A table {"": [None] * n} of about `size` bytes: one byte per value."""
    values = b"V" * (size - 10)
    content = b"\x00A" + struct.pack(">I", len(values)) + values
    return struct.pack(">I", len(content)) + content


def queue_declare(queue: bytes, arguments: bytes, flags: int = 0) -> bytes:
    return QUEUE_DECLARE + b"\x00\x00" + bytes((len(queue),)) + queue + bytes((flags,)) + arguments


def assert_serves_new_clients(broker) -> None:
    with RawClient.connect(broker) as probe:
        probe.handshake()
        probe.open_channel(1)
        probe.close_connection()


def test_deeply_nested_queue_arguments_close_with_a_frame_error(own_broker):
    # RabbitMQ 3.10 declares such a queue (its parser has no depth limit); Warren refuses past 100 levels.
    broker = own_broker()
    for depth in (1_000, 18_000):  # 18,000 levels fill a 126 KB frame
        with RawClient.connect(broker) as client:
            client.handshake()
            client.open_channel(1)
            client.send_raw(raw_frame(1, 1, queue_declare(b"deep", nested_table(depth))))
            close = client.expect_connection_close()
        assert close.reply_code == 501 and close.reply_text.startswith("FRAME_ERROR - cannot decode <<")
        assert (close.class_id, close.method_id) == (50, 10)
    log = broker.log()
    assert "Traceback" not in log and "RecursionError" not in log
    assert_serves_new_clients(broker)


def test_deeply_nested_headers_close_with_internal_error(own_broker):
    broker = own_broker()
    header = struct.pack(">HHQH", 60, 0, 1, 1 << 13) + nested_table(5_000)
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        publish = BASIC_PUBLISH + b"\x00\x00" + b"\x0bamq.headers" + b"\x01k\x00"  # exchange, routing key, flags
        client.send_raw(raw_frame(1, 1, publish) + raw_frame(2, 1, header) + raw_frame(3, 1, b"x"))
        close = client.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (541, "INTERNAL_ERROR")
    log = broker.log()
    assert "Traceback" not in log and "RecursionError" not in log
    assert_serves_new_clients(broker)


def test_frames_of_many_empty_values_are_decoded_in_milliseconds(broker, unique):
    arguments = array_of_voids(130_000)
    declare = raw_frame(1, 1, queue_declare(unique.encode()[:200], arguments, flags=0b1000))  # auto-delete
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        started = time.monotonic()
        for _ in range(WIDE_FRAMES):
            client.send_raw(declare)
            try:
                channel, answer = client.read_frame(timeout=WIDE_FRAMES_SECONDS)
            except PeerClosed:
                raise AssertionError("the broker dropped the connection") from None
            assert isinstance(answer, commands.Queue.DeclareOk), answer  # unknown arguments are ignored
        elapsed = time.monotonic() - started
    assert elapsed < WIDE_FRAMES_SECONDS, f"{WIDE_FRAMES} frames took {elapsed:.2f} s"
