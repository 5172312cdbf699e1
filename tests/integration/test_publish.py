"""basic.publish as a client observes it: mandatory returns, publishing errors, CC/BCC sender-selected distribution,
bodies split across frames, and properties that come back exactly as they were sent."""

from __future__ import annotations

import datetime
import decimal

import pika
import pytest
from pamqp import body, commands, header

from tests.integration.helpers import channel_error, declare_queue, get, get_all, wait_until
from tests.integration.rawclient import RawClient


@pytest.fixture
def client(broker):
    with RawClient.connect(broker) as raw:
        raw.handshake()
        raw.open_channel(1)
        yield raw


def raw_queue(client: RawClient, name: str) -> str:
    client.send(1, commands.Queue.Declare(queue=name, exclusive=True))
    return client.expect(commands.Queue.DeclareOk, channel=1).queue


# ---- mandatory


def test_unroutable_mandatory_message_is_returned_with_312_and_nothing_else(client, unique):
    properties = commands.Basic.Properties(message_id="m-1", headers={"attempt": 1})
    client.publish(1, "amq.direct", unique, b"nobody listens", properties=properties, mandatory=True)
    returned = client.expect(commands.Basic.Return, channel=1)
    assert (returned.reply_code, returned.reply_text, returned.exchange, returned.routing_key) == (
        312, "NO_ROUTE", "amq.direct", unique)
    content = client.expect(header.ContentHeader, channel=1)
    assert (content.body_size, content.properties.message_id, content.properties.headers) == (
        14, "m-1", {"attempt": 1})
    assert client.expect(body.ContentBody, channel=1).value == b"nobody listens"
    client.assert_silent(0.2)  # no channel error follows
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, channel=1)


def test_pika_sees_the_return_and_the_channel_stays_usable(channel, unique):
    returned = []
    channel.add_on_return_callback(lambda _channel, method, _properties, body: returned.append((method, body)))
    channel.basic_publish("", unique, b"to a queue that does not exist", mandatory=True)
    wait_until(channel.connection, lambda: returned)
    method, payload = returned[0]
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key, payload) == (
        312, "NO_ROUTE", "", unique, b"to a queue that does not exist")
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", queue, b"routable", mandatory=True)
    assert get_all(channel, queue) == [b"routable"]
    assert len(returned) == 1


def test_routable_mandatory_message_is_not_returned(client, unique):
    queue = raw_queue(client, unique)
    client.publish(1, "", queue, b"delivered", mandatory=True)
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)  # the first frame after the publish: no return before it


def test_message_routed_via_alternate_exchange_is_not_returned(client, unique):
    alternate = f"{unique}-ae"
    client.send(1, commands.Exchange.Declare(exchange=alternate, exchange_type="fanout", auto_delete=True))
    client.expect(commands.Exchange.DeclareOk, channel=1)
    client.send(1, commands.Exchange.Declare(exchange=unique, exchange_type="direct", auto_delete=True,
                                             arguments={"alternate-exchange": alternate}))
    client.expect(commands.Exchange.DeclareOk, channel=1)
    queue = raw_queue(client, "")
    client.send(1, commands.Queue.Bind(queue=queue, exchange=alternate))
    client.expect(commands.Queue.BindOk, channel=1)
    client.publish(1, unique, "no-binding", b"caught", mandatory=True)
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)


# ---- publishing errors


def test_publish_to_a_missing_exchange_closes_the_channel_with_404(client, unique):
    client.publish(1, unique, "key", b"lost")
    client.expect_channel_error(1, 404, f"NOT_FOUND - no exchange '{unique}' in vhost '/'", 60, 40)
    client.open_channel(1)


def test_publish_to_an_internal_exchange_closes_the_channel_with_403(client, unique):
    client.send(1, commands.Exchange.Declare(exchange=unique, exchange_type="fanout", internal=True,
                                             auto_delete=True))
    client.expect(commands.Exchange.DeclareOk, channel=1)
    client.publish(1, unique, "key", b"refused")
    client.expect_channel_error(1, 403, f"ACCESS_REFUSED - cannot publish to internal exchange '{unique}' in vhost '/'",
                                60, 40)


