"""Requests one management API forwards to another, written and read here: to a worker's internal socket (from its
node's public API, broker.workers.api), or to another node's management port, proven with the cluster's secret.
The node that took the request has checked its Host and Origin (broker.management.guards); what answers checks the
credentials, and says how they fared (http.LOGIN_OUTCOME).

Between nodes, the secret never crosses the wire (protocol.node_proof): on each connection the forwarding node
first asks for a challenge with a nonce of its own; the other node answers with its nonce and its proof of the
secret over both, keeping its nonce with the connection; the forwarding node checks that proof, then sends the
request with its own proof over both nonces and the request's group, method, path, client and credentials. A body
follows with an HMAC of it under a key that proof gives (http.BODY_KEY), read off and checked before the body is
used. The other node takes the request, and believes the client's address it carries (http.FORWARDED_CLIENT), only
with that proof, once: a request seen on the network proves nothing when sent again, on that connection or another,
before or after a restart, and nothing is kept per request beyond its connection. A request forwarded this way
answers as soon as its receiver has decided (a refused login, a body too large), however much of the body the
client has still to send, as the API of one process answers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.payload import AsyncIterablePayload
from multidict import CIMultiDict

from broker import collector
from broker.connection.peer_log import PeerLog
from broker.management import http
from protocol import node_proof

log = logging.getLogger(__name__)
peer_log = PeerLog(log)  # lines about other nodes and workers, a few a second per node or worker at most

Body = bytes | AsyncIterator[bytes] | None  # what a forwarded request carries

# A request one clustered node's API forwards to another's, for the worker that leads a group there: the group, and
# the forwarding node's proof over the request
GROUP = "X-Warren-Group"
PROOF = "X-Warren-Proof"
NONCE = "X-Warren-Nonce"  # a request for a challenge: the forwarding node's nonce, in hex
CHALLENGE = "X-Warren-Challenge"  # the answer: the other node's nonce and its proof (node_proof.challenge), in hex
CHALLENGE_PATH = "/api/warren/challenge"  # where the request for a challenge is sent (its answer is the same on any)
LINK = "api"  # the kind of link the proofs of forwarded requests are made for (node_proof.link_key)
NODE_ITSELF = "node"  # GROUP's value for a request of the node's own entries in /api/nodes
CONNECT_TIMEOUT = 5.0  # seconds another node's API has to accept a forwarded request
ANSWER_TIMEOUT = 120.0  # seconds another API has to answer one (an import of a large definitions file takes a while)
ENTRY_TIMEOUT = 5.0  # seconds another node has to give its own entries in /api/nodes
WORKER_TIMEOUT = 600.0  # seconds a worker has to answer (an import of the largest definitions a body may carry)


def address_text(address: tuple) -> str:
    """A socket's address as a Host header names it: host:port ([host]:port for IPv6), an IPv4 address in IPv6
    (::ffff:a.b.c.d) as the IPv4 address it is. The Host of a request to another node: its address, whatever name
    this node reached it by, which that node takes whatever names it was told."""
    host = address[0]
    try:
        parsed = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        parsed = None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        host = str(parsed.ipv4_mapped)
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


def request_proof(key: bytes, asked: bytes, answered: bytes, group: int | str, method: str, path_qs: str,
                  client: str, check_only: bool, authorization: str, with_body: bool) -> bytes:
    """The forwarding node's proof over both nonces and what the request asks, as whom and for whom."""
    return node_proof.proof(key, node_proof.ASKS, asked, answered, *(
        text.encode("utf-8", "surrogateescape")  # (a header's bytes as they came, UTF-8 or not)
        for text in (str(group), method, path_qs, client, "check" if check_only else "apply", authorization,
                     "body" if with_body else "")))


def body_key_of(key: bytes, proof: bytes) -> bytes:
    """The key of the HMAC that follows the body of the request a proof was made for."""
    return node_proof.proof(key, "body", proof)


