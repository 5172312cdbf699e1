"""What every view of the management API shares: the server it reads, authentication and tag checks, JSON bodies
and RabbitMQ's error replies."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import itertools
import json
import math
import re
import socket
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

from aiohttp import web
from aiohttp.payload import AsyncIterablePayload

from broker.connection.auth import may_log_in_from
from broker.model.access import User
from broker.model.features.ready import let_go
from protocol import node_proof

if TYPE_CHECKING:
    from broker.connection.server import Server
    from broker.model.node import Node
    from broker.model.vhost import VirtualHost

SERVER = web.AppKey("server", object)  # the AMQP Server (its node, connections and config)
RATES = web.AppKey("rates", object)  # management.rates.Rates: the sampled message counters
STARTED = web.AppKey("started", float)  # time.monotonic() when the API started (the node's uptime counts from it)
MAX_BODY_SIZE = web.AppKey("max_body_size", int)  # largest request body read, in bytes (config's)
ENCODE_SLICE = 500  # items of a list reply encoded between two turns of the event loop (about 5 ms of queues)
# objects of a list reply made into JSON and encoded between two turns: 3 to 5 ms of queues (a queue's JSON with its
# message_stats, once its rates are sampled, is 1.2 kB: 250 of them took 14 to 26 ms)
MAKE_SLICE = 50
# The address of the client a request came from, as the supervisor of several workers forwards it to a worker's
# internal API (broker.workers.api); believed only there
FORWARDED_CLIENT = "X-Warren-Client"
# A forwarded change to be checked, not applied: an import of definitions, a vhost made or deleted (check_only)
CHECK_ONLY = "X-Warren-Check-Only"
FORWARDED = web.AppKey("forwarded", bool)  # the API serves a worker's internal socket (it believes the above)
USER = web.RequestKey("user", User)  # who an /api/ request's credentials name (set by app.authenticated)
# How a forwarded request's credentials fared, "refused" or "accepted", in the worker's answer: the supervisor
# counts the node's refused logins and waits before it answers them (broker.workers.api)
LOGIN_OUTCOME = "X-Warren-Login"
LOGIN = web.RequestKey("login", str)  # that outcome, on a forwarded request (set by app.authenticated)
# The key of the HMAC that ends the body of a request another node forwarded (broker.management.forwarding), set
# once the request's proof is checked; to a worker, the supervisor that checked it sends the key in BODY_KEY_HEADER
BODY_KEY = web.RequestKey("body_key", bytes)
BODY_KEY_HEADER = "X-Warren-Body-Key"
OFF_LOOP_BYTES = 1024 * 1024  # a body larger than this is parsed on a thread, not the event loop
MAX_RANGE = 500  # samples a msg_rates_age/msg_rates_incr period may ask for at most (RabbitMQ's ?MAX_RANGE)
# an integer as RabbitMQ reads one in a query, a path segment or a body: ASCII digits (str.isdigit also takes other
# scripts' digits and superscripts), an optional sign, at most the 4300 digits int() reads
INTEGER_TEXT = re.compile(r"[-+]?[0-9]{1,4300}")
PRODUCT_NAME = "Warren"  # product_name in the overview and in exports (RabbitMQ's says "RabbitMQ")
ERROR_NAMES = {400: "bad_request", 401: "not_authorised", 403: "not_authorised", 404: "Object Not Found"}

# Which tags grant which tag's rights (RabbitMQ's: administrator > monitoring > management, policymaker >
# management).
IMPLIED_TAGS = {
    "administrator": {"administrator", "monitoring", "policymaker", "management"},
    "monitoring": {"monitoring", "management"},
    "policymaker": {"policymaker", "management"},
    "management": {"management"},
}

REFUSAL_NAMES = {"monitoring": "monitor"}  # how RabbitMQ's refusals name a tag, where not by the tag itself


class ApiError(Exception):
    """An error reply: status, RabbitMQ's error name, and the reason shown to the client (no body when error is
    empty, as RabbitMQ's 401 to a request without credentials)."""

    def __init__(self, status: int, error: str, reason: str):
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason

    def response(self) -> web.Response:
        return error_response(self.status, self.error, self.reason)


class LoginRefused(ApiError):
    """A 401 for credentials that are wrong, or that may not be used from the client's address: each one makes the
    next refusal to that address wait longer (login_throttle)."""


