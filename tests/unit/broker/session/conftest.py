"""Each test here runs inside an event loop, as a channel does: queues dispatch and timers start on the running
loop. A test drives it by hand (channel_host.Host.turn plays the end of a loop turn), so it needs no await; one
whose channel goes on over later loop turns (a settlement of many deliveries) is a coroutine that awaits them."""

from __future__ import annotations

import asyncio

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem) -> bool:
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        result = pyfuncitem.obj(**arguments)
        if asyncio.iscoroutine(result):
            await result

    asyncio.run(run())
    return True