def body_of(request: web.Request, kept: bytearray | None = None) -> Body:
    """The request's body to forward (None without one; an empty chunked one is one, as its receiver sees it),
    streamed as the API it is forwarded to reads it (which refuses a body too large, or a request it does not
    authorise, before reading it, as the API of one process does); kept gets a copy when given."""
    async def streamed() -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_any():
            if kept is not None:
                kept.extend(chunk)
            yield chunk
    return streamed() if request.body_exists else None


class Answer:
    """The answer to a forwarded request."""

    def __init__(self, status: int, headers: CIMultiDict, body: bytes | list[bytes], head_length: str | None = None):
        self.status = status
        self.headers = headers
        # the body as it came: a chunked one's chunks, joined when it is read whole (a listing's 118 MB took the
        # event loop 40 ms to join)
        self.parts = [body] if isinstance(body, bytes) else body or [b""]
        self.head_length = head_length  # a HEAD answer's Content-Length: the length its GET would have

    @property
    def body(self) -> bytes:
        if len(self.parts) > 1:
            self.parts = [b"".join(self.parts)]
        return self.parts[0]

    def json(self):
        return json.loads(self.body)

    def json_for_a_thread(self):
        """json(), each object built in Python code, so that on a thread the interpreter goes back to the event
        loop every few milliseconds (http.object_of), and out of the collector's sight (collector.out_of_sight)."""
        with collector.out_of_sight():
            return json.loads(self.body, object_pairs_hook=http.object_of)

    def response(self) -> web.Response:
        """The answer as this API's reply: a chunked one written a chunk a loop turn, as it came."""
        body = self.parts[0] if len(self.parts) == 1 else AsyncIterablePayload(_one_by_one(list(self.parts)))
        response = web.Response(status=self.status, body=body, headers=self.headers)
        if self.head_length is not None:
            response.headers["Content-Length"] = self.head_length
        return response


async def _one_by_one(parts: list[bytes]) -> AsyncIterator[bytes]:
    """The parts, the first first, each let go as it is taken, the loop turning after each."""
    parts.reverse()
    while parts:
        yield parts.pop()
        await asyncio.sleep(0)


