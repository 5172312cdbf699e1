"""Headers a link adds to the messages it moves."""

from __future__ import annotations


def prepend_table(headers: dict, name: str, table: dict) -> list:
    """Put table first in the array header name (RabbitMQ's rabbit_basic:prepend_table_header); a header of another
    type moves to x-invalid-headers. Returns the tables that were there before, in their order."""
    earlier = headers.get(name)
    if earlier is not None and not isinstance(earlier, list):
        headers["x-invalid-headers"] = {**(headers.get("x-invalid-headers") or {}), name: earlier}
        earlier = None
    headers[name] = [table, *(earlier or [])]
    return list(earlier or [])
