"""A small client of the management HTTP API for tests: the same calls work against Warren and RabbitMQ."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, NamedTuple

import pika

from tests import waiting


class Reply(NamedTuple):
    status: int
    body: Any  # the decoded JSON body, the raw text when it is not JSON, or None when empty


def quote(name: str) -> str:
    """A vhost or object name as one path segment ('/' becomes %2F, as the API expects)."""
    return urllib.parse.quote(name, safe="")


def request(broker: Any, method: str, path: str, body: Any = None, user: str = "guest", password: str = "guest",
            timeout: float = 10.0, raw_body: bytes | None = None, headers: dict | None = None) -> Reply:
    """Send one request to broker's management API (path starts with /api/) and return its reply; an HTTP error
    status is returned, not raised. user=None sends no credentials. A body goes as JSON unless headers name another
    Content-Type."""
    data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else None)
    headers = {name.lower(): value for name, value in (headers or {}).items()}
    if data is not None:
        headers.setdefault("content-type", "application/json")  # as the console, warrenctl and rabbitmqadmin send
    if user is not None:
        headers["authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    call = urllib.request.Request(broker.management_url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=timeout) as response:
            return Reply(response.status, _decoded(response.read()))
    except urllib.error.HTTPError as error:
        return Reply(error.code, _decoded(error.read()))


def _decoded(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def add_user(broker: Any, name: str, password: str, tags: str = "") -> None:
    reply = request(broker, "PUT", f"/api/users/{quote(name)}", {"password": password, "tags": tags})
    assert reply.status in (201, 204), reply


def delete_user(broker: Any, name: str) -> None:
    request(broker, "DELETE", f"/api/users/{quote(name)}")


def add_vhost(broker: Any, name: str) -> None:
    reply = request(broker, "PUT", f"/api/vhosts/{quote(name)}")
    assert reply.status in (201, 204), reply


def delete_vhost(broker: Any, name: str) -> None:
    request(broker, "DELETE", f"/api/vhosts/{quote(name)}")


def set_permissions(broker: Any, vhost: str, user: str, configure: str = ".*", write: str = ".*",
                    read: str = ".*") -> None:
    reply = request(broker, "PUT", f"/api/permissions/{quote(vhost)}/{quote(user)}",
                    {"configure": configure, "write": write, "read": read})
    assert reply.status in (201, 204), reply


def set_topic_permissions(broker: Any, vhost: str, user: str, exchange: str = "amq.topic", write: str = ".*",
                          read: str = ".*") -> None:
    reply = request(broker, "PUT", f"/api/topic-permissions/{quote(vhost)}/{quote(user)}",
                    {"exchange": exchange, "write": write, "read": read})
    assert reply.status in (201, 204), reply


def set_policy(broker: Any, vhost: str, name: str, pattern: str, definition: dict, priority: int = 0,
               apply_to: str = "all", kind: str = "policies") -> None:
    """kind "operator-policies" sets an operator policy."""
    reply = request(broker, "PUT", f"/api/{kind}/{quote(vhost)}/{quote(name)}",
                    {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to})
    assert reply.status in (201, 204), reply


def clear_policy(broker: Any, vhost: str, name: str, kind: str = "policies") -> None:
    request(broker, "DELETE", f"/api/{kind}/{quote(vhost)}/{quote(name)}")


def connect_as(broker: Any, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    """A pika connection to the broker as user, in vhost."""
    return pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.port, vhost, pika.PlainCredentials(user, password)))


def wait_for(broker: Any, path: str, condition: Callable[[Any], bool], timeout: float = 30.0) -> Any:
    """GET path until condition holds for its body (RabbitMQ lists connections, channels and consumers only after
    its next statistics emission, every 5 s); fail after timeout seconds."""
    return waiting.wait_for(lambda: request(broker, "GET", path), timeout, f"GET {path} satisfying the condition", 0.1,
                            until=lambda reply: reply.status == 200 and condition(reply.body)).body


def wait_for_api(broker: Any, timeout: float = 30.0) -> None:
    """Wait until broker's API answers GET /api/overview with 200 (a Warren's starts listening just after the AMQP
    port; RabbitMQ's answers a while after its port opens)."""
    wait_for(broker, "/api/overview", lambda _: True, timeout)
