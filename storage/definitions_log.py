"""Durable definitions (exchanges, queues, bindings, vhosts, users, permissions, topic permissions, policies, runtime
parameters), the decisions of transactions across processes until every process took its share, MQTT's retained
messages, waiting sessions and held wills, and queue-deletion watermarks.

They live in their own small log, ``definitions.log``. When the log has grown well past the live state, the writer
replaces it by a snapshot (written aside, fsynced, renamed over).

A definition's data is JSON in which every object is a one-key wrapper naming the type of what it holds:
``{"m": {...}}`` a table (its values wrapped the same way), ``{"b": base64}`` bytes, ``{"d": "1.50"}`` a Decimal,
``{"t": isoformat}`` a datetime. Strings, numbers, booleans, null and arrays stay plain JSON. A table a client
sends is always inside an ``"m"`` wrapper, so no client value can pass for a wrapper. Records of the first format
(``records.LEGACY_DEFINITION``) tagged only the values JSON cannot hold, with one-key objects such as
``{"__warren_bytes__": ...}``; they are still read, and a tag whose value does not decode is kept as the table the
client sent.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
from typing import Any

from storage import records

KINDS = ("exchange", "queue", "binding", "vhost", "user", "policy", "permission", "operator_policy", "parameter",
         "transaction", "retained", "topic_permission", "mqtt_session", "mqtt_will")

# Wrappers of the typed format
_TABLE = "m"
_BYTES = "b"
_DECIMAL = "d"
_DATETIME = "t"

# Tags of the legacy format
_LEGACY_BYTES = "__warren_bytes__"
_LEGACY_DECIMAL = "__warren_decimal__"
_LEGACY_DATETIME = "__warren_datetime__"


class UndecodableDefinition(ValueError):
    """A definition record whose data is not what any version of the encoder writes."""


def _typed(value: Any) -> Any:
    """``value`` as the JSON-ready structure of the typed format."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        table = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"cannot store a table key of type {type(key).__name__} in a definition")
            table[key] = _typed(item)
        return {_TABLE: table}
    if isinstance(value, (list, tuple)):
        return [_typed(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, datetime.datetime):
        return {_DATETIME: value.isoformat()}
    raise TypeError(f"cannot store a {type(value).__name__} in a definition")


def _untyped(value: Any) -> Any:
    """The value a JSON-decoded structure of the typed format stands for."""
    if isinstance(value, list):
        return [_untyped(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise UndecodableDefinition(f"an object with {len(value)} keys where a one-key wrapper belongs")
    ((tag, inner),) = value.items()
    if tag == _TABLE and isinstance(inner, dict):
        return {key: _untyped(item) for key, item in inner.items()}
    try:
        if tag == _BYTES and isinstance(inner, str):
            return base64.b64decode(inner, validate=True)
        if tag == _DECIMAL and isinstance(inner, str):
            return decimal.Decimal(inner)
        if tag == _DATETIME and isinstance(inner, str):
            return datetime.datetime.fromisoformat(inner)
    except (binascii.Error, decimal.InvalidOperation, ValueError) as error:
        raise UndecodableDefinition(f"bad {tag!r} value: {error}") from None
    raise UndecodableDefinition(f"unknown wrapper {tag!r}")


def encode_data(data: dict | None) -> bytes:
    """The typed-format bytes of a definition's data; empty for a deleted definition."""
    if data is None:
        return b""
    return json.dumps(_typed(data), separators=(",", ":")).encode()


def decode_data(raw: bytes) -> dict | None:
    """Inverse of ``encode_data``; raises ``UndecodableDefinition`` (or another ValueError) for bytes it never
    makes."""
    if not raw:
        return None
    data = _untyped(json.loads(raw))
    if not isinstance(data, dict):
        raise UndecodableDefinition(f"a definition must be a table, not a {type(data).__name__}")
    return data


def _decode_legacy_object(obj: dict) -> Any:
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        try:
            if tag == _LEGACY_BYTES:
                return base64.b64decode(value, validate=True)
            if tag == _LEGACY_DECIMAL:
                return decimal.Decimal(value)
            if tag == _LEGACY_DATETIME:
                return datetime.datetime.fromisoformat(value)
        except (binascii.Error, decimal.InvalidOperation, TypeError, ValueError):
            pass  # the encoder never wrote this tag: it is a client's table
    return obj


def decode_legacy_data(raw: bytes) -> dict | None:
    """The data of a ``records.LEGACY_DEFINITION`` record. A client's one-key table with a well-formed tag (e.g.
    ``{"__warren_bytes__": "QUJD"}``) comes back decoded: the legacy format cannot tell them apart."""
    if not raw:
        return None
    data = json.loads(raw, object_hook=_decode_legacy_object)
    if not isinstance(data, dict):
        raise UndecodableDefinition(f"a definition must be a table, not a {type(data).__name__}")
    return data


class DefinitionTable:
    """The latest state of every definition, in creation order, with its encoded record for snapshots."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], bytes] = {}  # (kind, name) -> framed DEFINITION record
        self._data: dict[tuple[str, str], dict] = {}  # (kind, name) -> data, same order
        self.live_bytes = 0  # size of a snapshot of the definitions alone

    def set(self, kind: str, name: str, data: dict | None) -> bytes:
        """Apply a change; return its framed record for the log."""
        if kind not in KINDS:
            raise ValueError(f"unknown definition kind {kind!r}")
        record = records.definition(kind, name, encode_data(data))
        self._apply(kind, name, data, record)
        return record

    def apply_recovered(self, record_type: int, kind: str, name: str, raw: bytes, record: bytes) -> None:
        """A definition record read back (``record`` is the framed record itself). Raises ValueError (left
        unapplied) if it cannot be decoded. A legacy record is kept re-encoded, so the next snapshot migrates it."""
        if kind not in KINDS:
            raise UndecodableDefinition(f"unknown definition kind {kind!r}")
        if record_type == records.LEGACY_DEFINITION:
            data = decode_legacy_data(raw)
            record = records.definition(kind, name, encode_data(data)) if data is not None else b""
        else:
            data = decode_data(raw)
        self._apply(kind, name, data, record)

    def _apply(self, kind: str, name: str, data: dict | None, record: bytes) -> None:
        key = (kind, name)
        self.live_bytes -= len(self._records.get(key, b""))
        if data is None:
            self._records.pop(key, None)
            self._data.pop(key, None)
            return
        self._records[key] = record
        self._data[key] = data
        self.live_bytes += len(record)

    def of_kind(self, kind: str) -> list[dict]:
        return [data for (k, _), data in self._data.items() if k == kind]

    def items(self) -> list[tuple[str, str, dict]]:
        """Every live definition as (kind, name, data), in creation order."""
        return [(kind, name, data) for (kind, name), data in self._data.items()]

    def __contains__(self, key: tuple[str, str]) -> bool:
        """Whether a (kind, name) definition is live."""
        return key in self._data

    def snapshot(self, deleted_below: dict[str, int], needed_below: int) -> bytes:
        """The whole log's content as a fresh file: live definitions, then the watermarks that still matter."""
        watermarks = [
            records.queue_deleted(queue, below) for queue, below in deleted_below.items() if below > needed_below
        ]
        return b"".join(self._records.values()) + b"".join(watermarks)
