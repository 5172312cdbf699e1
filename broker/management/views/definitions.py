"""The management API: definitions."""

from aiohttp import web

routes = web.RouteTableDef()
