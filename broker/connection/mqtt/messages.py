"""An MQTT message as the AMQP message it becomes, and back, as RabbitMQ's plugin maps them: QoS 1 is delivery mode
2 (persistent), the headers x-mqtt-publish-qos and x-mqtt-dup say how it was published; MQTT 5.0's properties are
the AMQP properties of the same meaning (content type, response topic as reply_to, correlation data as
correlation_id, message expiry as a per-message TTL, user properties as headers)."""

from __future__ import annotations

import time
from typing import Final

from pamqp import commands as spec

from broker.connection.mqtt import topics
from protocol import mqtt
from protocol.codec import decode_properties, encode_header_payload, with_body_size

QOS_HEADER: Final = "x-mqtt-publish-qos"
DUP_HEADER: Final = "x-mqtt-dup"
RETAIN_HEADER: Final = "x-mqtt-retain"  # on a message published with the retain flag (5.0's retain as published)
# on a message with a message expiry interval: when it expires (ms since the epoch), for what is left of it
EXPIRES_HEADER: Final = "x-mqtt-expires-at"
# on a message of a connection that has no_local subscriptions: a token of that connection (never its client id),
# by which its own messages are kept from it
PUBLISHER_HEADER: Final = "x-mqtt-publisher"
CORRELATION_HEADER: Final = "x-correlation-id"  # correlation data that no shortstr can hold (binary, or long)
MAX_STRING: Final = 65_535  # bytes of an MQTT string or binary property
MAX_EXPIRY_SECONDS: Final = 315_360_000  # a longer message expiry interval (a "never") sets no TTL (ten years)
CACHE_LIMIT: Final = 1024  # content headers whose MQTT view is remembered (publishers repeat theirs)

_plain: dict[tuple[int, bool, bool], bytes] = {}  # (qos, dup, retain) -> a header without 5.0 properties


def amqp_header(qos: int, dup: bool, body_size: int, properties: dict, retain: bool = False,
                publisher: str = "") -> bytes:
    """The content-header payload of an MQTT publish (properties: its 5.0 properties, {} for 3.1.1)."""
    if publisher:
        return _encode(qos, dup, retain, body_size, properties, publisher)
    if not properties:
        header = _plain.get((qos, dup, retain))
        if header is None:
            header = _plain[(qos, dup, retain)] = _encode(qos, dup, retain, 0, {})
        return with_body_size(header, body_size)
    return _encode(qos, dup, retain, body_size, properties)


def _encode(qos: int, dup: bool, retain: bool, body_size: int, properties: dict, publisher: str = "") -> bytes:
    # (a name given twice keeps its last value; those of the x-mqtt- headers are the broker's own: left out)
    headers: dict = {name: value for name, value in properties.get("user_property", ())
                     if not name.startswith("x-mqtt-")}
    headers[QOS_HEADER] = qos
    headers[DUP_HEADER] = dup
    if retain:
        headers[RETAIN_HEADER] = True
    if publisher:
        headers[PUBLISHER_HEADER] = publisher
    amqp = spec.Basic.Properties(delivery_mode=2 if qos else 1, headers=headers)
    if "content_type" in properties and len(properties["content_type"].encode()) <= 255:
        amqp.content_type = properties["content_type"]
    if "response_topic" in properties and len(properties["response_topic"].encode()) <= 255:
        amqp.reply_to = topics.routing_key(properties["response_topic"])
    if "correlation_data" in properties:
        data = properties["correlation_data"]
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = None
        if text is not None and len(data) <= 255:
            amqp.correlation_id = text
        else:
            headers[CORRELATION_HEADER] = data
    if properties.get("message_expiry_interval", MAX_EXPIRY_SECONDS + 1) <= MAX_EXPIRY_SECONDS:
        amqp.expiration = str(properties["message_expiry_interval"] * 1000)
        headers[EXPIRES_HEADER] = int(time.time() * 1000) + properties["message_expiry_interval"] * 1000
    if "payload_format_indicator" in properties:
        headers["x-mqtt-payload-format-indicator"] = properties["payload_format_indicator"]
    return encode_header_payload(body_size, amqp)


