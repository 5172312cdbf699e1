"""Messages through the management API: a message from a publish request's JSON, and a queued message as the
JSON of a get reply, both with RabbitMQ's field names, encodings and errors."""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
from decimal import Decimal
from typing import Callable, Iterator

from pamqp.commands import Basic

from broker.management import http
from broker.model.turns import in_slices
from broker.model import operations
from broker.model.message import Address, Header, Message, QueueEntry, carbon_copy_keys
from broker.model.queue import Queue
from broker.model.remote import RemoteQueue
from protocol.codec import LongLong, encode_header_payload
from protocol.field_table import MAX_DEPTH

# JSON property name -> pamqp's attribute name, in RabbitMQ's order
PROPERTY_NAMES = {
    "content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
    "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
    "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id", "timestamp": "timestamp",
    "type": "message_type", "user_id": "user_id", "app_id": "app_id", "cluster_id": "cluster_id",
}
# integer properties -> the values their field types hold (a timestamp as a datetime Python can make)
INTEGER_PROPERTIES = {"delivery_mode": (0, 255), "priority": (0, 255), "timestamp": (0, 253402300799)}
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1  # the range of a 64-bit field value


def required(body: dict, key: str):
    http.require_keys(body, (key,))
    return body[key]


# --- publish requests ------------------------------------------------------------------------------------------
def from_request(body: dict, exchange: str, user: str) -> tuple[list[str], Message]:
    """The routing keys (the CC and BCC headers' too: sender-selected distribution) and the message a publish
    request describes, BCC removed. Only its shape is checked here (400): what basic.publish would refuse is
    operations.publish's to check."""
    properties_json = required(body, "properties")
    routing_key = required(body, "routing_key")
    payload = _payload(required(body, "payload"), required(body, "payload_encoding"))
    if not isinstance(properties_json, dict):
        raise http.bad_request("properties must be a JSON object")
    properties = _properties(properties_json)
    headers = properties.headers or {}
    routing_keys = [str(routing_key), *carbon_copy_keys(headers, "CC"), *carbon_copy_keys(headers, "BCC")]
    headers.pop("BCC", None)
    header = Header(encode_header_payload(len(payload), properties))
    return routing_keys, Message(Address(exchange, str(routing_key)), header, payload)


async def take(queue: Queue, count: int, no_ack: bool, each: Callable[[QueueEntry], None]) -> None:
    """Up to count messages from the head of the queue (a negative count: all, as RabbitMQ counts down to 0), as gets
    take them, each handed to each() as it is taken; the event loop turns every TURN_SECONDS (in_slices), and after
    each turn's share of the expired messages ahead of one (Queue.take). A queue another process owns is asked
    there, one get after the other."""
    if isinstance(queue, RemoteQueue):
        await _taking_there(queue, count, no_ack, each)
    else:
        await in_slices(_taking(queue, count, no_ack, each))


async def _taking_there(queue: RemoteQueue, count: int, no_ack: bool, each: Callable[[QueueEntry], None]) -> None:
    taken = 0
    while taken != count:
        answer: asyncio.Future[QueueEntry | None] = asyncio.get_running_loop().create_future()
        queue.take_there(no_ack, lambda got: _answered(queue, answer, got))
        entry = await answer
        if entry is None:
            return
        each(entry)
        taken += 1


def _answered(queue: RemoteQueue, answer: "asyncio.Future[QueueEntry | None]", entry: QueueEntry | None) -> None:
    """A get's answer from the queue's owner; one for a request that ended meanwhile goes back to the queue."""
    if not answer.done():
        answer.set_result(entry)
    elif entry is not None:
        queue.settle([entry], True)


def _taking(queue: Queue, count: int, no_ack: bool, each: Callable[[QueueEntry], None]) -> Iterator[None]:
    taken = 0
    while taken != count:
        while (entry := queue.take(no_ack)) is None:
            if not queue.take_again():
                return
            yield  # (expired messages ahead of the head left: this turn's share)
        each(entry)
        taken += 1
        yield


def _payload(payload, encoding) -> bytes:
    if not isinstance(payload, str):
        raise http.bad_request("payload_not_string")
    if encoding == "string":
        return payload.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise http.ApiError(400, "bad_request", ["not_base64", payload]) from None
    raise http.ApiError(400, "bad_request", ["unsupported_encoding", encoding])