class ApiClient:
    """Forwards requests to other APIs: a worker's internal socket, or another node's management port."""

    def __init__(self, secret: Callable[[], str | None], other_nodes: ssl.SSLContext | None = None) -> None:
        self.secret = secret  # the cluster's secret, which proves a request to another node (None: not learnt yet)
        self.other_nodes = other_nodes  # TLS towards the other nodes' APIs (other_nodes_context)

    async def ask_at(self, target: str | tuple[str, int], group: int | str, request: web.Request, body: Body = None,
                     path_qs: str | None = None, check_only: bool = False, client: str | None = None,
                     method: str | None = None, body_key: bytes | None = None) -> Answer:
        """The answer at target: a worker's internal socket, or another node's API (host, port), asked for what leads
        ``group`` there (or with NODE_ITSELF, for that worker's or node's own entries in /api/nodes, which need no
        credentials); with ``method``, asked with it rather than the request's (a GET of another node's entries, for
        a HEAD); ``body_key``: the key of the HMAC that ends the body, which a worker is to check (a request another
        node forwarded)."""
        client = request.remote or "" if client is None else client
        method = method or request.method
        path_qs = path_qs or request.raw_path
        to_node = not isinstance(target, str)
        who = f"the node at {target[0]}:{target[1]}" if to_node else f"worker {group}"
        limit = ENTRY_TIMEOUT if group == NODE_ITSELF else ANSWER_TIMEOUT if to_node else WORKER_TIMEOUT
        try:
            secret = self.secret() if to_node else ""
            if to_node and not secret:
                raise ConnectionError("this node has not learnt the cluster's secret yet")
            async with asyncio.timeout(CONNECT_TIMEOUT if to_node else None):
                if isinstance(target, str):
                    reader, writer = await asyncio.open_unix_connection(target)
                else:
                    reader, writer = await asyncio.open_connection(*target, ssl=self.other_nodes)
        except OSError as error:  # (TimeoutError included: nothing was sent)
            return unavailable(who, request, error)
        node = address_text(writer.get_extra_info("peername")) if to_node else None
        try:
            async with asyncio.timeout(limit):
                head, mac = self._head(request, method, body, path_qs, check_only, client, node, body_key,
                                       credentials=group != NODE_ITSELF), None
                if node is not None:
                    proof, key = await self._prove(reader, writer, node, group, method, path_qs, client, check_only,
                                                   request, body is not None, secret)
                    head = head[:-2] + f"{GROUP}: {group}\r\n{PROOF}: {proof.hex()}\r\n\r\n".encode()
                    mac = node_proof.body_mac(body_key_of(key, proof)) if body is not None else None
                elif group == NODE_ITSELF:  # (a worker's internal socket believes it, as it believes the client)
                    head = head[:-2] + f"{GROUP}: {group}\r\n\r\n".encode()
                writer.write(head)
                sending = asyncio.ensure_future(self._send(writer, body, request.content_length is None, mac))
                try:
                    answer = await read_answer(reader, method)
                finally:
                    sending.cancel()
            login = answer.headers.popall(http.LOGIN_OUTCOME, [])
            if login and request.get(http.LOGIN) != "refused":  # (one worker's refusal is the request's)
                request[http.LOGIN] = login[0]
            return answer
        except TimeoutError:
            return timed_out(who, request, limit)
        except node_proof.ProofError as error:
            return unavailable(who, request, ConnectionError(f"it does not prove it knows the cluster's secret: "
                                                             f"{error}"))
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            return unavailable(who, request, error)
        finally:
            writer.close()

    @staticmethod
    async def _prove(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: str, group: int | str,
                     method: str, path_qs: str, client: str, check_only: bool, request: web.Request, with_body: bool,
                     secret: str) -> tuple[bytes, bytes]:
        """Ask the other node for a challenge on this connection and check its proof (ProofError if wrong, the
        other node's answer as an error if it gives none); this node's proof over the request, and the key."""
        key = node_proof.link_key(secret, LINK)
        asked = node_proof.nonce()
        writer.write(f"GET {CHALLENGE_PATH} HTTP/1.1\r\nHost: {node}\r\n{NONCE}: {asked.hex()}\r\n"
                     f"Content-Length: 0\r\n\r\n".encode())
        status, headers = await read_head(reader)  # (no body read from a node that has proven nothing yet)
        challenge = node_proof.from_hex(headers.get(CHALLENGE, ""), node_proof.CHALLENGE_SIZE)
        if status != 204 or challenge is None:
            raise ConnectionError(f"it answered {status} to a request for a challenge")
        answered = node_proof.read_challenge(key, asked, challenge)
        return request_proof(key, asked, answered, group, method, path_qs, client, check_only,
                             request.headers.get("Authorization", "") if group != NODE_ITSELF else "",
                             with_body), key

    @staticmethod
    def _head(request: web.Request, method: str, body: Body, path_qs: str, check_only: bool, client: str,
              node: str | None = None, body_key: bytes | None = None, credentials: bool = True) -> bytes:
        """The request line and headers: the client's own (the Host, the credentials, the body's length), and the
        client's address. Not the client's Expect: this listener has answered it, and the body follows at once. To
        another node (node: its address), not the client's Host nor its Origin: they name this node, which checked
        them; the Host is that node's address instead. Without credentials: an ask for another node's own entries
        needs none. A body to another node is followed by its HMAC: its length counts it."""
        lines = [f"{method} {path_qs} HTTP/1.1".encode()]
        dropped = (b"connection", b"keep-alive", b"expect", *((b"host", b"origin") if node is not None else ()),
                   *(() if credentials else (b"authorization",)))
        if node is not None:
            lines.append(f"Host: {node}".encode())
        with_mac = node is not None and body is not None  # (the body is followed by its HMAC)
        for name, value in request.raw_headers:
            lowered = name.lower()
            if lowered.startswith(b"x-warren-") or lowered in dropped:
                continue
            if lowered == b"content-length" and (isinstance(body, bytes) or with_mac):
                if not isinstance(body, bytes):
                    lines.append(b"Content-Length: %d" % (int(value) + node_proof.PROOF_SIZE))
                continue
            if lowered == b"transfer-encoding" and isinstance(body, bytes):
                continue
            lines.append(name + b": " + value)
        if isinstance(body, bytes):
            lines.append(b"Content-Length: %d" % (len(body) + (node_proof.PROOF_SIZE if with_mac else 0)))
        lines.append(f"{http.FORWARDED_CLIENT}: {client}".encode())
        if check_only:
            lines.append(f"{http.CHECK_ONLY}: 1".encode())
        if body_key is not None:
            lines.append(f"{http.BODY_KEY_HEADER}: {body_key.hex()}".encode())
        lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, body: Body, chunked: bool, mac) -> None:
        """The body, and after it, to another node, its HMAC (mac: None to a worker)."""
        def write(data: bytes) -> None:
            if data:
                writer.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)

        try:
            if isinstance(body, bytes):
                writer.write(body)
                if mac is not None:
                    mac.update(body)
                    writer.write(mac.digest())
            elif body is not None:
                async for chunk in body:
                    if mac is not None:
                        mac.update(chunk)
                    write(chunk)
                    await writer.drain()
                if mac is not None:
                    write(mac.digest())
                if chunked:
                    writer.write(b"0\r\n\r\n")
            await writer.drain()
        except OSError:
            pass  # the other end answered before it read the whole body, and closed


