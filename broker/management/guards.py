"""What the management API checks of a request before any view reads it, against other web sites: a page of
another origin that a user's browser runs (cross-site request forgery, with the Basic credentials the browser has
cached), or one that reaches this API through a DNS name of its own pointed at this machine (DNS rebinding). The
decisions are pure functions; the middlewares apply them."""

from __future__ import annotations

import functools
import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp import web

from broker.management import http

STATE_CHANGING = frozenset({"POST", "PUT", "DELETE", "PATCH"})  # methods whose body, if any, must be JSON
JSON = "application/json"

# Sent with every reply: the console's page loads only its own scripts and styles, calls only this API, and may not
# be framed by another page (clickjacking); no reply is sniffed into another type or kept in a cache.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
API_HEADERS = {"Cache-Control": "no-store"}  # with the replies of /api/ (they carry the broker's state)
NAMES = web.AppKey("names", frozenset)  # the host names a Host header may give (allowed_names)

UNSUPPORTED = ("a request that changes something must send its body as JSON, with Content-Type: application/json "
               "(a form of another web site cannot)")


@functools.cache
def own_names() -> frozenset[str]:
    """The names a Host header may give for this machine without being configured: localhost, its host name and
    its fully qualified name."""
    hostname = socket.gethostname()
    return frozenset(name.lower().rstrip(".") for name in ("localhost", hostname, socket.getfqdn(hostname)) if name)


def host_name(host: str) -> str:
    """The name or address of a Host header value, without its port or an IPv6 address's brackets."""
    if host.startswith("["):
        address, closed, _ = host[1:].partition("]")
        return address if closed else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(host: str | None, names: frozenset[str]) -> bool:
    """Whether a request's Host header names this API as its operator reaches it: an IP address, or one of names
    (own_names() and the configured ones). A request without one (HTTP/1.0, no browser) is let through."""
    if host is None:
        return True
    name = host_name(host).lower().rstrip(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in names


def origin_matches(origin: str, host: str | None) -> bool:
    """Whether a request's Origin header names the page's own origin: the scheme's host and port given in the
    request's Host header ("null", a sandboxed or local page, never does)."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host is not None and parts.netloc.lower() == host.lower()


def body_refusal(method: str, has_body: bool, content_type: str) -> str | None:
    """Why a request's body is refused before it is read (None when it is not): a request that changes something
    sends JSON, which no form or simple request of another site can send without this API allowing it."""
    if method in STATE_CHANGING and has_body and content_type != JSON:
        return UNSUPPORTED
    return None


# --- middlewares and signals -----------------------------------------------------------------------------------
def allowed_names(config) -> frozenset[str]:
    return own_names() | {name.lower().rstrip(".") for name in config.management_hostnames}


@web.middleware
async def same_origin(request: web.Request, handler):
    """403 for a Host header that names neither this machine nor a configured name, and for an Origin header that
    is not the Host's own (a page of another site)."""
    host = request.headers.get("Host")
    if not host_allowed(host, request.app[NAMES]):
        return http.error_response(403, "forbidden", "the Host header names neither this machine nor one of the "
                                                     "management hostnames of the configuration")
    origin = request.headers.get("Origin")
    if origin is not None and not origin_matches(origin, host):
        return http.error_response(403, "forbidden", "cross-origin request refused: its Origin is not this API's")
    return await handler(request)


@web.middleware
async def json_bodies(request: web.Request, handler):
    """Before a view reads a body, after authentication: 415 for a body that is not JSON, RabbitMQ's 400 for one
    past max_body_size (when its Content-Length says so; one sent in chunks is cut at the limit as it is read)."""
    refusal = body_refusal(request.method, request.body_exists, request.content_type)
    if refusal is not None:
        return http.error_response(415, "unsupported_media_type", refusal)
    if http.body_length(request) > request.app[http.MAX_BODY_SIZE]:
        response = http.body_too_large().response()
        response.force_close()  # what follows is the body, unread
        return response
    return await handler(request)


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)
    if request.path.startswith("/api/"):
        response.headers.update(API_HEADERS)

