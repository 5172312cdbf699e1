"""Requests one management API forwards to another, written and read here: to a worker's internal socket (from its
node's public API, broker.workers.api), or to another node's management port, signed with the cluster's secret.
The node that took the request has checked its Host and Origin (broker.management.guards); what answers checks the
credentials, and says how they fared (http.LOGIN_OUTCOME).

The other node checks the signature (signed_by_another_node) before it believes the client's address the request
carries (http.FORWARDED_CLIENT). The signature covers the request's method, path, client and credentials, the
address it is sent to, a time and a random part; each is taken once, within SIGNED_FOR of its time, so that a
request seen on the network cannot be sent again to the process that took it, nor to another address. A request
forwarded this way answers as soon as its receiver has decided (a refused login, a body too large), however much of
the body the client has still to send, as the API of one process answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import hmac
import ipaddress
import json
import logging
import re
import secrets
import ssl
import time
from typing import AsyncIterator, Callable, Protocol

from aiohttp import web
from multidict import CIMultiDict

from broker.connection.peer_log import PeerLog
from broker.management import http

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # refused requests of other nodes, a few lines a second per node at most

Body = bytes | AsyncIterator[bytes] | None  # what a forwarded request carries

# A request one clustered node's API forwards to another's, for what leads a group there (its worker that does, or
# the node itself when it runs no workers): the group, and an HMAC of the request with the cluster's secret
GROUP = "X-Warren-Group"
SIGNATURE = "X-Warren-Signature"
SIGNED = "X-Warren-Signed"  # when the request was signed, and a random part: "<unix seconds>.<hex>"
NODE_ITSELF = "node"  # GROUP's value for a request of the node's own entries in /api/nodes
LEADERS_GROUP = 0  # GROUP's value for a request to the leader of a cluster of one-process nodes (its only group)
SIGNED_FOR = 300  # seconds a signature is taken either side of its time: the nodes' clocks may differ that much
SIGNED_STAMP = re.compile(r"([0-9]{1,12})\.[0-9a-f]{16}")  # SIGNED's value
MAX_SEEN = 100_000  # signatures remembered at most (about 10 MB): past that, other nodes' requests wait their expiry
CONNECT_TIMEOUT = 5.0  # seconds another node's API has to accept a forwarded request
ANSWER_TIMEOUT = 120.0  # seconds it has to answer one (an import of a large definitions file takes a while)
ENTRY_TIMEOUT = 5.0  # seconds it has to give its own entries in /api/nodes


def signature(secret: str, group: int | str, method: str, path_qs: str, client: str, check_only: bool,
              signed: str, authorization: str, to: str) -> str:
    """``to``: the address the request is sent to (address_text), so that it is taken there alone."""
    message = "\n".join((str(group), method, path_qs, client, "check" if check_only else "apply", signed,
                         authorization, to))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def address_text(address: tuple) -> str:
    """A socket's address as host:port ([host]:port for IPv6), an IPv4 address in IPv6 (::ffff:a.b.c.d) as the IPv4
    address it is: what one node signs as where a request goes, and the other checks as its own socket's."""
    host = address[0]
    try:
        parsed = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        parsed = None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        host = str(parsed.ipv4_mapped)
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


class SeenSignatures:
    """The signatures taken within SIGNED_FOR: one seen again is a request sent again, not by a node."""

    def __init__(self, limit: int = MAX_SEEN) -> None:
        self.limit = limit
        self.seen: set[str] = set()
        self.expiring: list[tuple[float, str]] = []  # a heap of (when it may be forgotten, signature)

    def take(self, signed: str, until: float, now: float) -> str:
        """"new" (it is remembered until ``until``), "again", or "full" (it cannot be remembered now); ``now``:
        time.time(), as its caller read it."""
        while self.expiring and self.expiring[0][0] < now:
            self.seen.discard(heapq.heappop(self.expiring)[1])
        if signed in self.seen:
            return "again"
        if len(self.seen) >= self.limit:
            return "full"
        self.seen.add(signed)
        heapq.heappush(self.expiring, (until, signed))
        return "new"


SEEN = SeenSignatures()  # this process's: one process checks the requests of other nodes (an API's, a gateway's)


async def streamed(request: web.Request, kept: bytearray | None = None) -> AsyncIterator[bytes]:
    """The request's body as the API it is forwarded to reads it (which refuses a body too large, or a request it
    does not authorise, before reading it, as the API of one process does); kept gets a copy when given."""
    async for chunk in request.content.iter_any():
        if kept is not None:
            kept += chunk
        yield chunk


def body_of(request: web.Request, kept: bytearray | None = None) -> Body:
    return streamed(request, kept) if request.can_read_body else None


class Answer:
    """The answer to a forwarded request."""

    def __init__(self, status: int, headers: CIMultiDict, body: bytes, head_length: str | None = None):
        self.status = status
        self.headers = headers
        self.body = body
        self.head_length = head_length  # a HEAD answer's Content-Length: the length its GET would have

    def json(self):
        return json.loads(self.body)

    def response(self) -> web.Response:
        response = web.Response(status=self.status, body=self.body, headers=self.headers)
        if self.head_length is not None:
            response.headers["Content-Length"] = self.head_length
        return response


