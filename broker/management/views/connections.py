"""The management API: connections."""

from aiohttp import web

routes = web.RouteTableDef()
