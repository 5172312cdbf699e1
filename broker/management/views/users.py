"""The management API: users."""

from aiohttp import web

routes = web.RouteTableDef()