class MqttView:
    """What an MQTT subscriber is sent of an AMQP message: its QoS, its DUP and retain flags, and its 5.0
    properties."""

    __slots__ = ("qos", "dup", "retain", "publisher", "expires_at", "properties")

    def __init__(self, qos: int, dup: bool, retain: bool, publisher: str, expires_at: int, properties: dict):
        self.qos = qos  # the QoS it was published with: x-mqtt-publish-qos, else 1 for a persistent message
        self.dup = dup
        self.retain = retain  # it was published with the retain flag (sent so where a subscription asks)
        self.publisher = publisher  # the token of the connection that published it, if that one asked for it
        self.expires_at = expires_at  # when its MQTT expiry interval ends (ms since the epoch; 0: none)
        self.properties = properties  # for a 5.0 subscriber


_views: dict[bytes, MqttView] = {}  # a content header's properties (body size left out) -> its view


def view_of(header_payload: bytes) -> MqttView:
    """The MQTT view of a delivered message's content header."""
    key = header_payload[12:]
    view = _views.get(key)
    if view is None:
        if len(_views) >= CACHE_LIMIT:
            _views.clear()
        view = _views[key] = _view(header_payload)
    return view


def _view(header_payload: bytes) -> MqttView:
    amqp = decode_properties(header_payload)
    headers = amqp.headers or {}
    qos = headers.get(QOS_HEADER)
    if not isinstance(qos, int) or isinstance(qos, bool) or qos not in (0, 1, 2):
        # (RabbitMQ 4.x reads an AMQP publisher's QoS from its delivery mode; 3.10 took every such message as QoS 1)
        qos = 1 if amqp.delivery_mode == 2 else 0
    properties: dict = {}
    users = [(name, text) for name, text in (
        (name, value if isinstance(value, str) else str(value)) for name, value in headers.items()
        if not name.startswith("x-mqtt-") and name != CORRELATION_HEADER
        and isinstance(value, (str, int, float)) and not isinstance(value, bool))
        if len(text.encode()) <= MAX_STRING]  # (one MQTT cannot carry is left out)
    if users:
        properties["user_property"] = users
    if amqp.content_type:
        properties["content_type"] = amqp.content_type
    if amqp.reply_to:
        properties["response_topic"] = topics.topic(amqp.reply_to)
    if amqp.correlation_id:
        properties["correlation_data"] = amqp.correlation_id.encode()
    elif isinstance(headers.get(CORRELATION_HEADER), bytes) and len(headers[CORRELATION_HEADER]) <= MAX_STRING:
        properties["correlation_data"] = headers[CORRELATION_HEADER]
    if amqp.expiration and amqp.expiration.isdigit():  # (the interval as published, not what is left of it)
        properties["message_expiry_interval"] = -(-int(amqp.expiration) // 1000)
    indicator = headers.get("x-mqtt-payload-format-indicator")
    if indicator in (0, 1):
        properties["payload_format_indicator"] = indicator
    publisher = headers.get(PUBLISHER_HEADER)
    expires_at = headers.get(EXPIRES_HEADER)
    return MqttView(min(qos, 1), headers.get(DUP_HEADER) is True, headers.get(RETAIN_HEADER) is True,
                    publisher if isinstance(publisher, str) else "",
                    expires_at if isinstance(expires_at, int) and not isinstance(expires_at, bool) else 0, properties)


def encoded_properties(view: MqttView, extra: dict | None = None) -> bytes:
    """A 5.0 PUBLISH's property list: the message's, with extra (a subscription identifier) added."""
    if not extra:
        return mqtt.encode_properties(view.properties)
    return mqtt.encode_properties({**view.properties, **extra})
