"""Durable definitions (exchanges, queues, bindings, vhosts, users, policies) and queue-deletion watermarks.

They live in their own small log, ``definitions.log``. When the log has grown well past the live state, the writer
replaces it by a snapshot (written aside, fsynced, renamed over).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

from storage import records

KINDS = ("exchange", "queue", "binding", "vhost", "user", "policy")

# AMQP field-table values JSON cannot hold are stored as one-key objects tagged with these keys.
_BYTES = "__warren_bytes__"
_DECIMAL = "__warren_decimal__"
_DATETIME = "__warren_datetime__"


def _encode_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, datetime.datetime):
        return {_DATETIME: value.isoformat()}
    raise TypeError(f"cannot store a {type(value).__name__} in a definition")


def _decode_object(obj: dict) -> Any:
    if len(obj) == 1:
        if _BYTES in obj:
            return base64.b64decode(obj[_BYTES])
        if _DECIMAL in obj:
            return decimal.Decimal(obj[_DECIMAL])
        if _DATETIME in obj:
            return datetime.datetime.fromisoformat(obj[_DATETIME])
    return obj


def encode_data(data: dict | None) -> bytes:
    if data is None:
        return b""
    return json.dumps(data, default=_encode_value, separators=(",", ":")).encode()


def decode_data(raw: bytes) -> dict | None:
    return json.loads(raw, object_hook=_decode_object) if raw else None


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

    def apply_recovered(self, kind: str, name: str, raw: bytes) -> None:
        data = decode_data(raw)
        self._apply(kind, name, data, records.definition(kind, name, raw) if data is not None else b"")

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

    def snapshot(self, deleted_below: dict[str, int], needed_below: int) -> bytes:
        """The whole log's content as a fresh file: live definitions, then the watermarks that still matter."""
        watermarks = [
            records.queue_deleted(queue, below) for queue, below in deleted_below.items() if below > needed_below
        ]
        return b"".join(self._records.values()) + b"".join(watermarks)