def error_response(status: int, error: str, reason: str) -> web.Response:
    """RabbitMQ 3.10 answers a 401 two ways: credentials absent (no body) or wrong ("not_authorized", "Login failed")
    with a Basic challenge (rabbit_mgmt_util:not_authenticated); credentials that are right but may not do this (no
    management tag, a loopback user from elsewhere, tags or permissions that do not allow the call: "not_authorised")
    without one (not_authorised), since logging in again as the same user would not help."""
    challenge = status == 401 and error in ("", "not_authorized")
    headers = {"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'} if challenge else None
    if not error:
        return web.Response(status=status, headers=headers)
    return web.json_response({"error": error, "reason": reason}, status=status, headers=headers, dumps=compact_json)


def error_reply(request: web.Request, error: ApiError) -> web.Response:
    """The reply to a request an ApiError refuses; to a page's own request (the console's), no Basic challenge, or
    the browser would put up its login dialog."""
    response = error.response()
    if request.headers.get("X-Requested-With") == "XMLHttpRequest":
        response.headers.pop("WWW-Authenticate", None)
    return response


def without_credentials(request: web.Request) -> web.Response | None:
    """RabbitMQ's 401 to an /api/ request that carries no basic credentials (None for one that does): a node that
    forwards requests gives it itself, with nothing to check, as the API that would check them gives it."""
    if not request.path.startswith("/api/"):
        return None
    scheme, _, _ = request.headers.get("Authorization", "").partition(" ")
    return error_reply(request, ApiError(401, "", "")) if scheme.lower() != "basic" else None


def not_authorised(reason: str) -> ApiError:
    """RabbitMQ 3.10 refuses a call the user's tags or permissions do not allow with 401 (not 403)."""
    return ApiError(401, "not_authorised", reason)


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def body_too_large() -> ApiError:
    """RabbitMQ's answer to a body past management.http.max_body_size."""
    return bad_request("Exceeded HTTP request body size limit")


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


# --- the server and its node -----------------------------------------------------------------------------------
def server_of(request: web.Request) -> "Server":
    return request.app[SERVER]


def message_stats(request: web.Request, history) -> dict:
    """A management.rates.History as RabbitMQ's message_stats, with the samples of the last msg_rates_age seconds
    every msg_rates_incr seconds when the request asks for them (as RabbitMQ's UI does for its charts). As
    RabbitMQ's, a value that is not a whole number is ignored, and a period of more than MAX_RANGE samples (or not
    positive) is a 400."""
    if history is None:
        return {}
    age, increment = (query_integer(request, key) for key in ("msg_rates_age", "msg_rates_incr"))
    if age is None or increment is None:
        return history.message_stats()
    if age <= 0 or increment <= 0 or age // increment > MAX_RANGE:
        raise bad_request(f"Invalid range parameters: age {age}, incr {increment}")
    # an increment past the age picks the newest sample alone, as the age does (and stays a float's size)
    return history.message_stats(age, request.app[RATES].every(min(increment, age)))


def query_integer(request: web.Request, key: str) -> int | None:
    """The query's key as an integer (integer_text), None when absent or not one."""
    text = request.query.get(key)
    return integer_text(text) if text is not None else None


def integer_text(text: str) -> int | None:
    """The integer text spells (INTEGER_TEXT), None for anything else."""
    return int(text) if INTEGER_TEXT.fullmatch(text) else None


def node_of(request: web.Request) -> "Node":
    return request.app[SERVER].node


# the name part of node_name(): "warren"; "warren-N" in worker process N, or a cluster node's id ("ID-N" where the
# node runs several workers): name_worker
UNCLUSTERED_NODE = "warren"  # a node's name without [cluster] node_id
NODE = [UNCLUSTERED_NODE]
WORKERS_OF = [(UNCLUSTERED_NODE, 1)]  # the node this process is a worker of, and how many workers it runs


def name_worker(number: int, node: str = UNCLUSTERED_NODE, workers: int = 2) -> None:
    """This process is worker N of ``workers`` (of the cluster node named ``node``): its node name says so (what its
    vhosts' queues and connections show)."""
    NODE[0] = worker_name(number, node, workers).partition("@")[0]
    WORKERS_OF[0] = (node, workers)
    node_name.cache_clear()


def owner_name(group: int | None) -> str:
    """The node name of the process that owns a queue: this one (None), or another worker of its node."""
    return node_name() if group is None else worker_name(group, *WORKERS_OF[0])


def worker_name(number: int, node: str = UNCLUSTERED_NODE, workers: int = 2) -> str:
    """The node name of worker N of this host's node ``node``, as that worker shows it; a node of one worker (a
    cluster node that runs one process) is named as the node, as each node of a RabbitMQ cluster is."""
    return f"{node}-{number}@{host_name()}" if workers > 1 else f"{node}@{host_name()}"


def worker_named(name: str, workers: int) -> int | None:
    """The number of the worker of this broker's ``workers`` that a node name names: warren-N@host, or warren-N
    (rabbitmqctl's short node names take this host); None for any other name."""
    for number in range(workers):
        if name in (worker_name(number), worker_name(number).partition("@")[0]):
            return number
    return None


@functools.cache
def node_name() -> str:
    """The node's name as RabbitMQ's API shows it (name@host), read once."""
    return f"{NODE[0]}@{host_name()}"


def host_name() -> str:
    return socket.gethostname().split('.')[0]


def channel_name(channel) -> str:
    """RabbitMQ's name of a channel: its connection's name and its number in parentheses."""
    return f"{channel.connection.name} ({channel.number})"


def peer(connection) -> dict:
    """The client's address as RabbitMQ's API gives it."""
    host, _, port = connection.peer.rpartition(":")
    return {"peer_host": host, "peer_port": int(port) if port.isdigit() else port}


def named_vhost(request: web.Request, key: str = "vhost") -> "VirtualHost":
    """The vhost named in the path (404 if there is none of that name)."""
    vhost = node_of(request).vhosts.get(request.match_info[key])
    if vhost is None:
        raise not_found()
    return vhost


def login_vhost_of(request: web.Request, key: str = "vhost") -> "VirtualHost":
    """The vhost named in the path, for calls RabbitMQ allows only administrators and users with permissions there
    (most vhost-scoped ones): 404 if there is none of that name, 401 for anyone else."""
    vhost = named_vhost(request, key)
    if "administrator" not in rights_of(request[USER]) and not has_permissions(request, vhost.name):
        raise not_authorised("User not authorised to access virtual host")
    return vhost


async def on_disk(request: web.Request) -> None:
    """Wait until every durable change made so far (definitions, purges) is on disk, and the other processes of
    the node that the request's vhost changed (the owners of its queues, its copies: broker.crossing) acked it, as
    an AMQP declare-ok waits; 500 if the write failed."""
    node = node_of(request)
    store = node.store
    if store is None:
        return
    vhost = node.vhosts.get(request.match_info.get("vhost", ""))
    owners = vhost.take_changed_owners() if vhost is not None else None
    done = asyncio.get_running_loop().create_future()
    settle = lambda ok: done.done() or done.set_result(ok)  # noqa: E731
    if vhost is not None and owners:
        vhost.when_durable(settle, owners)
    else:
        store.when_durable(settle)
    if not await done:
        raise ApiError(500, "internal_error", "the change could not be written to disk")



# --- authentication and tags -----------------------------------------------------------------------------------
def authenticate(request: web.Request) -> User:
    """The user named by the request's basic credentials; RabbitMQ's 401 when they are absent, wrong, name a
    loopback user and the client is not on this machine, or name a user without a management tag. Every tag right
    implies management's, so views check only higher rights."""
    header = request.headers.get("Authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(401, "", "")  # (without_credentials gives the same reply)
    try:
        name, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, ValueError):
        raise LoginRefused(401, "not_authorized", "Login failed") from None
    user = node_of(request).authenticate(name, password)
    if user is None:
        raise LoginRefused(401, "not_authorized", "Login failed")
    if not may_log_in_from(name, server_of(request).config.loopback_users, request.remote or ""):
        raise LoginRefused(401, "not_authorised", "User can only log in via localhost")
    if not rights_of(user):
        raise not_authorised("Not management user")
    return user


def rights_of(user: User) -> set[str]:
    """Every tag right user has, the implied ones included."""
    rights: set[str] = set()
    for tag in user.tags:
        rights |= IMPLIED_TAGS.get(tag, set())
    return rights


def check_only(request: web.Request) -> bool:
    """Whether the request is to be checked, not applied: the supervisor of several workers has the first worker
    check a change (its credentials, tags and body) before it places a vhost or imports definitions
    (broker.workers.api)."""
    return request.app[FORWARDED] and CHECK_ONLY in request.headers


def require(request: web.Request, tag: str) -> User:
    """The request's user, if its tags grant tag's rights; else RabbitMQ's refusal (401 "Not administrator
    user")."""
    user: User = request[USER]
    if tag not in rights_of(user):
        raise not_authorised(f"Not {REFUSAL_NAMES.get(tag, tag)} user")
    return user


def require_policymaker(request: web.Request, vhost: str | None = None) -> None:
    """RabbitMQ's refusal unless the user is an administrator, or a policymaker with permissions in vhost (when it
    names one that exists): who may read and change a vhost's policies and runtime parameters."""
    rights = rights_of(request[USER])
    if "administrator" in rights:
        return
    if "policymaker" not in rights or (vhost is not None and vhost in node_of(request).vhosts
                                       and not has_permissions(request, vhost)):
        raise not_authorised("User not authorised to access object")


def has_permissions(request: web.Request, vhost: str) -> bool:
    """Whether the request's user has a permission entry in vhost (may log in there)."""
    return (vhost, request[USER].name) in node_of(request).permissions


def vhosts_for(request: web.Request, seen_whole_by: str | None) -> list["VirtualHost"]:
    """The vhosts a listing shows the user: every one if its tags grant seen_whole_by's rights, else those it has
    permissions in. RabbitMQ 3.10 widens vhost, connection and overview listings for monitoring, queue, exchange
    and binding listings for administrator only, and policy listings for no one."""
    vhosts = node_of(request).vhosts
    if seen_whole_by is not None and seen_whole_by in rights_of(request[USER]):
        return list(vhosts.values())
    return [vhost for name, vhost in vhosts.items() if has_permissions(request, name)]


def tag_list(value: Any, what: str) -> list[str]:
    """Tags as RabbitMQ accepts them: a comma-separated string or a list of strings."""
    if isinstance(value, str):
        return [tag.strip() for tag in value.split(",") if tag.strip()]
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return [tag.strip() for tag in value if tag.strip()]
    raise bad_request(f"{what} must be a comma-separated string or a list of strings")


def require_keys(body: dict, keys: tuple[str, ...]) -> None:
    """400 naming the missing keys as RabbitMQ does ("[{key_missing,write},{key_missing,read}]")."""
    missing = [key for key in keys if key not in body]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")


def string_field(body: dict, key: str, default: str | None = None) -> str | None:
    """body[key] if it is a string (default when absent); 400 naming the key otherwise."""
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


# --- bodies ----------------------------------------------------------------------------------------------------
async def json_body(request: web.Request) -> dict:
    """The request's JSON object (an empty body is {}); 400 for anything else."""
    raw = await read_body(request)
    if not raw.strip():
        return {}
    body = await parse_json(raw)
    if not isinstance(body, dict):
        raise bad_request("not a JSON object")
    return body


async def read_body(request: web.Request) -> bytes:
    """The request's body; RabbitMQ's 400 once it passes max_body_size (a body sent in chunks announces no size).
    The body of a request another node forwarded ends with its HMAC, checked and taken off here: 403 when the body
    is not the one the forwarding node sent."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise body_too_large() from None
    key = request.get(BODY_KEY)
    if key is not None:
        raw, given = raw[:-node_proof.PROOF_SIZE], raw[-node_proof.PROOF_SIZE:]
        mac = node_proof.body_mac(key)
        mac.update(raw)
        if not node_proof.check(mac.digest(), given):
            raise ApiError(403, "not_authorised", "the body of a request from another node is not the one it sent")
    if len(raw) > request.app[MAX_BODY_SIZE]:
        raise body_too_large()
    return raw


def body_length(request: web.Request) -> int:
    """The length of the request's body as its Content-Length says (0 when it says none), its HMAC left out."""
    length = request.content_length
    if length is None:
        return 0
    return length - node_proof.PROOF_SIZE if BODY_KEY in request else length


async def parse_json(raw: bytes) -> Any:
    """decode_json(raw), on a thread when raw is large, so that the event loop goes on serving meanwhile."""
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(decode_json, raw, object_of)
    return decode_json(raw)


def object_of(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object as json builds it, but in Python code: the interpreter hands the GIL to the event loop's thread
    in between (json's C parser alone held it for 120 ms of a 9 MB body; with this, 8 ms)."""
    return dict(pairs)


class NotJson(ValueError):
    """A number JSON cannot carry back: NaN, Infinity, or one past a double's range (1e400)."""


def finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise NotJson(text)
    return number


def refuse_constant(text: str) -> float:
    raise NotJson(text)


def decode_json(raw: bytes | str, object_hook: Callable[[list], dict] | None = None) -> Any:
    """A request body's JSON (each object built by object_hook when given); RabbitMQ's 400 "not_json" when it is not
    JSON (a compressed body included: it is read as sent) or holds a number that is not finite (it would come back
    as Infinity, which no JSON parser reads)."""
    try:
        return json.loads(raw, parse_float=finite_float, parse_constant=refuse_constant,
                          object_pairs_hook=object_hook)
    except (NotJson, ValueError):  # (UnicodeDecodeError is a ValueError)
        raise bad_request("not_json") from None
    except RecursionError:
        raise bad_request("failed to decode JSON: nested too deeply") from None


def compact_json(data: Any) -> str:
    """JSON without spaces, as RabbitMQ writes it."""
    return json.dumps(data, separators=(",", ":"))


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=compact_json)


def reply_in_slices(request: web.Request, data: list | dict, make: Callable[[Any], dict] | None = None
                    ) -> web.Response:
    """reply() of a list, or of an object of lists (a definitions export), encoded a list's ENCODE_SLICE items at a
    time: one of no more is sent whole, as reply() sends it; a longer one is written as it is encoded (chunked), the
    event loop turning between its slices (a listing of 100,000 queues encoded in one call held it 0.48 s; its
    118 MB joined before they were written, 30 ms and more), its items let go as they are encoded (100,000 queues'
    entries freed at once, as the listing returned, held the loop 0.3 s), or in slices all the same when they are
    not (a HEAD, a client gone): the lists are the caller's no more. With make, data is a list of objects whose
    JSON objects make() makes as they are encoded (100,000 queues' entries made first were walked by the collector
    before they went: 64 ms at once)."""
    pieces: list[bytes] = []
    steps = _encoded(data, pieces, make)
    if next(steps, _ENCODED) is _ENCODED:
        return web.Response(body=b"".join(pieces), content_type="application/json", charset="utf-8")
    if request.method == "HEAD":
        _let_go(data)
    return web.Response(body=AsyncIterablePayload(_chunks(data, pieces, steps)), content_type="application/json",
                        charset="utf-8")


_ENCODED = object()  # (what next() of _encoded's steps answers once all is encoded)


async def _chunks(data: Any, pieces: list[bytes], steps: Iterator[None]) -> AsyncIterator[bytes]:
    """data's JSON a chunk at a time, from what pieces holds of it (its first slice) and what steps go on adding,
    each chunk up to a list's next slice, the loop turning after each."""
    written = False
    try:
        for _ in itertools.chain((None,), steps):
            yield b"".join(pieces)
            pieces.clear()
            await asyncio.sleep(0)
        yield b"".join(pieces)
        written = True
    finally:
        if not written:  # (its client gone)
            _let_go(data)


def _let_go(data: Any) -> None:
    """The items of data's lists freed ENCODE_SLICE a loop turn (100,000 queues' entries at once held the loop
    0.18 s)."""
    for items in [data] if isinstance(data, list) else [value for value in data.values() if isinstance(value, list)]:
        let_go(items, ENCODE_SLICE)


def _encoded(data: Any, pieces: list[bytes], make: Callable[[Any], dict] | None = None) -> Iterator[None]:
    """data's JSON appended to pieces, a step before each of a list's slices but its first: of ENCODE_SLICE items,
    or of MAKE_SLICE where make() makes the JSON object of each item of the list data is (as the slice is encoded,
    so that no more than a slice of them is alive at a time)."""
    if isinstance(data, dict):
        pieces.append(b"{")
        for number, (key, value) in enumerate(data.items()):
            pieces.append(f"{',' if number else ''}{_key(key)}:".encode())
            yield from _encoded(value, pieces)
        pieces.append(b"}")
    elif not isinstance(data, list):
        pieces.append(compact_json(data).encode())
    else:
        pieces.append(b"[")
        size = ENCODE_SLICE if make is None else MAKE_SLICE
        for start in range(0, len(data), size):
            if start:
                yield None
                pieces.append(b",")
            end = min(start + size, len(data))
            items = data[start:end] if make is None else list(map(make, data[start:end]))
            pieces.append(compact_json(items)[1:-1].encode())  # (without the brackets)
            data[start:end] = [None] * (end - start)
        pieces.append(b"]")


def _key(key: Any) -> str:
    """An object's key as json.dumps writes it: a string, a number's or a constant's text as a string."""
    return compact_json(key if isinstance(key, str) else compact_json(key))


def sorted_by(items: list[dict], *keys: str) -> list[dict]:
    """A listing sorted as RabbitMQ sorts it: by the given fields ("name" unless told)."""
    keys = keys or ("name",)
    return sorted(items, key=lambda item: tuple(item.get(key) for key in keys))


def escape_html_tags(text: str) -> str:
    """RabbitMQ's policy and parameter views escape these in their refusals (its operator policy view does not)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def created_or_updated(existed: bool) -> web.Response:
    """RabbitMQ answers a PUT with 201 Created for a new object, 204 No Content for an update."""
    return web.Response(status=204 if existed else 201)


def no_content() -> web.Response:
    return web.Response(status=204)
