"""Fuzzing the decoding layers: random and mutated frames, method payloads and field tables.

In process, FrameReader.feed, decode_method, decode_properties and the fast-path decoders only ever raise
AMQPError, whatever the bytes (a few seconds in the default suite; 100,000 frames in a slow-marked run). Against a
real broker, every connection fed such frames gets an answer (a protocol error, a close or an EOF) within a bound,
nothing is logged as a traceback, and a well-behaved pika client is served at the end. Garbage after the handshake
in general is tests/integration/test_malformed_input.py's subject; this module adds hostile field tables
(deep, wide, damaged) inside the methods and content headers that carry them.
"""

from __future__ import annotations

import random
import struct
import time

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame, header

from protocol import fastpath
from protocol.codec import decode_method, decode_properties
from protocol.constants import FRAME_HEADER, FRAME_METHOD
from protocol.errors import AMQPError
from protocol.framing import FrameReader
from protocol.properties import scan_properties
from tests.integration.rawclient import PeerClosed, RawClient, raw_frame

SYNC_CHANNEL = 99  # opened after the fuzzed frames: its open-ok proves the connection still works
ANSWER_SECONDS = 10.0  # every connection is answered (open-ok, close or EOF) within this bound
SLOW_FRAMES = 100_000
SLOW_FRAMES_SECONDS = 60.0

TABLE_METHODS = [
    commands.Queue.Declare(queue="fuzz-q", auto_delete=True, arguments={"x-max-length": 5, "x-args": [1, "a"]}),
    commands.Exchange.Declare(exchange="fuzz-x", exchange_type="headers", auto_delete=True,
                              arguments={"alternate-exchange": "y", "nested": {"a": {"b": [True, None]}}}),
    commands.Queue.Bind(queue="fuzz-q", exchange="amq.headers", arguments={"x-match": "any", "k": "v"}),
    commands.Basic.Consume(queue="fuzz-q", consumer_tag="fuzz-c", arguments={"x-priority": 3}),
    commands.Basic.Publish(exchange="amq.headers", routing_key="k"),
    commands.Basic.Ack(delivery_tag=1), commands.Basic.Nack(delivery_tag=1, multiple=True),
    commands.Basic.Reject(delivery_tag=1), commands.Channel.Flow(active=True),
]
METHOD_PAYLOADS = [frame.marshal(method, 1)[7:-1] for method in TABLE_METHODS]
HEADER_PAYLOADS = [
    frame.marshal(header.ContentHeader(body_size=1, properties=properties), 1)[7:-1]
    for properties in (
        commands.Basic.Properties(headers={"CC": ["fuzz-q"], "k": "v", "x-death": [{"count": 1, "rk": ["a"]}]},
                                  delivery_mode=2, expiration="100", content_type="text/plain"),
        commands.Basic.Properties(headers={"BCC": "fuzz-q"}, priority=3, message_id="m", app_id="a"),
    )
]


def sized(kind: bytes, content: bytes) -> bytes:
    return kind + struct.pack(">I", len(content)) + content


def table_bytes(entries: list[bytes]) -> bytes:
    content = b"".join(entries)
    return struct.pack(">I", len(content)) + content


def nested(depth: int, kind: bytes) -> bytes:
    inner = b"V"
    for _ in range(depth):
        inner = sized(b"A", inner) if kind == b"A" else sized(b"F", b"\x01k" + inner)
    return inner


# Field-table entries (key + typed value) that a hostile client might send: deep, wide, odd types, cut short.
hostile_values = st.one_of(
    st.sampled_from([b"V", b"\x00", b"t\x01", b"bx", b"s\x00\x01", b"I\xff\xff\xff\xff", b"l" + bytes(8),
                     b"T" + b"\xff" * 8, b"D\x02\x00\x00\x01\x00", b"d" + bytes(8), b"Z", b"", b"S\xff\xff\xff\xff"]),
    st.binary(max_size=8).map(lambda raw: sized(b"S", raw)),
    st.builds(nested, st.one_of(st.integers(1, 120), st.integers(500, 3000)), st.sampled_from([b"A", b"F"])),
    st.builds(lambda count, unit: sized(b"A", unit * count), st.integers(0, 3000), st.sampled_from([b"V", b"t\x00"])),
)
hostile_entries = st.lists(st.builds(lambda key, value: bytes((len(key),)) + key + value,
                                     st.binary(max_size=4), hostile_values), max_size=4)


