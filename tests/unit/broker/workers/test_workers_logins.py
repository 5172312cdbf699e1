"""Refused AMQP logins counted for the whole node: two workers' refusals from one address add up in the supervisor,
a success through either starts the address over, and a worker whose supervisor is gone counts by itself."""

import asyncio
import socket

from broker.connection.login_throttle import LoginThrottle
from broker.workers.logins import NodeLoginThrottle, serve_logins

DELAY = 0.5
ADDRESS = "192.0.2.1"


async def refuse(throttle: NodeLoginThrottle, address: str = ADDRESS) -> float:
    """The wait the throttle hands a refused login from address."""
    waited = asyncio.get_running_loop().create_future()
    throttle.refuse(address, DELAY, waited.set_result)
    return await asyncio.wait_for(waited, 5)


async def workers(count: int, supervisor: LoginThrottle) -> tuple[list[NodeLoginThrottle], list[asyncio.Task]]:
    """count workers' throttles, each on a socket pair of its own to the supervisor's count."""
    throttles, served = [], []
    for _ in range(count):
        theirs, ours = socket.socketpair()
        served.append(asyncio.get_running_loop().create_task(serve_logins(theirs, supervisor)))
        throttle = NodeLoginThrottle(ours)
        await throttle.start()
        throttles.append(throttle)
    return throttles, served


def test_refusals_through_two_workers_are_counted_together_and_a_success_starts_over():
    async def main() -> None:
        (first, second), _ = await workers(2, LoginThrottle())
        waits = [await refuse(first), await refuse(second), await refuse(first), await refuse(second)]
        assert waits == [0.0, DELAY, 2 * DELAY, 4 * DELAY]
        assert await refuse(second, "192.0.2.2") == 0.0  # another address is counted apart
        first.accepted(ADDRESS)
        assert await refuse(second) == 0.0  # (the success, written first, is counted first)

    asyncio.run(main())


def test_refusals_asked_at_once_are_answered_in_order():
    async def main() -> None:
        (first,), _ = await workers(1, LoginThrottle())
        waits: list[float] = []
        done = asyncio.Event()
        for _ in range(4):
            first.refuse(ADDRESS, DELAY, lambda wait: (waits.append(wait), len(waits) == 4 and done.set()))
        await asyncio.wait_for(done.wait(), 5)
        assert waits == [0.0, DELAY, 2 * DELAY, 4 * DELAY]

    asyncio.run(main())


def test_a_worker_whose_supervisor_is_gone_counts_by_itself():
    async def main() -> None:
        (first,), (served,) = await workers(1, LoginThrottle())
        assert await refuse(first) == 0.0  # counted by the supervisor, not here
        served.cancel()  # the supervisor goes: its end of the socket closes
        await asyncio.wait_for(first.reading, 5)
        assert [await refuse(first), await refuse(first)] == [0.0, DELAY]

    asyncio.run(main())


def test_a_delay_of_zero_is_answered_at_once_without_asking():
    async def main() -> None:
        theirs, ours = socket.socketpair()
        throttle = NodeLoginThrottle(ours)
        await throttle.start()
        answers: list[float] = []
        throttle.refuse(ADDRESS, 0, answers.append)
        assert answers == [0.0] and not throttle.asked
        theirs.close()

    asyncio.run(main())