def test_immediate_flag_is_not_implemented(client, unique):
    # RabbitMQ dropped support for immediate in 3.0: any publish with it closes the connection.
    client.publish(1, "", unique, b"now or never", immediate=True)
    client.expect_connection_error(540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


def test_user_id_must_match_the_authenticated_user(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", queue, b"mine", pika.BasicProperties(user_id="guest"))
    assert get(channel, queue).properties.user_id == "guest"
    assert channel_error(lambda: (channel.basic_publish("", queue, b"forged", pika.BasicProperties(user_id="admin")),
                                  channel.basic_get(queue))) == (
        406, "PRECONDITION_FAILED - user_id property set to 'admin' but authenticated user was 'guest'")


# ---- CC and BCC


def test_cc_and_bcc_add_routing_keys_and_bcc_is_stripped(channel, unique):
    queues = {name: declare_queue(channel, f"{unique}-{name}", exclusive=True)
              for name in ("main", "cc", "bcc", "other")}
    for name, queue in queues.items():
        channel.queue_bind(queue, "amq.direct", f"{unique}.{name}")
    headers = {"CC": [f"{unique}.cc"], "BCC": [f"{unique}.bcc"], "kept": "yes"}
    channel.basic_publish("amq.direct", f"{unique}.main", b"memo", pika.BasicProperties(headers=headers))
    received = {name: get(channel, queue) for name, queue in queues.items()}
    assert received["other"] is None
    for name in ("main", "cc", "bcc"):
        message = received[name]
        assert (message.body, message.routing_key) == (b"memo", f"{unique}.main"), name
        assert message.properties.headers == {"CC": [f"{unique}.cc"], "kept": "yes"}, name


def test_cc_on_the_default_exchange_names_queues(channel, unique):
    first, second = (declare_queue(channel, f"{unique}-{index}", exclusive=True) for index in (1, 2))
    channel.basic_publish("", first, b"both", pika.BasicProperties(headers={"CC": [second]}))
    assert (get_all(channel, first), get_all(channel, second)) == ([b"both"], [b"both"])


def test_cc_and_bcc_deliver_one_copy_per_queue(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", queue, b"once", pika.BasicProperties(headers={"CC": [queue, queue], "BCC": [queue]}))
    assert get_all(channel, queue) == [b"once"]


def test_bcc_only_is_stripped_and_headers_table_kept(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", "nowhere", b"secret", pika.BasicProperties(headers={"BCC": [queue]}))
    message = get(channel, queue)
    assert (message.body, message.routing_key, message.properties.headers) == (b"secret", "nowhere", {})


# ---- bodies


def test_large_body_is_split_at_frame_max_minus_8_and_reassembled(client, unique):
    queue = raw_queue(client, unique)
    payload = bytes(range(256)) * 1100  # 281600 bytes
    client.publish(1, "", queue, payload)
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)
    assert client.expect(header.ContentHeader, channel=1).body_size == len(payload)
    sizes, received = [], b""
    while len(received) < len(payload):
        chunk = client.expect(body.ContentBody, channel=1).value
        sizes.append(len(chunk))
        received += chunk
    assert received == payload
    assert sizes == [131064, 131064, len(payload) - 2 * 131064]


def test_multi_megabyte_body_round_trips_through_pika(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    payload = bytes(range(251)) * 12000  # about 3 MB, not a multiple of the frame size
    channel.basic_publish("", queue, payload)
    assert get(channel, queue).body == payload


def test_empty_body_has_a_content_header_and_no_body_frame(client, unique):
    queue = raw_queue(client, unique)
    client.publish(1, "", queue, b"")
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)
    assert client.expect(header.ContentHeader, channel=1).body_size == 0
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.expect(commands.Basic.QosOk, channel=1)  # the next frame is the qos-ok, not an empty body frame


def test_body_sent_in_many_small_frames_is_reassembled(client, unique):
    queue = raw_queue(client, unique)
    payload = b"0123456789" * 50
    client.send(1, commands.Basic.Publish(exchange="", routing_key=queue),
                header.ContentHeader(0, len(payload), commands.Basic.Properties()),
                *[body.ContentBody(payload[offset:offset + 7]) for offset in range(0, len(payload), 7)])
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)
    client.expect(header.ContentHeader, channel=1)
    assert client.expect(body.ContentBody, channel=1).value == payload


# ---- properties


def test_every_basic_property_round_trips_unchanged(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    headers = {
        "string": "text",
        "bytes": b"\x00\x01binary",
        "int": 42,
        "negative": -7,
        "long": 2 ** 40,
        "bool": True,
        "none": None,
        "decimal": decimal.Decimal("3.14"),
        "timestamp": datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=datetime.timezone.utc),
        "array": [1, "two", [3, {"four": 4}]],
        "table": {"nested": {"deeper": ["x", 1]}, "empty": {}},
        "empty-array": [],
    }
    sent = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip", headers=headers, delivery_mode=2, priority=7,
        correlation_id="corr-1", reply_to="replies", expiration="60000", message_id="msg-1", timestamp=1715949045,
        type="order.created", user_id="guest", app_id="shop", cluster_id="cluster-a",
    )
    channel.basic_publish("", queue, b"{}", sent)
    received = get(channel, queue).properties
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id"):
        assert getattr(received, name) == getattr(sent, name), name
    assert received.headers == headers


def test_absent_properties_stay_absent(channel, unique):
    queue = declare_queue(channel, unique, exclusive=True)
    channel.basic_publish("", queue, b"bare")
    received = get(channel, queue).properties
    assert vars(received) == vars(pika.BasicProperties())