async def read_head(reader: asyncio.StreamReader) -> tuple[int, CIMultiDict]:
    """The status and headers of an HTTP/1.1 response, after any interim (1xx) ones; ValueError for what is not one
    (a head longer than the reader's limit included)."""
    status, header_lines = 100, []
    try:
        while 100 <= status < 200:
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
            status = int(status_line.split()[1])
    except (asyncio.LimitOverrunError, IndexError) as error:
        raise ValueError(f"not an HTTP answer: {error!r}") from None
    return status, CIMultiDict(line.split(": ", 1) for line in header_lines)


async def read_answer(reader: asyncio.StreamReader, method: str) -> Answer:
    """An HTTP/1.1 response from another API (its status, headers and body), after any interim (1xx) ones."""
    status, headers = await read_head(reader)
    head_length = headers.get("Content-Length") if method == "HEAD" else None
    body: bytes | list[bytes] = b""
    if method == "HEAD" or status in (204, 304):
        pass
    elif headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
    elif "Content-Length" in headers:
        body = await reader.readexactly(int(headers["Content-Length"]))
    else:
        body = await reader.read()
    for name in ("Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Date", "Server"):
        headers.popall(name, None)
    return Answer(status, headers, body, head_length)


def unavailable(who: str, request: web.Request, error: Exception) -> Answer:
    """who: "worker N", or another node (a few lines a second about each at most: a client retrying while a node
    fails over cannot flood the log)"""
    peer_log.warning(who, "%s did not answer %s %.200s: %s", who, request.method, request.path,
                     "it did not accept the connection in time" if isinstance(error, TimeoutError) else error)
    return Answer(503, CIMultiDict({"Content-Type": "application/json"}), json.dumps(
        {"error": "service_unavailable", "reason": f"{who} is starting or stopping"}).encode())


def timed_out(who: str, request: web.Request, limit: float) -> Answer:
    """504: another node took the request but did not answer it within ``limit`` seconds (it may have applied it)."""
    peer_log.warning(who, "%s did not answer %s %.200s within %g s", who, request.method, request.path, limit)
    return Answer(504, CIMultiDict({"Content-Type": "application/json"}), json.dumps(
        {"error": "gateway_timeout", "reason": f"{who} did not answer within {limit:g} s; the request may have "
                                               "been applied"}).encode())