@st.composite
def method_with_table(draw) -> bytes:
    """queue.declare, exchange.declare or basic.consume with a hostile arguments table."""
    arguments = table_bytes(draw(hostile_entries))
    kind = draw(st.sampled_from(["queue", "exchange", "consume"]))
    if kind == "queue":
        return struct.pack(">HHH", 50, 10, 0) + b"\x06fuzz-q" + b"\x08" + arguments
    if kind == "exchange":
        return struct.pack(">HHH", 40, 10, 0) + b"\x06fuzz-x\x07headers" + b"\x04" + arguments
    return struct.pack(">HHH", 60, 20, 0) + b"\x06fuzz-q\x06fuzz-c" + b"\x00" + arguments


@st.composite
def header_with_table(draw) -> bytes:
    """A content header whose headers property is a hostile table, maybe followed by other properties."""
    flags = 1 << 13
    lead = tail = b""  # content_type comes before the headers on the wire, delivery_mode after them
    extra = draw(st.sampled_from(["none", "content_type", "delivery_mode"]))
    if extra == "content_type":
        flags |= 1 << 15
        lead = b"\x0atext/plain"
    elif extra == "delivery_mode":
        flags |= 1 << 12
        tail = b"\x02"
    return struct.pack(">HHQH", 60, 0, 1, flags) + lead + table_bytes(draw(hostile_entries)) + tail


@st.composite
def mutated(draw, payloads: list[bytes]) -> bytes:
    """A valid payload with a few bytes changed, cut short, or extended."""
    payload = bytearray(draw(st.sampled_from(payloads)))
    for _ in range(draw(st.integers(0, 3))):
        if payload:
            payload[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(payload)))
    return bytes(payload[:cut]) if draw(st.booleans()) else bytes(payload) + draw(st.binary(max_size=8))


method_payloads = st.one_of(st.sampled_from(METHOD_PAYLOADS), mutated(METHOD_PAYLOADS), method_with_table(),
                            method_with_table().flatmap(lambda payload: mutated([payload])))
header_payloads = st.one_of(st.sampled_from(HEADER_PAYLOADS), mutated(HEADER_PAYLOADS), header_with_table())
frames = st.one_of(
    st.tuples(st.just(1), method_payloads),
    st.tuples(st.just(2), header_payloads),
    st.tuples(st.just(3), st.binary(max_size=16)),
    st.tuples(st.sampled_from([0, 4, 8, 9, 255]), st.binary(max_size=8)),
)


def decode_frame(frame_type: int, payload: bytes) -> None:
    """Everything the broker decodes from one frame, as it would; raises AMQPError only."""
    if frame_type == FRAME_METHOD:
        if payload[:4] == b"\x00\x3c\x00\x28":
            fastpath.decode_publish(payload)
        elif payload[:4] == b"\x00\x3c\x00\x50":
            fastpath.decode_ack(payload)
        decode_method(payload)
    elif frame_type == FRAME_HEADER:
        fastpath.decode_content_header(payload)
        scan_properties(payload)
        decode_properties(payload)


def feed_and_decode(stream: bytes, chunk: int) -> None:
    """Feed the stream in chunks; decode every frame read; stop at the first AMQPError, as a connection does."""
    reader = FrameReader()
    try:
        for start in range(0, len(stream), chunk):
            for frame_type, _, payload in reader.feed(stream[start : start + chunk]):
                decode_frame(frame_type, bytes(payload))
    except AMQPError:
        pass


@settings(max_examples=400, deadline=None)
@given(sequence=st.lists(frames, min_size=1, max_size=5), garbage=st.binary(max_size=12), chunk=st.integers(1, 4096))
def test_decoding_raises_only_frame_error(sequence, garbage, chunk):
    stream = b"".join(raw_frame(kind, 1, payload) for kind, payload in sequence) + garbage
    feed_and_decode(stream, chunk)  # any other exception fails the test