def _properties(data: dict) -> Basic.Properties:
    """Message properties from JSON; unknown names are ignored, as RabbitMQ ignores them."""
    properties = Basic.Properties()
    for key, attribute in PROPERTY_NAMES.items():
        value = data.get(key)
        if value is None:
            continue
        if key == "headers":
            value = field_table(value, LongLong) if isinstance(value, dict) else None
        elif key in INTEGER_PROPERTIES:
            if not isinstance(value, int) or isinstance(value, bool):
                raise http.ApiError(400, "bad_request", ["not_int", key])
            low, high = INTEGER_PROPERTIES[key]
            if not low <= value <= high:
                raise http.bad_request(f"{key} must be between {low} and {high}, got {value}")
            if key == "timestamp":
                value = datetime.datetime.fromtimestamp(value, datetime.UTC)
        elif not isinstance(value, str):
            raise http.ApiError(400, "bad_request", ["not_string", key])
        else:
            _check_shortstr(key, value)
        setattr(properties, attribute, value)
    return properties


def field_table(data: dict, integer=int, depth: int = 1) -> dict:
    """A JSON object as an AMQP field table, integers made with integer (RabbitMQ's API makes them 64-bit); 400
    for what no field table holds: null (RabbitMQ's refusal), an integer beyond 64 bits, a name over 255 bytes, or
    tables nested deeper than AMQP's decoder takes them."""
    _check_depth(depth)
    for key in data:
        _check_shortstr("field name", key)
    return {key: _field_value(value, integer, depth) for key, value in data.items()}


def _field_value(value, integer, depth: int):
    """A JSON value in a table or array depth levels deep."""
    if value is None:
        raise http.bad_request("null_not_allowed")
    if isinstance(value, dict):
        return field_table(value, integer, depth + 1)
    if isinstance(value, list):
        _check_depth(depth + 1)
        return [_field_value(item, integer, depth + 1) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if not LONG_MIN <= value <= LONG_MAX:
            raise http.bad_request(f"integer {value} does not fit in a 64-bit field value")
        return integer(value)
    return value


def _check_depth(depth: int) -> None:
    """Tables and arrays nest at most as deep as AMQP's decoder takes them (protocol.field_table)."""
    if depth > MAX_DEPTH:
        raise http.bad_request(f"field tables and arrays nested deeper than {MAX_DEPTH} levels")


def _check_shortstr(what: str, value: str) -> None:
    """400 for a value an AMQP short string cannot carry."""
    if problem := operations.shortstr_problem(what, value):
        raise http.bad_request(problem)


# --- get replies -----------------------------------------------------------------------------------------------
def properties_json(properties: Basic.Properties) -> dict | list:
    """The properties a message carries; none at all is [] (RabbitMQ's empty proplist)."""
    data = {}
    for key, attribute in PROPERTY_NAMES.items():
        value = getattr(properties, attribute)
        if value is None or (key == "cluster_id" and value == ""):
            continue
        if key == "headers":
            value = json_value(value)
        elif key == "timestamp":
            value = int(value.timestamp()) if value.tzinfo else int(value.replace(tzinfo=datetime.UTC).timestamp())
        data[key] = value
    return data or []


def json_value(value):
    """An AMQP field value as RabbitMQ's API shows it."""
    if isinstance(value, dict):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_value(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return f"Not UTF-8, base64 is: {base64.b64encode(value).decode()}"
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, Decimal):
        # RabbitMQ prints its {Scale, Value} pair as the number Scale.Value (Value as an unsigned 32-bit integer)
        scale = max(0, -value.as_tuple().exponent)
        return float(f"{scale}.{int(value.scaleb(scale)) & 0xFFFFFFFF}")
    if value is None:
        return "undefined"
    return value


def payload_json(body: bytes, encoding: str, truncate: int | None) -> dict:
    """payload and payload_encoding of a get reply: the body (cut to truncate bytes) as text when it is UTF-8 and
    encoding is auto, else in base64."""
    shown = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return {"payload": shown.decode(), "payload_encoding": "string"}
        except UnicodeDecodeError:
            pass
    return {"payload": base64.b64encode(shown).decode(), "payload_encoding": "base64"}
