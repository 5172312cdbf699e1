"""rabbitmqctl's output formats: tab-separated tables with a header row, or JSON (one object per line)."""

from __future__ import annotations

import json
from typing import Any, TextIO


def table(columns: list[str], rows: list[list[Any]], headers: bool, out: TextIO) -> None:
    """Tab-separated rows under a header row; nothing at all when there are no rows (as rabbitmqctl)."""
    if not rows:
        return
    if headers:
        out.write("\t".join(columns) + "\n")
    for row in rows:
        out.write("\t".join(cell(value) for value in row) + "\n")


def json_rows(columns: list[str], rows: list[list[Any]], out: TextIO) -> None:
    """rabbitmqctl's --formatter json: a JSON array with one compact object per line."""
    out.write("[\n")
    for index, row in enumerate(rows):
        out.write(("," if index else "") + compact(dict(zip(columns, row))) + "\n")
    out.write("]\n")


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def cell(value: Any) -> str:
    """One table cell as rabbitmqctl prints it: true/false, [a, b] for a list of names, Erlang-like tables."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "[" + ", ".join(value) + "]"
    return _term(value)


def _term(value: Any) -> str:
    """A nested value as rabbitmqctl prints a table: [{"key",value},...], strings quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "undefined"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "[" + ",".join("{" + json.dumps(key) + "," + _term(item) + "}" for key, item in value.items()) + "]"
    if isinstance(value, list):
        return "[" + ",".join(_term(item) for item in value) + "]"
    return str(value)
