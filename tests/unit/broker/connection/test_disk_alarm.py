"""The disk alarm goes off when the store's writes fail and clears only once they work again with room to spare,
however often the store's health flaps at the edge of a full disk."""

import asyncio

from broker.connection.alarms.disk import CLEAR_FREE_BYTES, DiskAlarm


def run(steps, free):
    """Feed the alarm the store's health changes (or None: a timer tick) while the file system has `free` bytes."""
    changes = []

    async def main():
        alarm = DiskAlarm("/data", changes.append, read_free=lambda path: free[0])
        for step in steps:
            if step is None:
                alarm.check()
            else:
                alarm.store_health_changed(step)
        still_waiting = alarm.timer is not None
        alarm.stop()
        return still_waiting

    return changes, asyncio.run(main())


def test_goes_off_at_the_first_failure_and_stays_on_while_the_disk_is_nearly_full():
    changes, waiting = run([False, True, False, True, None], free=[CLEAR_FREE_BYTES - 1])
    assert (changes, waiting) == ([True], True)


def test_clears_once_writes_work_and_there_is_room():
    free = [0]
    changes = []

    async def main():
        alarm = DiskAlarm("/data", changes.append, read_free=lambda path: free[0])
        alarm.store_health_changed(False)
        alarm.store_health_changed(True)
        free[0] = CLEAR_FREE_BYTES
        alarm.check()  # what the timer does a second later
        assert alarm.timer is None

    asyncio.run(main())
    assert changes == [True, False]


def test_room_alone_does_not_clear_it_while_writes_fail():
    changes, waiting = run([False, None], free=[CLEAR_FREE_BYTES * 10])
    assert (changes, waiting) == ([True], True)


def test_clears_on_health_alone_where_free_space_cannot_be_read():
    changes, waiting = run([False, True], free=[None])
    assert (changes, waiting) == ([True, False], False)


def test_a_healthy_store_raises_nothing():
    assert run([True, None], free=[0]) == ([], False)
