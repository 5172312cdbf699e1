"""The management API against clients that should not get what they ask: guest from another machine, a page of
another web site (a form, a DNS-rebinding page), bodies too large or not JSON, slow or idle sockets by the hundred,
password guessing, a blank password, malformed query values."""

from __future__ import annotations

import base64
import gzip
import json
import resource
import socket
import subprocess
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.management import add_user, quote, request
from tests.waiting import wait_for

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
TOO_LARGE = {"error": "bad_request", "reason": "Exceeded HTTP request body size limit"}  # RabbitMQ's


def configured(own_broker, tmp_path: Path, text: str):
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return own_broker("--config", str(path))


def raw_request(host: str, port: int, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[bytes, float]:
    """Send head (request line and headers, CRLF-separated, without the blank line) and body on a connection of its
    own; the reply's bytes until the broker closes or stops sending, and the seconds it took to come."""
    with socket.create_connection((host, port), timeout=timeout) as connection:
        started = time.monotonic()
        connection.sendall(head.encode() + b"\r\n\r\n" + body)
        reply = b""
        try:
            while chunk := connection.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply and _complete(reply):
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return reply, time.monotonic() - started


def _complete(reply: bytes) -> bool:
    head, _, body = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status_and_body(reply: bytes) -> tuple[int, object]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), (json.loads(body) if body else None)


def non_loopback_address() -> str | None:
    """An IPv4 address of one of this machine's interfaces that is not loopback, if it has one."""
    try:
        lines = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return None
    for line in lines.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


# --- loopback_users -------------------------------------------------------------------------------------------
def test_guest_is_refused_from_another_address_as_rabbitmq_does(own_broker, tmp_path):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to reach the API from")
    broker = configured(own_broker, tmp_path, '[management]\nhost = "0.0.0.0"\n')
    head = f"GET /api/whoami HTTP/1.1\r\nHost: {address}\r\nAuthorization: {GUEST}\r\nConnection: close"
    reply, _ = raw_request(address, broker.management_port, head)
    assert status_and_body(reply) == (401, {"error": "not_authorised", "reason": "User can only log in via localhost"})
    reply = request(broker, "PUT", "/api/users/intruder", {"password": "x", "tags": "administrator"})
    assert reply.status == 201  # from this machine guest still may
    user = "Basic " + base64.b64encode(b"intruder:x").decode()
    reply, _ = raw_request(address, broker.management_port,
                           f"GET /api/whoami HTTP/1.1\r\nHost: {address}\r\nAuthorization: {user}\r\nConnection: close")
    assert status_and_body(reply) == (200, {"name": "intruder", "tags": ["administrator"]})


# --- blank passwords ------------------------------------------------------------------------------------------
def test_a_user_with_a_blank_password_logs_in_neither_to_the_api_nor_over_amqp(broker, unique):
    add_user(broker, unique, "", "administrator")
    try:
        assert request(broker, "GET", "/api/whoami", user=unique, password="").body == {
            "error": "not_authorized", "reason": "Login failed"}
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                broker.host, broker.port, credentials=pika.PlainCredentials(unique, ""), connection_attempts=1))
    finally:
        request(broker, "DELETE", f"/api/users/{quote(unique)}")


# --- bodies ---------------------------------------------------------------------------------------------------
def test_a_body_past_max_body_size_is_refused_before_it_is_sent(own_broker, tmp_path):
    broker = configured(own_broker, tmp_path, "[management]\nmax_body_size = 1000\n")
    head = (f"PUT /api/vhosts/big HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {GUEST}\r\n"
            "Content-Type: application/json\r\nContent-Length: 5000000")
    reply, _ = raw_request(broker.host, broker.management_port, head)  # the body is never sent
    assert status_and_body(reply) == (400, TOO_LARGE)
    body = json.dumps({"description": "x" * 2000}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    head = (f"PUT /api/vhosts/big HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {GUEST}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close")
    reply, _ = raw_request(broker.host, broker.management_port, head, chunked)
    assert status_and_body(reply) == (400, TOO_LARGE)
    assert request(broker, "PUT", "/api/vhosts/small", {"description": "x" * 500}).status == 201
    assert request(broker, "GET", "/api/vhosts/big").status == 404


def test_credentials_and_rights_are_checked_before_a_body_is_read(broker, unique):
    add_user(broker, unique, "pw", "management")
    try:
        for authorization, expected in (
                ("", (401, None)),
                ("Basic " + base64.b64encode(b"guest:wrong").decode(),
                 (401, {"error": "not_authorized", "reason": "Login failed"})),
                ("Basic " + base64.b64encode(f"{unique}:pw".encode()).decode(),
                 (401, {"error": "not_authorised", "reason": "Not administrator user"}))):
            head = (f"PUT /api/users/{unique}-new HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: 9000000" + (f"\r\nAuthorization: {authorization}" if authorization else ""))
            reply, _ = raw_request(broker.host, broker.management_port, head)  # the 9 MB body is never sent
            assert status_and_body(reply) == expected
    finally:
        request(broker, "DELETE", f"/api/users/{quote(unique)}")


@pytest.mark.parametrize("literal", ["1e400", "NaN", "-Infinity"])
def test_numbers_json_cannot_carry_are_refused_as_rabbitmq_does(broker, unique, literal):
    reply = request(broker, "PUT", f"/api/vhosts/{quote(unique)}", raw_body=f'{{"description": {literal}}}'.encode())
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "not_json"})
    assert request(broker, "GET", f"/api/vhosts/{quote(unique)}").status == 404


