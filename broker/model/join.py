"""One callback for several asynchronous parts (the disk and the processes that own queues: broker.crossing)."""

from __future__ import annotations

import asyncio
from typing import Callable


class Join:
    """callback(ok) once each part said whether it went well (ok: all did); parts may be added until then."""

    __slots__ = ("callback", "left", "ok")

    def __init__(self, callback: Callable[[bool], None], parts: int):
        self.callback = callback
        self.left = parts  # parts still to say
        self.ok = True
        if not parts:
            asyncio.get_running_loop().call_soon(callback, True)

    def done(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.left -= 1
        if not self.left:
            self.callback(self.ok)
