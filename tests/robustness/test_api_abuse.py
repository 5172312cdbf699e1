"""Every way a user of the management API (or anyone who can reach its port) was found to hurt the broker, all at
once against one broker: a logged-in AMQP client's publish -> get round trips stay under 50 ms at the 99th
percentile, a new AMQP connection still opens, and the log stays small and free of tracebacks.

The abuses: backtracking regular expressions in a listing filter and in a policy pattern that every later declare
runs, request bodies of tens of megabytes, half-sent headers (slowloris) and a thousand idle sockets, oversized
headers, failed logins, arguments nested 900 deep, malformed numbers and values, and concurrent per-object
scrapes of the Prometheus endpoint. Each attacker is a process of its own, so that it does not share the measuring
client's interpreter, and each stops after ATTACK_SECONDS."""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import os
import resource
import time

import pytest
from pamqp import commands

from tests.integration.management import quote, request, set_policy
from tests.integration.rawclient import RawClient
from tests.robustness.attackers import p99, stop_all

pytestmark = pytest.mark.alone  # it times AMQP round trips while the API is abused

ATTACK_SECONDS = 6.0
LATENCY_P99_BOUND = 0.05  # seconds; the broker answers a round trip in well under 1 ms when left alone
LOG_BOUND = 50_000  # bytes the broker may log about the whole attack
IDLE_SOCKETS = 1100  # past the 1,024 open files a process gets by default
SLOW_SOCKETS = 300  # sockets that send a request's headers a byte a second
RUN = "a" * 30  # (a+)+ backtracks 2**30 times on this run followed by a mismatch in a backtracking engine
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
WRONG = "Basic " + base64.b64encode(b"guest:wrong").decode()