def gzipped(body: bytes, layers: int) -> bytes:
    for _ in range(layers):
        body = gzip.compress(body)
    return body


@pytest.mark.parametrize("layers", [1, 2], ids=["gzip", "gzip-of-gzip"])
def test_a_compressed_body_is_read_as_sent_as_rabbitmq_reads_it(broker, unique, layers):
    """RabbitMQ's API does not decompress a body: a gzip is not JSON, whatever its Content-Encoding says."""
    reply = request(broker, "PUT", f"/api/queues/%2F/{quote(unique)}", headers={"Content-Encoding": "gzip"},
                    raw_body=gzipped(json.dumps({"durable": True}).encode(), layers))
    assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "not_json"})
    assert request(broker, "GET", f"/api/queues/%2F/{quote(unique)}").status == 404


def open_descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_compressed_bodies_through_the_workers_api_are_answered_and_leave_no_descriptor(own_broker):
    """The supervisor forwards a body as the client sent it: each worker reads it as one process does."""
    broker = own_broker("--workers", "2")
    assert request(broker, "GET", "/api/overview").status == 200
    before = open_descriptors(broker.process.pid)
    for index in range(5):
        reply = request(broker, "PUT", f"/api/users/gzip-{index}", headers={"Content-Encoding": "gzip"},
                        raw_body=gzipped(json.dumps({"password": "x", "tags": ""}).encode(), 2), timeout=10)
        assert (reply.status, reply.body) == (400, {"error": "bad_request", "reason": "not_json"})
    assert request(broker, "GET", "/api/users/gzip-0").status == 404
    # each forward's socket is closed once its answer is read
    wait_for(lambda: open_descriptors(broker.process.pid) <= before, 5, "the descriptors back to as many as before",
             0.05)


# --- other web sites -------------------------------------------------------------------------------------------
FORMS = [  # what a form or a simple fetch() of another site can send
    ("POST", "/api/definitions", "multipart/form-data; boundary=b",
     b'--b\r\nContent-Disposition: form-data; name="file"; filename="d.json"\r\n\r\n'
     b'{"users": [{"name": "csrf", "password": "x", "tags": "administrator"}]}\r\n--b--\r\n'),
    ("POST", "/api/exchanges/%2F/amq.default/publish", "text/plain",
     b'{"routing_key": "q", "payload": "x", "payload_encoding": "string", "properties": {}}'),
    ("POST", "/api/definitions", "application/x-www-form-urlencoded",
     b'{"users": [{"name": "csrf", "password": "x", "tags": "administrator"}]}'),
]


@pytest.mark.parametrize("method, path, content_type, body", FORMS)
def test_a_body_that_is_not_json_is_refused_with_415(broker, method, path, content_type, body):
    reply = request(broker, method, path, raw_body=body, headers={"Content-Type": content_type})
    assert reply.status == 415
    assert reply.body["error"] == "unsupported_media_type"
    assert "application/json" in reply.body["reason"]
    assert request(broker, "GET", "/api/users/csrf").status == 404


def test_a_request_from_a_page_of_another_origin_is_refused(broker):
    reply = request(broker, "POST", "/api/definitions", {"users": [{"name": "csrf", "password": "x", "tags": ""}]},
                    headers={"Origin": "http://evil.example.net"})
    assert reply.status == 403
    assert request(broker, "GET", "/api/users/csrf").status == 404
    own = f"http://127.0.0.1:{broker.management_port}"
    assert request(broker, "GET", "/api/whoami", headers={"Origin": own}).status == 200


@pytest.mark.parametrize("host, allowed", [("evil.example.net", False), ("localhost", True),
                                           (socket.gethostname(), True), ("broker.example.com", True)])
def test_the_host_header_must_name_this_machine_or_a_configured_name(own_broker, tmp_path, host, allowed):
    """A DNS-rebinding page reaches the loopback API under its own name: refused, whatever the credentials."""
    broker = configured(own_broker, tmp_path, '[management]\nhostnames = ["broker.example.com"]\n')
    reply = request(broker, "GET", "/api/whoami", headers={"Host": f"{host}:{broker.management_port}"})
    assert reply.status == (200 if allowed else 403)
    if not allowed:
        assert reply.body["error"] == "forbidden"


