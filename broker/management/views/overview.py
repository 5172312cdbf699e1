"""The management API: overview."""

from aiohttp import web

routes = web.RouteTableDef()
