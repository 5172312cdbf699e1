"""A management port that cannot serve the API says why, in RabbitMQ's shapes: 503 {"error": "service_unavailable",
"reason": ...}, or {"status": "failed", "reason": ...} for a health check. The API of a broker that has stopped
serving (a cluster leader stepping down) answers so while the console's static files are still served. A malformed
request costs one log line, never a traceback. Warren only: the broker and the listeners run in this process, in an
event loop of their own."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from broker.config import load_config
from broker.connection.server import Server
from broker.management.app import NOT_SERVING
from broker.management.server import ManagementServer, start_management
from tests.integration.helpers import beyond_rabbitmq
from tests.integration.management import request

pytestmark = beyond_rabbitmq

TIMEOUT = 10.0  # seconds for a listener to start or stop


class Listener(NamedTuple):
    """Where a management port listens, as tests.integration.management's request() takes it."""
    management_url: str


class LoopThread:
    """An event loop on a thread of its own, so that the tests' blocking HTTP clients can call listeners that run
    in this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


@pytest.fixture
def loop():
    thread = LoopThread()
    yield thread
    thread.close()


def unavailable(reason: str) -> tuple[int, dict]:
    return 503, {"error": "service_unavailable", "reason": reason}


def failed_check(reason: str) -> tuple[int, dict]:
    return 503, {"status": "failed", "reason": reason}


def raw_reply(port: int, data: bytes) -> bytes:
    """What the listener on port answers to data sent as it is (up to the connection's end)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def start_broker(loop: LoopThread, data_dir: Path) -> tuple[Server, ManagementServer]:
    """A broker on ephemeral loopback ports, and its management API."""
    async def start() -> tuple[Server, ManagementServer]:
        server = Server(load_config(None, {"host": "127.0.0.1", "port": 0, "data_dir": str(data_dir),
                                           "management_host": "127.0.0.1", "management_port": 0,
                                           "mqtt_port": 0}))
        await server.start()
        return server, await start_management(server)
    return loop.run(start())


def malformed_lines(caplog) -> int:
    return caplog.text.count("malformed HTTP request from 127.0.0.1")


MALFORMED = [
    b"GET /api/overview HTTP/1.1\r\nHost: x\r\na header line without a colon\r\n\r\n",
    b"GET /api/overview HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(64) + b"\r\n\r\n",  # a TLS hello on the plain port
]


# --- the API of a broker that has stopped serving ---------------------------------------------------------------
@pytest.fixture
def stepped_down(tmp_path, loop):
    """A broker whose management API still listens after the broker stopped, as a cluster leader's does while it
    steps down (the AMQP listener is closed: its port is gone)."""
    server, management = start_broker(loop, tmp_path / "data")
    api = Listener(f"http://127.0.0.1:{management.port}")
    assert request(api, "GET", "/api/overview").status == 200
    loop.run(server.stop(grace=0))
    yield api
    loop.run(management.stop())


@pytest.mark.parametrize("user", ["guest", None])
def test_the_api_of_a_broker_that_stopped_serving_answers_503(stepped_down, user, caplog):
    assert request(stepped_down, "GET", "/api/overview", user=user) == unavailable(NOT_SERVING)
    assert request(stepped_down, "GET", "/api/queues", user=user) == unavailable(NOT_SERVING)
    assert request(stepped_down, "PUT", "/api/queues/%2F/q", {"durable": True}, user=user) == unavailable(NOT_SERVING)
    assert request(stepped_down, "GET", "/api/health/checks/alarms", user=user) == failed_check(NOT_SERVING)
    assert request(stepped_down, "GET", "/api/health/checks/port-listener/5672", user=user) == \
        failed_check(NOT_SERVING)
    assert "Traceback" not in caplog.text and "Error handling request" not in caplog.text


def test_the_console_of_a_broker_that_stopped_serving_still_loads_and_shows_the_reason(stepped_down):
    for path in ("/", "/console/console.js"):
        with urllib.request.urlopen(stepped_down.management_url + path, timeout=TIMEOUT) as response:
            assert response.status == 200


# --- malformed requests -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", MALFORMED)
def test_a_malformed_request_to_the_api_costs_one_line_without_a_traceback(tmp_path, loop, data, caplog):
    caplog.set_level(logging.DEBUG, logger="broker.management.server")
    server, management = start_broker(loop, tmp_path / "data")
    try:
        assert raw_reply(management.port, data).startswith(b"HTTP/1.0 400 Bad Request\r\n")
        assert request(Listener(f"http://127.0.0.1:{management.port}"), "GET", "/api/overview").status == 200
    finally:
        loop.run(management.stop())
        loop.run(server.stop(grace=0))
    assert "Traceback" not in caplog.text and "Error handling request" not in caplog.text
    assert malformed_lines(caplog) == 1
