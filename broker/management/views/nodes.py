"""The management API: nodes."""

from aiohttp import web

routes = web.RouteTableDef()
