"""What the cluster's unit tests share: waiting for a condition on the running loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

TIMEOUT = 10.0  # seconds any awaited change may take


async def until(condition: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    """Poll ``condition`` every 10 ms until it is true; AssertionError naming ``what`` after ``timeout``."""
    async def poll():
        while not condition():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(poll(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: not within {timeout} s") from None
