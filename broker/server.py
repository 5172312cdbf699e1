"""The TCP server: accepts connections, owns the virtual host, shuts down cleanly."""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
from importlib import metadata
from pathlib import Path

from broker.config import Config
from broker.connection import Connection
from broker.durability import restore
from broker.memory_alarm import MemoryAlarm, memory_limit
from broker.vhost import VirtualHost
from storage.store import MessageStore

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 3.0  # seconds clients get to answer connection.close before their sockets are closed


def _version() -> str:
    try:
        return metadata.version("warren")
    except metadata.PackageNotFoundError:
        return "0.0.0"


class Server:
    def __init__(self, config: Config):
        self.config = config
        self.store = MessageStore(Path(config.data_dir))
        self.vhost = VirtualHost(config.default_vhost, self.store)
        self.connections: set[Connection] = set()
        self.version = _version()
        self.platform = f"Python {platform.python_version()}"
        self.listener: asyncio.base_events.Server | None = None
        limit = memory_limit(config.memory_high_watermark, config.memory_limit)
        self.memory_alarm = MemoryAlarm(limit, self._memory_alarm_changed)  # blocks publishers above the limit
        # Why publishing connections are blocked (connection.blocked's reason, e.g. "low on memory"); None = not
        self.alarm: str | None = None

    def _memory_alarm_changed(self, active: bool) -> None:
        self.alarm = "low on memory" if active else None
        if active:
            log.warning("memory alarm: resident memory above %d bytes; publishing connections are blocked",
                        self.memory_alarm.limit)
        else:
            log.warning("memory alarm cleared; publishing connections may go on")
            for connection in list(self.connections):
                connection.unblock()

    async def start(self) -> None:
        """Recover durable state from the data dir, then listen."""
        # Recovery makes millions of long-lived objects at once: collecting meanwhile only walks them again and
        # again, and once frozen they stay out of every later full collection.
        gc.disable()
        try:
            restore(self.vhost, self.store.recover())
        finally:
            gc.freeze()
            gc.enable()
        self.memory_alarm.start()
        loop = asyncio.get_running_loop()
        self.listener = await loop.create_server(lambda: Connection(self), self.config.host, self.config.port,
                                                 reuse_address=True, backlog=1024)
        host, port = self.listener.sockets[0].getsockname()[:2]
        log.info("Warren %s listening on %s:%d", self.version, host, port)

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, send every client connection.close 320 CONNECTION_FORCED, wait for them to go."""
        if self.listener is not None:
            self.listener.close()
        connections = list(self.connections)
        for connection in connections:
            connection.close_for_shutdown()
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_GRACE
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection._terminate()
        if self.listener is not None:
            await self.listener.wait_closed()
        self.memory_alarm.stop()
        self.store.close()
        log.info("Warren stopped")
