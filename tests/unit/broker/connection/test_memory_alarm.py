"""The memory alarm goes off above its limit and clears only well below it."""

import asyncio

from broker.connection.alarms.memory import MemoryAlarm, memory_limit, resident_bytes


def test_alarm_goes_off_above_the_limit_and_clears_below_90_percent():
    readings = iter([50, 101, 100, 95, 89, 120])
    changes = []

    async def run():
        alarm = MemoryAlarm(100, changes.append, read_memory=lambda: next(readings))
        for _ in range(6):
            alarm.check()
        alarm.stop()

    asyncio.run(run())
    assert changes == [True, False, True]


def test_limit_is_absolute_when_given_else_a_share_of_the_machine():
    assert memory_limit(0.4, 12345) == 12345
    assert 0 < memory_limit(0.4, 0) < memory_limit(0.8, 0)


def test_resident_memory_is_read_from_proc():
    assert resident_bytes() > 1_000_000
