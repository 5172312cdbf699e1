"""A small client of the management HTTP API (stdlib only): JSON in, JSON out, failures as CommandError."""

from __future__ import annotations

import base64
import html
import http.client
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from warrenctl.errors import EX_DATAERR, EX_NOPERM, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, CommandError


def quote(name: str) -> str:
    """A vhost or object name as one path segment ('/' becomes %2F, as the API expects)."""
    return urllib.parse.quote(name, safe="")


class NotFound(CommandError):
    """The API answered 404: a verb that knows what is missing says so; otherwise the path is unknown to the API."""

    def __init__(self, base_url: str, path: str) -> None:
        super().__init__(f"the management API at {base_url} has no {path}", EX_UNAVAILABLE)


class Client:
    """Talks to one management API as one user."""

    def __init__(self, base_url: str, username: str, password: str, timeout: float,
                 cacert: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")  # e.g. http://127.0.0.1:15672
        self.timeout = timeout  # seconds to wait for each answer
        credentials = base64.b64encode(f"{username}:{password}".encode()).decode()
        self.authorization = f"Basic {credentials}"  # the same header on every request
        try:  # (an https API's certificate is checked against the system's CAs, and cacert's)
            self.tls = ssl.create_default_context(cafile=cacert)
        except (OSError, ssl.SSLError) as error:
            raise CommandError(f"cannot read the CA certificates of --cacert {cacert}: {error}", EX_DATAERR) from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def put(self, path: str, body: Any = None) -> Any:
        return self.request("PUT", path, {} if body is None else body)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.request("DELETE", path, headers=headers)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        """Send one request (path starts with /api/) and return its decoded JSON body (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        sent = {"authorization": self.authorization, **(headers or {})}
        if data is not None:
            sent["content-type"] = "application/json"
        call = urllib.request.Request(self.base_url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(call, timeout=self.timeout, context=self.tls) as response:
                return _decoded(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                raise NotFound(self.base_url, path) from None
            raise _refusal(error.code, _error_body(error.read())) from None
        except (socket.timeout, TimeoutError):
            raise CommandError(f"no answer from {self.base_url} within {self.timeout:g} s", EX_TEMPFAIL) from None
        except http.client.RemoteDisconnected:  # (what an HTTPS port does with plain HTTP)
            hint = " (if it takes HTTPS, give an https:// URL: $WARREN_MANAGEMENT_URL)" \
                if self.base_url.startswith("http://") else ""
            raise CommandError(f"the management API at {self.base_url} closed the connection without an "
                               f"answer{hint}", EX_UNAVAILABLE) from None
        except urllib.error.URLError as error:
            raise CommandError(f"cannot reach the management API at {self.base_url}: {_reason(error)}",
                               EX_UNAVAILABLE) from None
        except (OSError, ValueError) as error:  # a reset mid-answer, a body that is not JSON
            raise CommandError(f"bad answer from the management API at {self.base_url}: {error}",
                               EX_UNAVAILABLE) from None


def _decoded(raw: bytes) -> Any:
    return json.loads(raw) if raw.strip() else None


def _error_body(raw: bytes) -> Any:
    """An error's body: RabbitMQ's {"error": ..., "reason": ...}, or whatever text a proxy put there."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _reason(error: urllib.error.URLError) -> str:
    reason = error.reason
    return getattr(reason, "strerror", None) or str(reason)


def _readable(reason: Any) -> Any:
    """An Erlang term as the API encodes it, with its strings (lists of character codes) turned back to text."""
    if isinstance(reason, list):
        if reason and all(isinstance(item, int) and 32 <= item < 127 for item in reason):
            return "".join(map(chr, reason))
        return [_readable(item) for item in reason]
    return reason


def _refusal(status: int, body: Any) -> CommandError:
    """The CommandError for an HTTP error status other than 404, with the broker's reason when it gave one."""
    reason = body.get("reason") if isinstance(body, dict) else body
    text = html.unescape(reason if isinstance(reason, str) else json.dumps(_readable(reason))).strip()
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if status in (401, 403):  # "Login failed", or a user whose tags do not allow the call
        return CommandError(f"refused by the management API: {text}", EX_NOPERM)
    if status == 400:
        return CommandError(text, EX_DATAERR)
    return CommandError(f"the management API answered {status}: {text}", EX_SOFTWARE)
