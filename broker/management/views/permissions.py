"""The management API: permissions."""

from aiohttp import web

routes = web.RouteTableDef()
