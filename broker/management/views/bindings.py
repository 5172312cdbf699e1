"""The management API: bindings."""

from aiohttp import web

routes = web.RouteTableDef()
