"""How log lines are written: text lines, or one JSON object per line for log shippers (``--log-format json``).

Either way a line is one line: names that clients and operators choose (vhosts, queues, exchanges, users, the
reply texts that quote them) may hold line breaks, NUL and other control characters, which are written escaped as
Python writes them in a string literal (\\r, \\n, \\x00, \\u2028), so that a name can neither split a line nor
forge one."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The characters that printable() escapes: the C0 and C1 controls, DEL, and the line and paragraph separators
# (everything str.splitlines() splits on is among them).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """text with each control character and line separator written as its escape (\\n, \\x00, \\u2028)."""
    return _UNPRINTABLE.sub(_escape, text)


def _escape(found: re.Match) -> str:
    return repr(found.group())[1:-1]


def _json_escape(found: re.Match) -> str:
    return f"\\u{ord(found.group()):04x}"


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT lines with the message made printable; a traceback, when there is one, follows on lines of its
    own as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601 with milliseconds), level, logger, message, and the
    traceback as ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if hasattr(record, "worker"):
            entry["worker"] = record.worker
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # json.dumps escapes the C0 controls; the C1 ones and the separators would stay as they are
        return _UNPRINTABLE.sub(_json_escape, json.dumps(entry, ensure_ascii=False))


def configure(level: str, log_format: str, worker: int | None = None) -> None:
    """Send every log line to standard error, at ``level`` and above, in ``log_format`` ("text" or "json"); a
    worker process's lines name it ("worker 1" before the logger's name, or a "worker" key)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(
        TEXT_FORMAT if worker is None else TEXT_FORMAT.replace("%(name)s", f"worker {worker} %(name)s")))
    if worker is not None:
        handler.addFilter(lambda record: setattr(record, "worker", worker) or True)
    logging.basicConfig(level=level.upper(), handlers=[handler])