def random_frame(rng: random.Random, complete: bool = False) -> bytes:
    """A valid, mutated or hostile-table frame, or random bytes (framed when complete: a broker waits for the
    rest of a frame that random bytes only begin, as RabbitMQ does)."""
    roll = rng.random()
    if roll < 0.3:
        payload = bytearray(rng.choice(METHOD_PAYLOADS + HEADER_PAYLOADS))
        for _ in range(rng.randint(1, 3)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        payload = payload[: rng.randint(0, len(payload))] if rng.random() < 0.3 else payload
        kind = 1 if bytes(payload[:2]) != b"\x00\x3c" or rng.random() < 0.5 else 2
        return raw_frame(kind, 1, bytes(payload))
    if roll < 0.6:
        value = nested(rng.randint(1, 3000), rng.choice([b"A", b"F"])) if rng.random() < 0.5 else sized(
            b"A", rng.choice([b"V", b"t\x01", b"S\x00\x00\x00\x00"]) * rng.randint(0, 500))
        entries = table_bytes([b"\x01k" + value])
        if rng.random() < 0.5:
            return raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00" + entries)
        return raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 1, 1 << 13) + entries)
    garbage = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
    return raw_frame(rng.choice([0, 1, 2, 3, 8, 9]), 1, garbage) if complete else garbage


@pytest.mark.slow
def test_a_hundred_thousand_frames_raise_only_frame_error():
    rng = random.Random(7)
    started = time.monotonic()
    done = 0
    while done < SLOW_FRAMES:
        batch = [random_frame(rng) for _ in range(100)]
        for one in batch:  # each frame alone, as the first frame of a connection
            feed_and_decode(one, len(one))
        feed_and_decode(b"".join(batch), rng.randint(1, 8192))  # and all in one stream
        done += len(batch)
        assert time.monotonic() - started < SLOW_FRAMES_SECONDS, f"only {done} frames in {SLOW_FRAMES_SECONDS} s"


def outcome(client: RawClient) -> str:
    """Read until the sync channel opens ('alive'), the broker closes the connection ('closed') or the socket
    ('dropped'); a broker that stays silent past ANSWER_SECONDS fails the test."""
    deadline = time.monotonic() + ANSWER_SECONDS
    try:
        while True:
            channel, value = client.read_frame(timeout=deadline - time.monotonic())
            if isinstance(value, commands.Connection.Close):
                return "closed"
            if isinstance(value, commands.Channel.OpenOk) and channel == SYNC_CHANNEL:
                return "alive"
    except PeerClosed:
        return "dropped"
    except TimeoutError:
        raise AssertionError(f"no answer within {ANSWER_SECONDS} s") from None
    except ValueError:
        return "closed"  # a reply text quoting raw bytes that pamqp cannot read back


@pytest.fixture
def fuzzed_broker(own_broker):
    return own_broker()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=st.lists(frames, min_size=1, max_size=4))
def test_a_broker_fed_hostile_tables_answers_and_logs_no_traceback(fuzzed_broker, sequence):
    with RawClient.connect(fuzzed_broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send_raw(b"".join(raw_frame(kind, 1, payload) for kind, payload in sequence))
        client.send(SYNC_CHANNEL, commands.Channel.Open())
        outcome(client)
    assert "Traceback" not in fuzzed_broker.log(), sequence


def test_well_behaved_client_is_served_after_the_fuzzing(own_broker):
    broker = own_broker()
    rng = random.Random(11)
    for _ in range(50):
        with RawClient.connect(broker) as client:
            client.handshake()
            client.open_channel(1)
            client.send_raw(b"".join(random_frame(rng, complete=True) for _ in range(rng.randint(1, 4))))
            client.send(SYNC_CHANNEL, commands.Channel.Open())
            outcome(client)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"still here", pika.BasicProperties(headers={"a": [1, {"b": None}]}))
        deadline = time.monotonic() + ANSWER_SECONDS
        method = None
        while method is None and time.monotonic() < deadline:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"still here" and properties.headers == {"a": [1, {"b": None}]}
    finally:
        connection.close()
    assert "Traceback" not in broker.log()
