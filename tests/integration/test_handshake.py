"""Connection opening as a client sees it on the wire: protocol header, start, auth, tune, open, heartbeats, and the
connection-level errors a broker raises on malformed traffic. Expected values are RabbitMQ's."""

from __future__ import annotations

import time

import pika
import pytest
from pamqp import body, commands, header

from tests.integration.rawclient import (
    AMQP_0_9_1_HEADER, PeerClosed, RawClient, amqplain_response, describe, method_frame_payload, plain_response,
    raw_frame,
)

FRAME_METHOD, FRAME_BODY, FRAME_HEARTBEAT = 1, 3, 8

# The capabilities the issue asks Warren to advertise; RabbitMQ advertises them all (and a few more).
REQUIRED_CAPABILITIES = [
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
    "connection.blocked", "authentication_failure_close", "per_consumer_qos",
]


@pytest.fixture
def client(broker):
    with RawClient.connect(broker) as raw:
        yield raw


def assert_refused(client: RawClient) -> None:
    """The broker ends the connection: either it closes the socket at once, or it sends connection.close first."""
    try:
        channel, value = client.read_frame()
    except PeerClosed:
        return
    assert isinstance(value, commands.Connection.Close), f"expected the connection to end, got {describe(value)}"
    client.send(0, commands.Connection.CloseOk())
    client.expect_closed()


def expect_frame_too_large(client: RawClient, size: int, limit: int) -> None:
    """501 for an oversized frame (the rest of that frame is still in flight, so the socket's end is not awaited)."""
    close = client.expect_connection_close()
    assert (close.reply_code, close.class_id, close.method_id) == (501, 0, 0)
    assert close.reply_text == f"FRAME_ERROR - type 3, all octets = <<>>: {{frame_too_large,{size},{limit}}}"


# ---- protocol header


@pytest.mark.parametrize("header", [
    b"HTTP/1.1",  # not AMQP at all
    b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
    b"AMQP\x00\x00\x09\x00",  # 0-9-0
    b"AMQP\x00\x00\x08\x00",  # 0-8
], ids=["http", "amqp-1.0", "amqp-0-9-0", "amqp-0-8"])
def test_unsupported_protocol_header_gets_0_9_1_header_back_and_close(client, header):
    client.send_protocol_header(header)
    assert client.recv_raw(8) == AMQP_0_9_1_HEADER
    client.expect_closed()


# ---- connection.start


def test_connection_start_announces_version_properties_mechanisms_and_locales(client):
    client.send_protocol_header()
    start = client.expect(commands.Connection.Start, channel=0)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
    assert start.locales == "en_US"
    properties = start.server_properties
    for key in ("product", "version", "platform", "copyright", "information"):
        assert isinstance(properties.get(key), str) and properties[key], key
    capabilities = properties["capabilities"]
    assert {name: capabilities.get(name) for name in REQUIRED_CAPABILITIES} == dict.fromkeys(REQUIRED_CAPABILITIES, True)


# ---- authentication


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_guest_logs_in_with_each_mechanism(client, mechanism):
    client.handshake(mechanism=mechanism)
    client.open_channel(1)
    client.close_connection()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_bad_password_is_refused_with_403_when_client_supports_authentication_failure_close(client, mechanism):
    client.send_protocol_header()
    client.expect(commands.Connection.Start)
    response = (plain_response if mechanism == "PLAIN" else amqplain_response)("guest", "wrong")
    client.send(0, commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism=mechanism, response=response))
    close = client.expect(commands.Connection.Close, channel=0)
    assert close.reply_code == 403
    assert close.reply_text == (f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. "
                                "For details see the broker logfile.")


def test_unknown_user_is_refused_like_a_bad_password(broker):
    params = pika.URLParameters(f"amqp://nobody:guest@{broker.host}:{broker.port}/%2F")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as error:
        pika.BlockingConnection(params)
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. " \
           "For details see the broker logfile.'" in str(error.value)


def test_unknown_vhost_is_refused_with_530(client):
    client.handshake(open_connection=False)
    client.send(0, commands.Connection.Open(virtual_host="no-such-vhost"))
    client.expect_connection_error(530, "NOT_ALLOWED - vhost no-such-vhost not found", 10, 40)


def test_pika_sees_unknown_vhost_as_access_denied(broker):
    params = pika.URLParameters(f"amqp://guest:guest@{broker.host}:{broker.port}/no-such-vhost")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as error:
        pika.BlockingConnection(params)
    assert "(530) 'NOT_ALLOWED - vhost no-such-vhost not found'" in str(error.value)