class OtherNodes(Protocol):
    """What the API of a node of a cluster of one-process nodes knows of the other nodes (cluster.api)."""

    started: float  # time.monotonic() when this node started: its uptime, whether it leads or follows

    def secret(self) -> str:
        """The cluster's secret, which signs the requests between nodes ("" until this node has learnt it)."""

    async def entries(self, request: web.Request) -> list[dict]:
        """The other nodes' entries in /api/nodes, each asked for its own (a node that does not answer is left
        out, as with workers)."""


class ApiClient:
    """Forwards requests to other APIs: a worker's internal socket, or another node's management port."""

    def __init__(self, secret: Callable[[], str | None], other_nodes: ssl.SSLContext | None = None) -> None:
        self.secret = secret  # the cluster's secret, which signs a request to another node (None: not learnt yet)
        self.other_nodes = other_nodes  # TLS towards the other nodes' APIs (other_nodes_context)

    async def ask_at(self, target: str | tuple[str, int], group: int | str, request: web.Request, body: Body = None,
                     path_qs: str | None = None, check_only: bool = False, client: str | None = None,
                     method: str | None = None) -> Answer:
        """The answer at target: a worker's internal socket, or another node's API (host, port), asked for what leads
        ``group`` there (or with NODE_ITSELF, for that node's own entries in /api/nodes); with ``method``, asked
        with it rather than the request's (a GET of another node's entries, for a HEAD)."""
        client = request.remote or "" if client is None else client
        method = method or request.method
        path_qs = path_qs or request.raw_path
        to_node = not isinstance(target, str)
        who = f"the node at {target[0]}:{target[1]}" if to_node else f"worker {group}"
        limit = None if not to_node else ENTRY_TIMEOUT if group == NODE_ITSELF else ANSWER_TIMEOUT
        try:
            secret = self.secret() if to_node else ""
            if to_node and not secret:
                raise ConnectionError("this node has not learnt the cluster's secret from etcd yet")
            async with asyncio.timeout(CONNECT_TIMEOUT if to_node else None):
                if isinstance(target, str):
                    reader, writer = await asyncio.open_unix_connection(target)
                else:
                    reader, writer = await asyncio.open_connection(*target, ssl=self.other_nodes)
        except OSError as error:  # (TimeoutError included: nothing was sent)
            return unavailable(who, request, error)
        node = address_text(writer.get_extra_info("peername")) if to_node else None
        head = self._head(request, method, body, path_qs, check_only, client, node)
        if node is not None:
            head = head[:-2] + self._signature(secret, group, method, path_qs, check_only, client, request,
                                               node) + b"\r\n"
        try:
            async with asyncio.timeout(limit):
                writer.write(head)
                sending = asyncio.ensure_future(self._send(writer, body, request.content_length is None))
                try:
                    answer = await read_answer(reader, method)
                finally:
                    sending.cancel()
            login = answer.headers.popall(http.LOGIN_OUTCOME, [])
            if login and request.get(http.LOGIN) != "refused":  # (one worker's refusal is the request's)
                request[http.LOGIN] = login[0]
            return answer
        except TimeoutError:
            return timed_out(who, request, limit or 0)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            return unavailable(who, request, error)
        finally:
            writer.close()

    @staticmethod
    def _signature(secret: str, group: int | str, method: str, path_qs: str, check_only: bool, client: str,
                   request: web.Request, to: str) -> bytes:
        """The headers that make another node's API, at ``to``, take a request as this node's, for what leads
        ``group`` there (or NODE_ITSELF)."""
        signed = f"{int(time.time())}.{secrets.token_hex(8)}"
        signed_with = signature(secret, group, method, path_qs, client, check_only, signed,
                                request.headers.get("Authorization", ""), to)
        return f"{GROUP}: {group}\r\n{SIGNED}: {signed}\r\n{SIGNATURE}: {signed_with}\r\n".encode()

    @staticmethod
    def _head(request: web.Request, method: str, body: Body, path_qs: str, check_only: bool, client: str,
              node: str | None = None) -> bytes:
        """The request line and headers: the client's own (the Host, the credentials, the body's length), and the
        client's address. Not the client's Expect: this listener has answered it, and the body follows at once. To
        another node (its socket's address, as node), not the client's Host nor its Origin: they name this node,
        which checked them; the Host is that node's address instead."""
        lines = [f"{method} {path_qs} HTTP/1.1".encode()]
        dropped = (b"connection", b"keep-alive", b"expect", *((b"host", b"origin") if node is not None else ()))
        if node is not None:
            lines.append(f"Host: {node}".encode())
        for name, value in request.raw_headers:
            lowered = name.lower()
            if lowered.startswith(b"x-warren-") or lowered in dropped:
                continue
            if isinstance(body, bytes) and lowered in (b"content-length", b"transfer-encoding"):
                continue
            lines.append(name + b": " + value)
        if isinstance(body, bytes):
            lines.append(b"Content-Length: %d" % len(body))
        lines.append(f"{http.FORWARDED_CLIENT}: {client}".encode())
        if check_only:
            lines.append(f"{http.CHECK_ONLY}: 1".encode())
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, body: Body, chunked: bool) -> None:
        try:
            if isinstance(body, bytes):
                writer.write(body)
            elif body is not None:
                async for chunk in body:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await writer.drain()
                if chunked:
                    writer.write(b"0\r\n\r\n")
            await writer.drain()
        except OSError:
            pass  # the other end answered before it read the whole body, and closed


