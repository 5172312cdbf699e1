"""Slowing down repeated failed logins: the delay per consecutive failure, the reset, and bounded memory."""

from broker.connection import login_throttle
from broker.connection.login_throttle import MAX_DELAY, LoginThrottle


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_wait_longer_and_longer_up_to_the_cap():
    throttle = LoginThrottle(Clock())
    waits = [throttle.refused("192.0.2.1", 0.5) for _ in range(8)]
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, MAX_DELAY, MAX_DELAY]


def test_a_successful_login_and_time_start_over_and_addresses_are_counted_apart():
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(3):
        throttle.refused("192.0.2.1", 1.0)
    assert throttle.refused("192.0.2.2", 1.0) == 0.0  # another address is not slowed down
    throttle.accepted("192.0.2.1")
    assert throttle.refused("192.0.2.1", 1.0) == 0.0
    assert throttle.refused("192.0.2.1", 1.0) == 1.0
    clock.now += login_throttle.FORGET_AFTER + 1
    assert throttle.refused("192.0.2.1", 1.0) == 0.0


def test_zero_turns_it_off():
    throttle = LoginThrottle(Clock())
    assert [throttle.refused("192.0.2.1", 0) for _ in range(5)] == [0.0] * 5
    assert not throttle.failures


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(login_throttle, "MAX_ADDRESSES", 100)
    throttle = LoginThrottle(Clock())
    for n in range(1000):
        throttle.refused(f"10.0.{n // 256}.{n % 256}", 1.0)
    assert len(throttle.failures) == 100
    assert "10.0.3.231" in throttle.failures  # the most recent stay
