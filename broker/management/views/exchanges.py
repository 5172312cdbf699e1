"""The management API: exchanges."""

from aiohttp import web

routes = web.RouteTableDef()