# ---- tune


def test_capabilities_that_are_not_a_table_count_as_none(broker, unique):
    """A client whose client_properties name something other than a table "capabilities" still works, as one with
    no capabilities: its consumer is not told when its queue goes, and the connection stays open."""
    parameters = pika.URLParameters(broker.url)
    parameters.client_properties = {"capabilities": "none of them"}
    with pika.BlockingConnection(parameters) as conn:
        ch = conn.channel()
        queue = ch.queue_declare(f"{unique}-q").method.queue
        cancelled = []
        ch.add_on_cancel_callback(cancelled.append)
        ch.basic_consume(queue, lambda *_: None)
        other = conn.channel()
        other.queue_delete(queue)  # the server would send basic.cancel to a client that can take it
        ch.queue_declare(f"{unique}-after")  # the connection and the channel are still there
        assert cancelled == []
        assert conn.is_open


def test_tune_offers_rabbitmq_defaults(client):
    agreed = client.handshake()
    assert (agreed.tune.frame_max, agreed.tune.channel_max, agreed.tune.heartbeat) == (131072, 2047, 60)


def test_pika_negotiates_the_lower_of_both_offers(broker):
    params = pika.URLParameters(f"{broker.url}?heartbeat=7&channel_max=100&frame_max=8192")
    connection = pika.BlockingConnection(params)
    try:
        impl = connection._impl
        assert (impl.params.heartbeat, impl.params.channel_max, impl.params.frame_max) == (7, 100, 8192)
        assert connection.channel().is_open
    finally:
        connection.close()


def test_lower_frame_max_splits_deliveries_and_bounds_incoming_frames(client, unique):
    client.handshake(frame_max=4096)
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
    client.expect(commands.Queue.DeclareOk, channel=1)
    payload = bytes(range(256)) * 40  # 10240 bytes: three body frames of at most 4088 bytes
    client.publish(1, "", unique, payload, frame_max=4096)
    client.send(1, commands.Basic.Get(queue=unique, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)
    client.expect(header.ContentHeader, channel=1)
    sizes, received = [], b""
    while len(received) < len(payload):
        chunk = client.expect(body.ContentBody, channel=1).value
        sizes.append(len(chunk))
        received += chunk
    assert received == payload
    assert sizes == [4088, 4088, 2064]
    client.publish(1, "", unique, b"x" * 4097, frame_max=8192)  # one body frame with a 4097-byte payload
    expect_frame_too_large(client, 4097, 4088)


def start_ok(client: RawClient, mechanism: str = "PLAIN", response: str = plain_response("guest", "guest"),
             client_properties: dict | None = None) -> None:
    client.send_protocol_header()
    client.expect(commands.Connection.Start)
    client.send(0, commands.Connection.StartOk(client_properties=client_properties or {}, mechanism=mechanism,
                                               response=response))


def tune_ok(client: RawClient, frame_max: int, channel_max: int) -> None:
    client.handshake(frame_max=frame_max, channel_max=channel_max, open_connection=False)
    client.send(0, commands.Connection.Open(virtual_host="/"))


HANDSHAKE_FAILURES = {  # each ends the connection without a usable session (RabbitMQ closes after a 3 s delay)
    "unknown-mechanism": lambda client: start_ok(client, mechanism="EXTERNAL", response=""),
    # without authentication_failure_close the client learns of a bad password only by the socket closing
    "bad-password-without-capability": lambda client: start_ok(client, response=plain_response("guest", "wrong")),
    "frame-max-above-offer": lambda client: tune_ok(client, 131072 * 2, 2047),
    "frame-max-below-4096": lambda client: tune_ok(client, 1024, 2047),
    "channel-max-above-offer": lambda client: tune_ok(client, 131072, 4000),
    "channel-max-unlimited": lambda client: tune_ok(client, 131072, 0),  # 0 means no limit: above the offer too
}


def test_handshake_failures_end_the_connection(broker):
    clients = {name: RawClient.connect(broker) for name in HANDSHAKE_FAILURES}
    try:
        for name, fail in HANDSHAKE_FAILURES.items():  # all at once, so that the brokers' delays overlap
            fail(clients[name])
        for name, client in clients.items():
            try:
                assert_refused(client)
            except AssertionError as error:
                raise AssertionError(f"{name}: {error}") from error
    finally:
        for client in clients.values():
            client.close()


# ---- heartbeats


def test_server_sends_heartbeats_at_the_negotiated_interval(client):
    client.handshake(heartbeat=1)  # the client's 1 s wins over the offered 60 s
    arrivals, started = [], time.monotonic()
    while time.monotonic() - started < 2.1:
        channel, value = client.read_frame(timeout=1.5, skip_heartbeats=False)
        assert (channel, describe(value)) == (0, "Heartbeat()")
        arrivals.append(time.monotonic())
        client.send_heartbeat()  # keep our side of the bargain
    gaps = [later - earlier for earlier, later in zip([started, *arrivals], arrivals)]
    assert len(arrivals) >= 2
    assert max(gaps) <= 1.25, gaps


def test_missed_client_heartbeats_close_the_socket(client):
    client.handshake(heartbeat=1)
    last_sent = time.monotonic()
    while True:  # stay silent; only heartbeats may arrive until the broker gives up on us
        try:
            channel, value = client.read_frame(timeout=5, skip_heartbeats=False)
        except PeerClosed:
            break
        assert (channel, describe(value)) == (0, "Heartbeat()")
    silent_for = time.monotonic() - last_sent
    assert 1.9 <= silent_for <= 4.0, silent_for


def test_client_heartbeats_keep_a_quiet_connection_open(client):
    client.handshake(heartbeat=1)
    client.open_channel(1)
    started = time.monotonic()
    while time.monotonic() - started < 2.6:  # longer than the two missed intervals that end a connection
        client.send_heartbeat()
        try:
            client.read_frame(timeout=0.4, skip_heartbeats=True)
            raise AssertionError("expected only heartbeats")
        except TimeoutError:
            pass
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, channel=1)


