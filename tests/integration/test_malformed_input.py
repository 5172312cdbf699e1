"""Malformed input never crashes the broker: every sequence of bad frames ends in a protocol error, a closed
socket, or a working connection; no handler fails with an exception, and the broker keeps serving others.

Warren only: RabbitMQ 3.10 itself answers some of these inputs (a channel method on channel 0, properties that do not
parse) with 541 INTERNAL_ERROR from a crashed channel process, which is what this test rules out for Warren."""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, header
from pamqp import frame as pamqp_frame
from pamqp.exceptions import UnmarshalingException

from tests.integration.rawclient import PeerClosed, RawClient, raw_frame

SYNC_CHANNEL = 99  # opened after the fuzzed frames: its open-ok proves the connection still works

VALID_METHODS = [
    commands.Channel.Open(), commands.Channel.Close(200, "bye", 0, 0), commands.Channel.Flow(active=True),
    commands.Exchange.Declare(exchange="fuzz-x", exchange_type="topic", arguments={"alternate-exchange": "y"}),
    commands.Exchange.Bind(destination="fuzz-x", source="amq.topic", routing_key="#"),
    commands.Queue.Declare(queue="fuzz-q", auto_delete=True, arguments={"x-max-length": 5}),
    commands.Queue.Bind(queue="fuzz-q", exchange="amq.direct", routing_key="k"),
    commands.Queue.Purge(queue="fuzz-q"), commands.Queue.Delete(queue="fuzz-q"),
    commands.Basic.Qos(prefetch_count=3), commands.Basic.Consume(queue="fuzz-q"),
    commands.Basic.Publish(exchange="", routing_key="fuzz-q", mandatory=True),
    commands.Basic.Get(queue="fuzz-q"), commands.Basic.Ack(delivery_tag=1, multiple=True),
    commands.Basic.Nack(delivery_tag=2), commands.Basic.Reject(delivery_tag=1),
    commands.Confirm.Select(), commands.Tx.Select(), commands.Tx.Commit(),
]
METHOD_PAYLOADS = [pamqp_frame.marshal(method, 1)[7:-1] for method in VALID_METHODS]
HEADER_PAYLOAD = pamqp_frame.marshal(header.ContentHeader(body_size=5, properties=commands.Basic.Properties(
    content_type="text/plain", headers={"CC": ["fuzz-q"], "n": 1}, delivery_mode=2, expiration="100")), 1)[7:-1]


@st.composite
def mutated(draw, payloads):
    """A valid payload with a few bytes changed, cut short, or extended."""
    payload = bytearray(draw(st.sampled_from(payloads)))
    for _ in range(draw(st.integers(0, 3))):
        if payload:
            payload[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(payload)))
    return bytes(payload[:cut]) if draw(st.booleans()) else bytes(payload) + draw(st.binary(max_size=8))


channels = st.sampled_from([1, 1, 1, 0, 2])  # mostly the open channel 1, where the handlers run
frames = st.one_of(
    st.tuples(st.just(1), channels, st.sampled_from(METHOD_PAYLOADS)),
    st.tuples(st.just(1), channels, mutated(METHOD_PAYLOADS)),
    st.tuples(st.just(2), channels, st.one_of(st.just(HEADER_PAYLOAD), mutated([HEADER_PAYLOAD]))),
    st.tuples(st.just(3), channels, st.binary(max_size=16)),
    st.tuples(st.sampled_from([0, 4, 8, 9, 255]), channels, st.binary(max_size=8)),
)


@pytest.fixture(scope="module")
def warren(broker):
    if broker.external:
        pytest.skip("reads the broker's own log")
    return broker


def outcome(client: RawClient) -> str:
    """Read until the sync channel opens ('alive'), the broker closes the connection ('closed <code>') or the
    socket ('dropped')."""
    try:
        while True:
            channel, value = client.read_frame(timeout=10)
            if isinstance(value, commands.Connection.Close):
                return f"closed {value.reply_code} {value.reply_text}"
            if isinstance(value, commands.Channel.OpenOk) and channel == SYNC_CHANNEL:
                return "alive"
    except PeerClosed:
        return "dropped"
    except UnmarshalingException:
        return "closed with a frame pamqp cannot read"  # RabbitMQ quotes raw bytes in some reply texts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=st.one_of(
    st.lists(frames, min_size=1, max_size=6),
    # well-formed methods first, so that the handlers themselves run on odd arguments and orders, then anything
    st.builds(lambda valid, last: valid + [last],
              st.lists(st.tuples(st.just(1), st.just(1), st.sampled_from(METHOD_PAYLOADS)), max_size=6), frames),
))
def test_bad_frames_end_in_a_protocol_error_never_a_crash(warren, sequence):
    with RawClient.connect(warren) as client:
        client.handshake()
        client.open_channel(1)
        client.send_raw(b"".join(raw_frame(kind, channel, payload) for kind, channel, payload in sequence))
        client.send(SYNC_CHANNEL, commands.Channel.Open())
        result = outcome(client)
    assert "Traceback" not in warren.log(), (result, sequence)
    with RawClient.connect(warren) as probe:  # the broker still serves new clients
        probe.handshake()
        probe.close_connection()


def test_a_frame_type_the_protocol_does_not_have_is_501(broker):
    with RawClient.connect(broker) as client:
        client.handshake()
        client.send_raw(raw_frame(9, 0, b"x"))
        close = client.expect_connection_close()
        assert close.reply_code == 501


def test_a_truncated_method_is_a_frame_error(broker):
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send_raw(raw_frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00"))  # queue.declare cut short
        close = client.expect_connection_close()
        assert close.reply_code in (501, 502)
