"""The management API: vhosts."""

from aiohttp import web

routes = web.RouteTableDef()