# ---- malformed traffic after the handshake


def test_frame_larger_than_frame_max_is_501_frame_error(client, unique):
    # RabbitMQ tolerates payloads up to frame_max itself (its FRAME_SIZE_FUDGE of 8 bytes for clients that forget
    # the frame overhead) but names frame_max - 8 as the limit in the error.
    client.handshake()
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
    client.expect(commands.Queue.DeclareOk, channel=1)
    client.publish(1, "", unique, b"x" * 131072, frame_max=262144)  # payload of exactly frame_max: accepted
    client.send(1, commands.Basic.Get(queue=unique, no_ack=True))
    assert client.expect(commands.Basic.GetOk, channel=1).message_count == 0
    assert client.expect(header.ContentHeader, channel=1).body_size == 131072
    client.publish(1, "", unique, b"x" * 131073, frame_max=262144)  # one byte more
    expect_frame_too_large(client, 131073, 131064)


def test_unknown_frame_type_is_501_frame_error(client):
    client.handshake()
    client.send_raw(raw_frame(9, 0, b"abc"))
    client.expect_connection_error(501, 'FRAME_ERROR - type 9, all octets = <<"abc">>: unknown_frame')


def test_bad_frame_end_marker_is_501_frame_error(client):
    client.handshake()
    frame = raw_frame(FRAME_METHOD, 0, method_frame_payload(commands.Connection.Open()))
    client.send_raw(frame[:-1] + b"\x00")
    close = client.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR - type 1, all octets = <<")
    assert close.reply_text.endswith(">>: {invalid_frame_end_marker,0}")


def test_channel_method_on_channel_zero_is_504(client):
    client.handshake()
    client.send(0, commands.Basic.Qos(prefetch_count=1))
    client.expect_connection_error(504, "CHANNEL_ERROR - unexpected method in connection state running", 60, 10)


def test_connection_method_on_a_channel_is_503(client):
    client.handshake()
    client.open_channel(1)
    client.send(1, commands.Connection.Open())
    client.expect_connection_error(503, "COMMAND_INVALID - unimplemented method", 10, 40)


def test_heartbeat_on_a_channel_other_than_zero_is_505(client):
    client.handshake()
    client.open_channel(1)
    client.send_raw(raw_frame(FRAME_HEARTBEAT, 1, b""))
    client.expect_connection_error(505, "UNEXPECTED_FRAME - type 8, all octets = <<>>")


def test_content_on_an_unopened_channel_is_505(client):
    client.handshake()
    client.send_raw(raw_frame(FRAME_BODY, 5, b"x"))
    client.expect_connection_error(505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead")