def test_replies_carry_headers_that_keep_them_out_of_frames_caches_and_sniffing(broker):
    for path in ("/api/overview", "/"):
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {GUEST}\r\nConnection: close"
        reply, _ = raw_request(broker.host, broker.management_port, head)
        headers = {line.split(b":")[0].lower(): line.partition(b":")[2].strip()
                   for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]}
        assert headers[b"x-frame-options"] == b"DENY"
        assert headers[b"x-content-type-options"] == b"nosniff"
        assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
        assert (headers.get(b"cache-control") == b"no-store") is path.startswith("/api/")


# --- sockets --------------------------------------------------------------------------------------------------
def test_headers_that_do_not_arrive_within_5_s_get_408_as_from_rabbitmq(broker):
    with socket.create_connection((broker.host, broker.management_port), timeout=15) as slow, \
            socket.create_connection((broker.host, broker.management_port), timeout=15) as silent:
        started = time.monotonic()
        slow.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        reply = slow.recv(1000)
        assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert slow.recv(1000) == b""
        assert 4.5 < time.monotonic() - started < 8
        assert silent.recv(1000) == b""  # nothing sent: closed without a word


def test_connections_past_max_connections_are_answered_503_at_once(own_broker, tmp_path):
    broker = configured(own_broker, tmp_path, "[management]\nmax_connections = 3\n")
    held = [socket.create_connection((broker.host, broker.management_port)) for _ in range(3)]
    try:
        reply, took = raw_request(broker.host, broker.management_port, "GET /api/overview HTTP/1.1\r\nHost: x")
        assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and took < 2
    finally:
        held.pop().close()
    # the freed slot is given back once it closes
    wait_for(lambda: request(broker, "GET", "/api/whoami").status == 200, 10, "a request answered in the freed slot", 0)
    for connection in held:
        connection.close()


def test_the_open_files_limit_is_raised_to_the_hard_limit_and_logged(own_broker):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    broker = own_broker()
    limits = Path(f"/proc/{broker.process.pid}/limits").read_text()
    [line] = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3] == str(hard)
    assert f"open files limit: {hard}" in broker.log()


# --- failed logins, logs, query values ------------------------------------------------------------------------
@pytest.mark.alone
def test_failed_api_logins_are_answered_more_and_more_slowly(own_broker, tmp_path):
    broker = configured(own_broker, tmp_path, "[amqp]\nfailed_login_delay = 0.3\n")
    took = []
    for _ in range(3):
        started = time.monotonic()
        assert request(broker, "GET", "/api/whoami", password="wrong").status == 401
        took.append(time.monotonic() - started)
    assert took[0] < 0.3 and 0.3 <= took[1] and 0.6 <= took[2]
    assert request(broker, "GET", "/api/whoami").status == 200  # a success starts the address over
    started = time.monotonic()
    assert request(broker, "GET", "/api/whoami", password="wrong").status == 401
    assert time.monotonic() - started < 0.3


def test_oversized_headers_log_a_few_lines_without_a_traceback(own_broker):
    broker = own_broker()
    before = len(broker.log())
    for _ in range(200):
        reply, _ = raw_request(broker.host, broker.management_port,
                               f"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Padding: {'x' * 9000}")
        assert reply.startswith(b"HTTP/1.")
    assert request(broker, "GET", "/api/whoami").status == 200
    logged = broker.log()[before:]
    assert "Traceback" not in logged
    assert logged.count("malformed HTTP request") <= 50 and len(logged) < 20_000


@pytest.mark.parametrize("query, status", [
    ("msg_rates_age=%C2%B2&msg_rates_incr=5", 200), ("msg_rates_age=%D9%A1%D9%A2&msg_rates_incr=5", 200),
    ("msg_rates_age=60&msg_rates_incr=" + "9" * 400, 200), ("msg_rates_age=" + "9" * 400 + "&msg_rates_incr=1", 400),
    ("msg_rates_age=0&msg_rates_incr=5", 400), ("msg_rates_age=60&msg_rates_incr=5", 200),
])
def test_rates_periods_are_read_as_rabbitmq_reads_them(broker, query, status):
    reply = request(broker, "GET", f"/api/overview?{query}")
    assert reply.status == status
    if status == 400:
        assert reply.body["reason"].startswith("Invalid range parameters: age ")


def test_a_download_name_with_a_line_break_cannot_add_a_header(broker):
    head = (f"GET /api/definitions?download=a%0d%0aSet-Cookie:%20x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: {GUEST}\r\nConnection: close")
    reply, _ = raw_request(broker.host, broker.management_port, head)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nSet-Cookie" not in reply.partition(b"\r\n\r\n")[0]
