"""Refused AMQP logins counted for the whole node: two workers' refusals from one address add up in the supervisor,
a success through either starts the address over, and a worker whose supervisor is gone counts by itself."""

import asyncio
import socket
from contextlib import asynccontextmanager
from typing import AsyncIterator

from broker.connection.login_throttle import LoginThrottle
from broker.workers.logins import NodeLoginThrottle, serve_logins

DELAY = 0.5
ADDRESS = "192.0.2.1"


async def refuse(throttle: NodeLoginThrottle, address: str = ADDRESS) -> float:
    """The wait the throttle hands a refused login from address."""
    waited = asyncio.get_running_loop().create_future()
    throttle.count_refused(address, DELAY, waited.set_result)
    return await asyncio.wait_for(waited, 5)


@asynccontextmanager
async def workers(count: int) -> AsyncIterator[tuple[list[NodeLoginThrottle], list[asyncio.Task]]]:
    """count workers' throttles, each on a socket pair of its own to one supervisor's count (and its serving task);
    everything closed after."""
    supervisor = LoginThrottle()
    throttles, served = [], []
    for _ in range(count):
        theirs, ours = socket.socketpair()
        served.append(asyncio.get_running_loop().create_task(serve_logins(theirs, supervisor)))
        throttle = NodeLoginThrottle(ours)
        await throttle.start()
        throttles.append(throttle)
    try:
        yield throttles, served
    finally:
        for task in served:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*(throttle.reading for throttle in throttles)), 5)


def test_refusals_through_two_workers_are_counted_together_and_a_success_starts_over():
    async def main() -> None:
        async with workers(2) as ((first, second), _):
            waits = [await refuse(first), await refuse(second), await refuse(first), await refuse(second)]
            assert waits == [0.0, DELAY, 2 * DELAY, 4 * DELAY]
            assert await refuse(second, "192.0.2.2") == 0.0  # another address is counted apart
            first.accepted(ADDRESS)
            await refuse(first, "192.0.2.3")  # answered once the supervisor has read the success before it
            assert await refuse(second) == 0.0

    asyncio.run(main())


def test_refusals_asked_at_once_are_answered_in_order():
    async def main() -> None:
        async with workers(1) as ((first,), _):
            waits: list[float] = []
            done = asyncio.Event()
            for _ in range(4):
                first.count_refused(ADDRESS, DELAY, lambda wait: (waits.append(wait), len(waits) == 4 and done.set()))
            await asyncio.wait_for(done.wait(), 5)
            assert waits == [0.0, DELAY, 2 * DELAY, 4 * DELAY]

    asyncio.run(main())


def test_a_worker_whose_supervisor_is_gone_counts_by_itself():
    async def main() -> None:
        async with workers(1) as ((first,), (served,)):
            assert await refuse(first) == 0.0  # counted by the supervisor, not here
            served.cancel()  # the supervisor goes: its end of the socket closes
            await asyncio.wait_for(first.reading, 5)
            assert [await refuse(first), await refuse(first)] == [0.0, DELAY]

    asyncio.run(main())


def test_a_failing_answer_leaves_the_others_answered():
    async def main() -> None:
        async with workers(1) as ((first,), _):
            def broken(wait: float) -> None:
                raise RuntimeError("a connection's bug")

            first.count_refused(ADDRESS, DELAY, broken)
            assert await refuse(first) == DELAY  # still read, and the failed one was counted

    asyncio.run(main())


def test_a_delay_of_zero_is_answered_at_once_without_asking():
    async def main() -> None:
        async with workers(1) as ((first,), _):
            answers: list[float] = []
            first.count_refused(ADDRESS, 0, answers.append)
            assert answers == [0.0] and not first.asked

    asyncio.run(main())