async def http(host: str, port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None,
               authorization: str = GUEST) -> int:
    """One request on a connection of its own; its status (0 when the broker hung up without one)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                f"Content-Length: {len(body)}", f"Authorization: {authorization}",
                *(f"{name}: {value}" for name, value in (headers or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        return int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else 0
    except (OSError, asyncio.TimeoutError):
        return 0
    finally:
        writer.close()


JSON = {"Content-Type": "application/json"}


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def requests_that_once_hurt(host: str, port: int) -> list[tuple[str, str, bytes, dict, str]]:
    """(method, path, body, headers, authorization) of each abusive request, sent over and over."""
    queue = quote(f"abuse-{RUN}!")
    big = b'{"queues":[' + b",".join([b'{"name":"q","vhost":"/"}'] * 1_200_000) + b"]}"  # about 30 MB
    return [
        ("GET", f"/api/queues/%2F?name={quote('^abuse-(a+)+$')}&use_regex=true&page=1", b"", {}, GUEST),
        ("PUT", f"/api/queues/%2F/{queue}", b"{}", JSON, GUEST),  # runs the backtracking policy pattern
        ("POST", "/api/definitions", big, JSON, GUEST),
        ("GET", "/api/overview", b"", {"X-Padding": "x" * 9000}, ""),
        ("GET", "/api/whoami", b"", {}, WRONG),
        ("PUT", "/api/queues/%2F/abuse-deep", json.dumps({"arguments": nested(900)}).encode(), JSON, GUEST),
        ("PUT", "/api/queues/%2F/abuse-inf", b'{"arguments": {"x-max-length": 1e400}}', JSON, GUEST),
        ("POST", f"/api/queues/%2F/{queue}/get", b'{"count": 1, "ackmode": [], "encoding": "auto"}', JSON, GUEST),
        ("GET", "/api/queues?msg_rates_age=" + "9" * 400 + "&msg_rates_incr=1", b"", {}, GUEST),
        ("GET", "/api/definitions?download=a%0d%0aSet-Cookie:x", b"", {}, GUEST),
        ("GET", "/api/health/checks/certificate-expiration/" + "9" * 400 + "/days", b"", {}, GUEST),
        ("GET", "/api/health/checks/port-listener/%D9%A1%D9%A2", b"", {}, GUEST),
    ]


async def send_abusive_requests(host: str, port: int, deadline: float) -> None:
    abuses = requests_that_once_hurt(host, port)
    turn = 0
    while time.monotonic() < deadline:
        method, path, body, headers, authorization = abuses[turn % len(abuses)]
        await http(host, port, method, path, body, headers, authorization)
        turn += 1


async def hold_idle_sockets(host: str, port: int, deadline: float) -> None:
    sockets = []
    for _ in range(IDLE_SOCKETS):
        try:
            sockets.append(await asyncio.open_connection(host, port))
        except OSError:
            break  # refused or reset: the broker limits them, as it should
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    for _, writer in sockets:
        writer.close()


async def send_headers_slowly(host: str, port: int, deadline: float) -> None:
    async def one() -> None:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            return
        try:
            writer.write(b"GET /api/overview HTTP/1.1\r\n")
            while time.monotonic() < deadline and not writer.is_closing():
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(1)
        except OSError:
            pass
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(SLOW_SOCKETS)))


async def scrape(host: str, port: int, deadline: float) -> None:
    async def one() -> None:
        while time.monotonic() < deadline:
            await http(host, port, "GET", "/metrics/per-object", authorization="")

    await asyncio.gather(*(one() for _ in range(20)))


def attack(kind: str, host: str, port: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    deadline = time.monotonic() + ATTACK_SECONDS
    asyncio.run(ATTACKS[kind](host, port, deadline))


ATTACKS = {"requests": send_abusive_requests, "idle": hold_idle_sockets, "slow": send_headers_slowly,
           "scrape": scrape}


def publish_get_round_trip(client: RawClient, queue: str) -> float:
    started = time.perf_counter()
    client.publish(1, "", queue, b"ping")
    client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
    client.expect(commands.Basic.GetOk, channel=1)
    client.read_frame()  # the header
    client.read_frame()  # the body
    return time.perf_counter() - started


def test_abusing_the_api_every_known_way_at_once_leaves_amqp_fast(own_broker, unique):
    broker = own_broker()
    set_policy(broker, "/", "abuse", "^(a+)+$", {"max-length": 5}, apply_to="queues")
    set_policy(broker, "/", "abuse-prefixed", "^abuse-(a+)+$", {"max-length": 5}, apply_to="queues")
    for number in range(200):  # something for the per-object scrape to list
        assert request(broker, "PUT", f"/api/queues/%2F/abuse-listed-{number}", {}).status == 201
    log_before = len(broker.log())
    with RawClient.connect(broker) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=unique, exclusive=True))
        client.expect(commands.Queue.DeclareOk, channel=1)
        context = multiprocessing.get_context("spawn")
        attackers = [context.Process(target=attack, args=("requests", broker.host, broker.management_port)),
                     context.Process(target=attack, args=("idle", broker.host, broker.management_port)),
                     context.Process(target=attack, args=("slow", broker.host, broker.management_port)),
                     context.Process(target=attack, args=("scrape", broker.host, broker.prometheus_port))]
        for process in attackers:
            process.start()
        latencies = []
        opened_meanwhile = False
        halfway = time.monotonic() + ATTACK_SECONDS / 2  # the idle sockets are all open by then
        try:
            while any(process.is_alive() for process in attackers) and len(latencies) < 50_000:
                latencies.append(publish_get_round_trip(client, unique))
                if not opened_meanwhile and time.monotonic() > halfway:
                    with RawClient.connect(broker) as newcomer:  # the idle sockets must not use up descriptors
                        newcomer.handshake()
                        newcomer.close_connection()
                    opened_meanwhile = True
        finally:
            stop_all(attackers, ATTACK_SECONDS + 30)
        client.close_connection()
    slowest = p99(latencies)
    print(f"AMQP publish -> get under attack: p99 {slowest * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms over "
          f"{len(latencies)} round trips")
    assert slowest < LATENCY_P99_BOUND, f"p99 {slowest * 1000:.1f} ms over {len(latencies)} round trips"
    assert opened_meanwhile
    logged = broker.log()[log_before:]
    assert "Traceback" not in logged, logged[:3000]
    assert len(logged) < LOG_BOUND, f"{len(logged)} bytes logged, {logged.count(os.linesep)} lines"