def other_nodes_context(config) -> ssl.SSLContext | None:
    """How this node speaks to the other nodes' APIs: HTTPS when its own API is, their certificates checked against
    the CA it trusts (not their names: nodes are reached at their advertised addresses), its own given to an API
    that asks for one ([tls] verify_peer)."""
    if not config.management_tls:
        return None
    context = ssl.create_default_context(cafile=config.tls_cacertfile)
    context.check_hostname = False
    context.load_cert_chain(config.tls_certfile, config.tls_keyfile)
    return context


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What an API answers to a request another node proved, for a group (or NODE_ITSELF), given its own handler
ForGroup = Callable[[web.Request, int | str, Handler], Awaitable[web.StreamResponse]]


def from_other_nodes(secret: Callable[[], str | None], answer: ForGroup):
    """The middleware of an API other nodes forward requests to: a request for a challenge gets one; a request for a
    group is answered by ``answer`` once its proof is right (403 otherwise; 503 while this node has not learnt the
    cluster's secret); any other request is a client's, answered as usual."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if NONCE not in request.headers and GROUP not in request.headers:
            return await handler(request)
        known = secret()
        if not known:
            return not_learnt()
        if NONCE in request.headers:
            return challenged(request, known)
        group = proven(request, known)
        if group is None:
            peer_log.warning(request.remote or "", "refused a request from %s for another node's client: no right "
                                                   "proof of the cluster's secret", request.remote)
            return not_proven()
        return await answer(request, group, handler)
    return middleware


def challenged(request: web.Request, secret: str) -> web.Response:
    """This node's challenge to the node that asks for one, its nonce kept with the connection for the one request
    that may follow on it."""
    asked = node_proof.from_hex(request.headers[NONCE], node_proof.NONCE_SIZE)
    connection = request.protocol
    if asked is None:
        return http.error_response(400, "bad_request", f"{NONCE} must be {node_proof.NONCE_SIZE} bytes in "
                                                       "lowercase hexadecimal")
    if not hasattr(connection, "challenge"):  # (a listener of this API's own always has one)
        return http.error_response(503, "service_unavailable", "this listener takes no requests of other nodes")
    answered, challenge = node_proof.challenge(node_proof.link_key(secret, LINK), asked)
    connection.challenge = asked, answered
    return web.Response(status=204, headers={CHALLENGE: challenge.hex()})


def proven(request: web.Request, secret: str) -> int | str | None:
    """The group a request another node forwarded is for (or NODE_ITSELF), when its proof answers the challenge
    this node gave on its connection (taken: one request per challenge); None when it does not (a client's own
    request, a forged one, or one sent again). A request with a body gets the key of the body's HMAC."""
    connection = request.protocol
    challenge = getattr(connection, "challenge", None)
    if challenge is None:
        return None
    connection.challenge = None
    asked, answered = challenge
    group: int | str = request.headers[GROUP]
    try:
        group = int(group)
    except ValueError:
        group = group if group == NODE_ITSELF else -1
    key = node_proof.link_key(secret, LINK)
    expected = request_proof(key, asked, answered, group, request.method, request.raw_path,
                             request.headers.get(http.FORWARDED_CLIENT, ""), request.headers.get(http.CHECK_ONLY) == "1",
                             request.headers.get("Authorization", ""), request.body_exists)
    given = node_proof.from_hex(request.headers.get(PROOF, ""), node_proof.PROOF_SIZE)
    if given is None or not node_proof.check(expected, given):
        return None
    if request.body_exists:
        request[http.BODY_KEY] = body_key_of(key, expected)
    return group


def not_proven() -> web.Response:
    return http.error_response(403, "not_authorised", "a request from another node must carry its proof of the "
                                                      "cluster's secret, answering the challenge of its connection")


def not_learnt() -> web.Response:
    return http.error_response(503, "service_unavailable", "this node has not learnt the cluster's secret yet")
