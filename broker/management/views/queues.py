"""The management API: queues."""

from aiohttp import web

routes = web.RouteTableDef()
