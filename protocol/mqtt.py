"""Sans-io MQTT 3.1, 3.1.1 and 5.0: packets read from bytes and written to bytes, each checked as the specifications
say. No I/O and no broker: broker.mqtt speaks it on a socket.

A malformed packet raises MqttError with the reason code that MQTT 5.0 gives it (0x81 malformed packet, 0x82 protocol
error, 0x95 packet too large); a 3.1.1 connection just closes on it."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Final

# Packet types (the high nibble of the first byte)
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
PUBREC: Final = 5
PUBREL: Final = 6
PUBCOMP: Final = 7
SUBSCRIBE: Final = 8
SUBACK: Final = 9
UNSUBSCRIBE: Final = 10
UNSUBACK: Final = 11
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14
AUTH: Final = 15
NAMES: Final = {CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK", PUBREC: "PUBREC",
                PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE", SUBACK: "SUBACK",
                UNSUBSCRIBE: "UNSUBSCRIBE", UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ", PINGRESP: "PINGRESP",
                DISCONNECT: "DISCONNECT", AUTH: "AUTH"}
# The flags each packet type but PUBLISH must carry in the low nibble of its first byte
_FIXED_FLAGS: Final = {PUBREL: 2, SUBSCRIBE: 2, UNSUBSCRIBE: 2}

# Protocol levels
MQTT_3_1: Final = 3  # (protocol name "MQIsdp")
MQTT_3_1_1: Final = 4
MQTT_5: Final = 5
VERSION_NAMES: Final = {MQTT_3_1: "3.1.0", MQTT_3_1_1: "3.1.1", MQTT_5: "5.0"}

# CONNACK return codes of 3.1 and 3.1.1
ACCEPTED: Final = 0
REFUSED_PROTOCOL_VERSION: Final = 1
REFUSED_IDENTIFIER: Final = 2
REFUSED_SERVER_UNAVAILABLE: Final = 3
REFUSED_BAD_CREDENTIALS: Final = 4
REFUSED_NOT_AUTHORIZED: Final = 5

# Reason codes of 5.0 (those the broker sends)
SUCCESS: Final = 0x00
GRANTED_QOS_1: Final = 0x01
NO_MATCHING_SUBSCRIBERS: Final = 0x10
NO_SUBSCRIPTION_EXISTED: Final = 0x11
UNSPECIFIED_ERROR: Final = 0x80
MALFORMED_PACKET: Final = 0x81
PROTOCOL_ERROR: Final = 0x82
IMPLEMENTATION_SPECIFIC_ERROR: Final = 0x83
UNSUPPORTED_PROTOCOL_VERSION: Final = 0x84
CLIENT_IDENTIFIER_NOT_VALID: Final = 0x85
BAD_USER_NAME_OR_PASSWORD: Final = 0x86
NOT_AUTHORIZED: Final = 0x87
SERVER_UNAVAILABLE: Final = 0x88
SERVER_SHUTTING_DOWN: Final = 0x8B
BAD_AUTHENTICATION_METHOD: Final = 0x8C
KEEP_ALIVE_TIMEOUT: Final = 0x8D
SESSION_TAKEN_OVER: Final = 0x8E
TOPIC_FILTER_INVALID: Final = 0x8F
TOPIC_NAME_INVALID: Final = 0x90
PACKET_IDENTIFIER_NOT_FOUND: Final = 0x92
RECEIVE_MAXIMUM_EXCEEDED: Final = 0x93
TOPIC_ALIAS_INVALID: Final = 0x94
PACKET_TOO_LARGE: Final = 0x95
QUOTA_EXCEEDED: Final = 0x97
ADMINISTRATIVE_ACTION: Final = 0x98
PAYLOAD_FORMAT_INVALID: Final = 0x99
QOS_NOT_SUPPORTED: Final = 0x9B
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Final = 0x9E
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: Final = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: Final = 0xA2

# 5.0 properties: identifier -> (name, type). Types: byte, u16, u32, varint, str, bin, pair (a user property).
PROPERTIES: Final = {
    0x01: ("payload_format_indicator", "byte"), 0x02: ("message_expiry_interval", "u32"),
    0x03: ("content_type", "str"), 0x08: ("response_topic", "str"), 0x09: ("correlation_data", "bin"),
    0x0B: ("subscription_identifier", "varint"), 0x11: ("session_expiry_interval", "u32"),
    0x12: ("assigned_client_identifier", "str"), 0x13: ("server_keep_alive", "u16"),
    0x15: ("authentication_method", "str"), 0x16: ("authentication_data", "bin"),
    0x17: ("request_problem_information", "byte"), 0x18: ("will_delay_interval", "u32"),
    0x19: ("request_response_information", "byte"), 0x1A: ("response_information", "str"),
    0x1C: ("server_reference", "str"), 0x1F: ("reason_string", "str"), 0x21: ("receive_maximum", "u16"),
    0x22: ("topic_alias_maximum", "u16"), 0x23: ("topic_alias", "u16"), 0x24: ("maximum_qos", "byte"),
    0x25: ("retain_available", "byte"), 0x26: ("user_property", "pair"), 0x27: ("maximum_packet_size", "u32"),
    0x28: ("wildcard_subscription_available", "byte"), 0x29: ("subscription_identifier_available", "byte"),
    0x2A: ("shared_subscription_available", "byte"),
}
_PROPERTY_IDS: Final = {name: (identifier, kind) for identifier, (name, kind) in PROPERTIES.items()}
# properties that may appear more than once: their values are lists
_REPEATED: Final = frozenset(("user_property", "subscription_identifier"))

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
MAX_REMAINING_LENGTH: Final = 268_435_455  # what four bytes of remaining length can say


class MqttError(Exception):
    """A packet the broker cannot accept: reason (a 5.0 reason code) and a text that names what is wrong."""

    def __init__(self, reason: int, text: str):
        super().__init__(text)
        self.reason = reason
        self.text = text


def malformed(text: str) -> MqttError:
    return MqttError(MALFORMED_PACKET, text)


def protocol_error(text: str) -> MqttError:
    return MqttError(PROTOCOL_ERROR, text)


# --- packets ------------------------------------------------------------------------------------------------------
@dataclass
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict = field(default_factory=dict)


@dataclass
class Connect:
    protocol_name: str
    level: int  # MQTT_3_1, MQTT_3_1_1 or MQTT_5
    clean_start: bool  # (3.1.1's clean session)
    keepalive: int  # seconds, 0 = none
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None
    properties: dict = field(default_factory=dict)


@dataclass
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int  # 0 for QoS 0
    properties: dict = field(default_factory=dict)


@dataclass
class Subscription:
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0: send retained messages at subscribe, 1: only if new, 2: never


@dataclass
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: dict = field(default_factory=dict)


@dataclass
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: dict = field(default_factory=dict)


@dataclass
class Acknowledgement:
    """PUBACK, PUBREC, PUBREL or PUBCOMP."""

    kind: int
    packet_id: int
    reason: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass
class Disconnect:
    reason: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass
class Auth:
    reason: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass
class Ping:
    pass


Packet = Connect | Publish | Subscribe | Unsubscribe | Acknowledgement | Disconnect | Auth | Ping


# --- reading ------------------------------------------------------------------------------------------------------
class PacketReader:
    """Cuts a byte stream into packets: (first byte, body) pairs, each at most max_size bytes long in all."""

    def __init__(self, max_size: int):
        self.max_size = max_size  # the largest packet accepted, its fixed header included
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buffer = self.buffer
        buffer += data
        packets: list[tuple[int, bytes]] = []
        start = 0
        end = len(buffer)
        while end - start >= 2:
            length = 0
            shift = 0
            at = start + 1
            while True:
                if at >= end:
                    self._keep(start)
                    return packets
                byte = buffer[at]
                at += 1
                length |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise malformed("the remaining length takes more than four bytes")
            if at - start + length > self.max_size:
                raise MqttError(PACKET_TOO_LARGE, f"a packet of {at - start + length} bytes is larger than the "
                                                  f"maximum of {self.max_size}")
            if at + length > end:
                break
            packets.append((buffer[start], bytes(buffer[at:at + length])))
            start = at + length
        self._keep(start)
        return packets

    def _keep(self, start: int) -> None:
        if start:
            del self.buffer[:start]


class _Body:
    """A packet's body read field by field; running past its end is a malformed packet."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, size: int, what: str) -> bytes:
        if self.at + size > len(self.data):
            raise malformed(f"the packet ends inside its {what}")
        value = self.data[self.at:self.at + size]
        self.at += size
        return value

    def byte(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return _U16.unpack(self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return _U32.unpack(self.take(4, what))[0]

    def varint(self, what: str) -> int:
        value = shift = 0
        for _ in range(4):
            byte = self.byte(what)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise malformed(f"its {what} takes more than four bytes")

    def binary(self, what: str) -> bytes:
        return self.take(self.u16(what), what)

    def string(self, what: str) -> str:
        return text_of(self.binary(what), what)

    def rest(self) -> bytes:
        value = self.data[self.at:]
        self.at = len(self.data)
        return value


def text_of(raw: bytes, what: str) -> str:
    """A UTF-8 string field as the specifications allow it: well-formed, and without U+0000."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"its {what} is not valid UTF-8") from None
    if "\x00" in text:
        raise malformed(f"its {what} contains the character U+0000")
    return text


def _properties(body: _Body, allowed: frozenset[str] | None) -> dict:
    """A 5.0 property list; one a packet may not carry, or a repeated single one, is a protocol error."""
    size = body.varint("property length")
    end = body.at + size
    if end > len(body.data):
        raise malformed("its property length runs past the packet")
    found: dict[str, Any] = {}
    while body.at < end:
        identifier = body.varint("property identifier")
        entry = PROPERTIES.get(identifier)
        if entry is None:
            raise malformed(f"unknown property identifier 0x{identifier:02x}")
        name, kind = entry
        if allowed is not None and name not in allowed:
            raise protocol_error(f"the property {name} is not allowed in this packet")
        if kind == "byte":
            value: Any = body.byte(name)
        elif kind == "u16":
            value = body.u16(name)
        elif kind == "u32":
            value = body.u32(name)
        elif kind == "varint":
            value = body.varint(name)
        elif kind == "str":
            value = body.string(name)
        elif kind == "bin":
            value = body.binary(name)
        else:
            value = (body.string(name), body.string(name))
        if name in _REPEATED:
            found.setdefault(name, []).append(value)
        elif name in found:
            raise protocol_error(f"the property {name} appears twice")
        else:
            found[name] = value
    if body.at != end:
        raise malformed("a property runs past the property length")
    return found


_CONNECT_PROPERTIES: Final = frozenset(("session_expiry_interval", "receive_maximum", "maximum_packet_size",
                                        "topic_alias_maximum", "request_response_information",
                                        "request_problem_information", "user_property", "authentication_method",
                                        "authentication_data"))
_WILL_PROPERTIES: Final = frozenset(("will_delay_interval", "payload_format_indicator", "message_expiry_interval",
                                     "content_type", "response_topic", "correlation_data", "user_property"))
_PUBLISH_PROPERTIES: Final = frozenset(("payload_format_indicator", "message_expiry_interval", "topic_alias",
                                        "response_topic", "correlation_data", "user_property", "content_type"))
_ACK_PROPERTIES: Final = frozenset(("reason_string", "user_property"))
_SUBSCRIBE_PROPERTIES: Final = frozenset(("subscription_identifier", "user_property"))
_UNSUBSCRIBE_PROPERTIES: Final = frozenset(("user_property",))
_DISCONNECT_PROPERTIES: Final = frozenset(("session_expiry_interval", "reason_string", "user_property",
                                           "server_reference"))
_AUTH_PROPERTIES: Final = frozenset(("authentication_method", "authentication_data", "reason_string",
                                     "user_property"))


def read_connect(body_bytes: bytes) -> Connect:
    """The first packet's body. A protocol name or level this broker does not speak raises MqttError with
    UNSUPPORTED_PROTOCOL_VERSION and the level in its text (the CONNACK that refuses it depends on the level)."""
    body = _Body(body_bytes)
    name = body.string("protocol name")
    level = body.byte("protocol level")
    if (name, level) not in (("MQIsdp", MQTT_3_1), ("MQTT", MQTT_3_1_1), ("MQTT", MQTT_5)):
        raise MqttError(UNSUPPORTED_PROTOCOL_VERSION, f"protocol {name[:100]!r} level {level} is not supported")
    flags = body.byte("connect flags")
    if flags & 0x01:
        raise malformed("the reserved connect flag is set")
    keepalive = body.u16("keep alive")
    properties = _properties(body, _CONNECT_PROPERTIES) if level == MQTT_5 else {}
    client_id = body.string("client identifier")
    will = None
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if flags & 0x04:
        if will_qos == 3:
            raise malformed("the will QoS is 3")
        will_properties = _properties(body, _WILL_PROPERTIES) if level == MQTT_5 else {}
        topic = body.string("will topic")
        check_topic_name(topic)
        will = Will(topic, body.binary("will message"), will_qos, will_retain, will_properties)
    elif will_qos or will_retain:
        raise malformed("a will QoS or retain flag without a will")
    username = body.string("user name") if flags & 0x80 else None
    if flags & 0x40:
        if username is None and level != MQTT_5:
            raise malformed("a password without a user name")
        password: bytes | None = body.binary("password")
    else:
        password = None
    if body.left():
        raise malformed("bytes after the last field of CONNECT")
    return Connect(name, level, bool(flags & 0x02), keepalive, client_id, will, username, password, properties)


def read_packet(first: int, body_bytes: bytes, level: int) -> Packet:
    """A packet after CONNECT, from its first byte and body, for a connection of this protocol level."""
    kind = first >> 4
    flags = first & 0x0F
    body = _Body(body_bytes)
    v5 = level == MQTT_5
    if kind == PUBLISH:
        qos = (flags >> 1) & 3
        if qos == 3:
            raise malformed("a PUBLISH of QoS 3")
        dup = bool(flags & 0x08)
        if dup and qos == 0:
            raise malformed("a PUBLISH of QoS 0 with its DUP flag set")
        topic = body.string("topic name")
        packet_id = body.u16("packet identifier") if qos else 0
        if qos and not packet_id:
            raise malformed("a PUBLISH with packet identifier 0")
        properties = _properties(body, _PUBLISH_PROPERTIES) if v5 else {}
        if topic or not v5 or "topic_alias" not in properties:
            check_topic_name(topic)
        return Publish(topic, body.rest(), qos, bool(flags & 0x01), dup, packet_id, properties)
    expected = _FIXED_FLAGS.get(kind, 0)
    if flags != expected:
        raise malformed(f"{NAMES.get(kind, kind)} with flags {flags:#x}, not {expected:#x}")
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        packet_id = body.u16("packet identifier")
        reason = SUCCESS
        properties = {}
        if v5 and body.left():
            reason = body.byte("reason code")
            if body.left():
                properties = _properties(body, _ACK_PROPERTIES)
        _no_more(body, kind)
        return Acknowledgement(kind, packet_id, reason, properties)
    if kind == SUBSCRIBE:
        packet_id = body.u16("packet identifier")
        properties = _properties(body, _SUBSCRIBE_PROPERTIES) if v5 else {}
        subscriptions = []
        while body.left():
            topic_filter = body.string("topic filter")
            options = body.byte("subscription options")
            if options & (0xC0 if v5 else 0xFC):
                raise malformed(f"reserved subscription option bits are set ({options:#04x})")
            if options & 3 == 3:
                raise malformed("a subscription of QoS 3")
            if (options >> 4) & 3 == 3:
                raise malformed("retain handling 3")
            subscriptions.append(Subscription(topic_filter, options & 3, bool(options & 4), bool(options & 8),
                                              (options >> 4) & 3))
        if not subscriptions:
            raise protocol_error("a SUBSCRIBE with no topic filter")
        return Subscribe(packet_id, subscriptions, properties)
    if kind == UNSUBSCRIBE:
        packet_id = body.u16("packet identifier")
        properties = _properties(body, _UNSUBSCRIBE_PROPERTIES) if v5 else {}
        filters = []
        while body.left():
            filters.append(body.string("topic filter"))
        if not filters:
            raise protocol_error("an UNSUBSCRIBE with no topic filter")
        return Unsubscribe(packet_id, filters, properties)
    if kind == PINGREQ:
        _no_more(body, kind)
        return Ping()
    if kind == DISCONNECT:
        reason = SUCCESS
        properties = {}
        if v5 and body.left():
            reason = body.byte("reason code")
            if body.left():
                properties = _properties(body, _DISCONNECT_PROPERTIES)
        _no_more(body, kind)
        return Disconnect(reason, properties)
    if kind == AUTH and v5:
        reason = SUCCESS
        properties = {}
        if body.left():
            reason = body.byte("reason code")
            if body.left():
                properties = _properties(body, _AUTH_PROPERTIES)
        _no_more(body, kind)
        return Auth(reason, properties)
    if kind == CONNECT:
        raise protocol_error("a second CONNECT")
    raise protocol_error(f"a {NAMES.get(kind, f'type {kind}')} packet from a client")


def _no_more(body: _Body, kind: int) -> None:
    if body.left():
        raise malformed(f"bytes after the last field of {NAMES[kind]}")


def check_topic_name(topic: str) -> None:
    """A topic a message is published to: at least one character, no wildcard."""
    if not topic:
        raise MqttError(TOPIC_NAME_INVALID, "an empty topic name")
    if "+" in topic or "#" in topic:
        raise MqttError(TOPIC_NAME_INVALID, f"the topic name {topic[:200]!r} contains a wildcard")


def topic_filter_problem(topic_filter: str) -> str | None:
    """Why a topic filter is not valid (a wildcard that is not a whole level, # not last), or None."""
    if not topic_filter:
        return "an empty topic filter"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return f"the topic filter {topic_filter[:200]!r} has '#' other than as its last level"
        if "+" in level and level != "+":
            return f"the topic filter {topic_filter[:200]!r} has '+' other than as a whole level"
    return None


# --- writing ------------------------------------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def _binary(value: bytes) -> bytes:
    return _U16.pack(len(value)) + value


def encode_properties(properties: dict) -> bytes:
    """A 5.0 property list, its length first."""
    out = bytearray()
    for name, value in properties.items():
        identifier, kind = _PROPERTY_IDS[name]
        for item in (value if name in _REPEATED else (value,)):
            out += _varint(identifier)
            if kind == "byte":
                out.append(item)
            elif kind == "u16":
                out += _U16.pack(item)
            elif kind == "u32":
                out += _U32.pack(item)
            elif kind == "varint":
                out += _varint(item)
            elif kind == "str":
                out += _string(item)
            elif kind == "bin":
                out += _binary(item)
            else:
                out += _string(item[0]) + _string(item[1])
    return _varint(len(out)) + bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + _varint(len(body)) + body


def connack(session_present: bool, code: int, level: int, properties: dict | None = None) -> bytes:
    body = bytes((1 if session_present else 0, code))
    if level == MQTT_5:
        body += encode_properties(properties or {})
    return _packet(CONNACK << 4, body)


def publish(topic: bytes, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
            properties: bytes = b"") -> bytes:
    """A PUBLISH to a client: topic already encoded; properties an encoded 5.0 property list (b"" for 3.1.1)."""
    first = (PUBLISH << 4) | (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    head = _U16.pack(len(topic)) + topic + (_U16.pack(packet_id) if qos else b"") + properties
    return bytes((first,)) + _varint(len(head) + len(payload)) + head + payload


def publish_size(topic: bytes, payload: bytes, qos: int, properties: bytes = b"") -> int:
    """The size of the PUBLISH publish() would write, for a client that takes packets up to a size."""
    remaining = 2 + len(topic) + (2 if qos else 0) + len(properties) + len(payload)
    return 1 + len(_varint(remaining)) + remaining


def acknowledgement(kind: int, packet_id: int, level: int, reason: int = SUCCESS) -> bytes:
    """PUBACK, PUBREC, PUBREL (flags 2) or PUBCOMP; 5.0 leaves out a success reason, as it may."""
    first = (kind << 4) | _FIXED_FLAGS.get(kind, 0)
    if level == MQTT_5 and reason != SUCCESS:
        return _packet(first, _U16.pack(packet_id) + bytes((reason,)))
    return _packet(first, _U16.pack(packet_id))


def suback(packet_id: int, codes: list[int], level: int) -> bytes:
    body = _U16.pack(packet_id) + (b"\x00" if level == MQTT_5 else b"") + bytes(codes)
    return _packet(SUBACK << 4, body)


def unsuback(packet_id: int, codes: list[int], level: int) -> bytes:
    if level == MQTT_5:
        return _packet(UNSUBACK << 4, _U16.pack(packet_id) + b"\x00" + bytes(codes))
    return _packet(UNSUBACK << 4, _U16.pack(packet_id))


PINGRESP_PACKET: Final = bytes((PINGRESP << 4, 0))


def disconnect(reason: int, properties: dict | None = None) -> bytes:
    """A 5.0 DISCONNECT from the server (3.1.1 has none: the server just closes)."""
    return _packet(DISCONNECT << 4, bytes((reason,)) + encode_properties(properties or {}))
