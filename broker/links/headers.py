"""Headers a link adds to the messages it moves."""

from __future__ import annotations

INVALID = "x-invalid-headers"  # where RabbitMQ keeps a header it had to replace


def prepend_table(headers: dict, name: str, table: dict) -> None:
    """Put table first in the array header name (RabbitMQ's rabbit_basic:prepend_table_header). A header of
    another type is kept in x-invalid-headers, under its name, in an array of such values (the latest first); an
    x-invalid-headers that is not a table itself is replaced, as RabbitMQ's set_invalid_header does."""
    earlier = headers.get(name)
    if earlier is not None and not isinstance(earlier, list):
        invalid = headers.get(INVALID)
        invalid = dict(invalid) if isinstance(invalid, dict) else {}
        kept = invalid.get(name)
        invalid[name] = [earlier, *(kept if isinstance(kept, list) else [])]
        headers[INVALID] = invalid
        earlier = None
    headers[name] = [table, *(earlier or [])]
