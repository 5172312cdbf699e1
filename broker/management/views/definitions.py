"""The management API: definitions (RabbitMQ's export and import JSON), for the node or one vhost."""

from __future__ import annotations

from urllib.parse import quote

from aiohttp import web

from broker.management import http
from broker.model.turns import in_slices
from broker.model.definitions import DefinitionsError, export_node, export_vhost, importing, vhosts_named

routes = web.RouteTableDef()


@routes.get("/api/definitions")
async def export_all(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    server = http.server_of(request)
    return await _exported(request, export_node(server.node, http.PRODUCT_NAME, server.version))


@routes.get("/api/definitions/{vhost}")
async def export_one(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    vhost = http.node_of(request).vhosts.get(request.match_info["vhost"])
    if vhost is None:
        raise http.bad_request("vhost_not_found")  # RabbitMQ's answer here (a 400, not a 404)
    return await _exported(request, export_vhost(vhost))


@routes.post("/api/definitions")
async def import_all(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    return await _imported(request, None)


@routes.post("/api/definitions/{vhost}")
async def import_one(request: web.Request) -> web.Response:
    http.require(request, "administrator")
    name = request.match_info["vhost"]
    if name not in http.node_of(request).vhosts:
        raise http.ApiError(404, "not_found", "vhost_not_found")
    return await _imported(request, name)


async def _exported(request: web.Request, definitions: dict) -> web.Response:
    """The export; with ?download=NAME, as a file of that name (what RabbitMQ's UI asks for)."""
    response = http.reply_in_slices(request, definitions)
    download = request.query.get("download")
    if download:
        response.headers["Content-Disposition"] = content_disposition(download)
    return response


def content_disposition(filename: str) -> str:
    """RabbitMQ's attachment header naming filename; a name with other characters than printable ASCII (a CR or LF
    would end the header) is sent as RFC 6266 has it: those characters replaced in filename, the whole name in
    UTF-8 in filename*."""
    if all(" " <= c <= "~" for c in filename):
        return f"attachment; filename={filename}"
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


async def _imported(request: web.Request, vhost: str | None) -> web.Response:
    """Import the request's definitions (a JSON body: not a form's file field as RabbitMQ's UI uploads it, as any
    other site's page could post one); 204 once they are on disk, 400 naming the first item that cannot be
    applied."""
    # the supervisor of several workers has each check its share of an import before any applies it
    check_only = http.check_only(request)
    node, document = http.node_of(request), await _document(request)
    for name in vhosts_named(document):  # (one of those being deleted is gone first)
        await node.vhost_deleted(name)
    try:
        # (in slices: a 10 MB document, 290,000 queues, took 14 s of the event loop in one piece)
        await in_slices(importing(node, document, vhost, check_only))
    except DefinitionsError as error:
        raise http.bad_request(str(error)) from None
    if not check_only:
        await http.on_disk(request)
    return http.no_content()


async def _document(request: web.Request):
    """The request's JSON document (guards.json_bodies let only JSON bodies through)."""
    return await http.parse_json(await http.read_body(request))
