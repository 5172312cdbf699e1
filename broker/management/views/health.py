"""The management API: health."""

from aiohttp import web

routes = web.RouteTableDef()
