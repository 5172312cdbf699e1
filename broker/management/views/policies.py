"""The management API: policies."""

from aiohttp import web

routes = web.RouteTableDef()