async def read_answer(reader: asyncio.StreamReader, method: str) -> Answer:
    """An HTTP/1.1 response from a worker's API (its status, headers and body), after any interim (1xx) ones."""
    status = 100
    while 100 <= status < 200:
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
    headers = CIMultiDict(line.split(": ", 1) for line in header_lines)
    head_length = headers.get("Content-Length") if method == "HEAD" else None
    if method == "HEAD" or status in (204, 304):
        body = b""
    elif headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        body = b"".join(parts)
    elif "Content-Length" in headers:
        body = await reader.readexactly(int(headers["Content-Length"]))
    else:
        body = await reader.read()
    for name in ("Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Date", "Server"):
        headers.popall(name, None)
    return Answer(status, headers, body, head_length)


def unavailable(who: str, request: web.Request, error: Exception) -> Answer:
    """who: "worker N", or another node"""
    log.warning("%s did not answer %s %.200s: %s", who, request.method, request.path,
                "it did not accept the connection in time" if isinstance(error, TimeoutError) else error)
    return Answer(503, CIMultiDict({"Content-Type": "application/json"}), json.dumps(
        {"error": "service_unavailable", "reason": f"{who} is starting or stopping"}).encode())


def timed_out(who: str, request: web.Request, limit: float) -> Answer:
    """504: another node took the request but did not answer it within ``limit`` seconds (it may have applied it)."""
    log.warning("%s did not answer %s %.200s within %g s", who, request.method, request.path, limit)
    return Answer(504, CIMultiDict({"Content-Type": "application/json"}), json.dumps(
        {"error": "gateway_timeout", "reason": f"{who} did not answer within {limit:g} s; the request may have "
                                               "been applied"}).encode())


def other_nodes_context(config) -> ssl.SSLContext | None:
    """How this node speaks to the other nodes' APIs: HTTPS when its own API is, their certificates checked against
    the CA it trusts (not their names: nodes are reached at their advertised addresses)."""
    if not config.management_tls:
        return None
    context = ssl.create_default_context(cafile=config.tls_cacertfile)
    context.check_hostname = False
    return context


def signed_by_another_node(request: web.Request, secret: str, seen: SeenSignatures = SEEN) -> int | str | None:
    """The group a request another node forwarded is for (or NODE_ITSELF), when it carries the signature of the
    cluster's secret, made within SIGNED_FOR of now and not taken before; None when it does not (a client's own
    request, a forged one, or one sent again)."""
    group: int | str = request.headers[GROUP]
    try:
        group = int(group)
    except ValueError:
        group = group if group == NODE_ITSELF else -1
    client = request.headers.get(http.FORWARDED_CLIENT, "")
    check_only = request.headers.get(http.CHECK_ONLY) == "1"
    signed = request.headers.get(SIGNED, "")
    stamp = SIGNED_STAMP.fullmatch(signed)
    here = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not secret or stamp is None or here is None:
        return None
    expected = signature(secret, group, request.method, request.raw_path, client, check_only, signed,
                         request.headers.get("Authorization", ""), address_text(here))
    given = request.headers.get(SIGNATURE, "")
    if not hmac.compare_digest(expected, given):
        return None
    now, at = time.time(), int(stamp.group(1))
    if abs(now - at) > SIGNED_FOR:
        peer_log.warning(request.remote or "", "refused a request %s signed %.0f s away from this node's clock (more "
                         "than %d s): are the nodes' clocks set?", request.remote, now - at, SIGNED_FOR)
        return None
    taken = seen.take(given[:32], at + SIGNED_FOR, now)  # (half the signature tells one from another well enough)
    if taken != "new":
        peer_log.warning(request.remote or "", "refused a request %s signed: %s", request.remote,
                         "it came a second time" if taken == "again" else
                         f"{seen.limit} signatures were taken in the last {2 * SIGNED_FOR} s")
        return None
    return group


def for_another_node(request: web.Request, secret: str, entry: Callable[[], dict]) -> web.Response | None:
    """The answer of a node of a cluster of one-process nodes to a request another node sent (it has GROUP): 403
    unless signed_by_another_node takes it; the node's own entry (``entry()``) to an ask for its entries in
    /api/nodes; None for one forwarded to the leader (LEADERS_GROUP), which the caller answers; 503 for any other."""
    group = signed_by_another_node(request, secret)
    if group is None:
        return not_signed()
    if group == NODE_ITSELF and request.path == "/api/nodes":
        return http.reply([entry()])
    if group != LEADERS_GROUP:
        return http.error_response(503, "service_unavailable", f"this node does not answer for group {group}")
    return None


def not_signed() -> web.Response:
    return http.error_response(403, "not_authorised", "a request from another node must be signed with the "
                                                      "cluster's secret, once, at the time it is sent")
