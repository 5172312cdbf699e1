"""The broker-wide budget of bodies in assembly: over it, only the oldest body may go on, so memory stays bounded
and a legitimate message of the largest size always completes."""

from broker.session.limits import BodiesInAssembly, assembly_budget

MIB = 1 << 20


def test_the_budget_is_half_the_memory_limit_but_never_less_than_one_largest_message():
    assert assembly_budget(1024 * MIB, 128 * MIB) == 512 * MIB
    assert assembly_budget(64 * MIB, 128 * MIB) == 128 * MIB


def test_within_the_budget_nobody_is_blocked():
    bodies = BodiesInAssembly(10 * MIB)
    assert not bodies.grew("a", "conn-1", 4 * MIB)
    assert not bodies.grew("b", "conn-2", 6 * MIB)
    assert bodies.total == 10 * MIB


def test_over_the_budget_the_oldest_body_goes_on_and_the_others_wait_their_turn():
    bodies = BodiesInAssembly(10 * MIB)
    bodies.grew("oldest", "conn-1", 6 * MIB)
    bodies.grew("second", "conn-2", 4 * MIB)
    assert bodies.grew("third", "conn-3", 1)  # over: blocked
    assert bodies.grew("second", "conn-2", 1)  # blocked too
    assert not bodies.grew("oldest", "conn-1", 3 * MIB)  # the oldest always completes
    assert set(bodies.finished("oldest")) == {"conn-2", "conn-3"}  # back within the budget
    assert bodies.total == 4 * MIB + 2


def test_a_finished_body_releases_the_blocked_connections_once_back_within_the_budget():
    bodies = BodiesInAssembly(10 * MIB)
    bodies.grew("oldest", "conn-1", 8 * MIB)
    assert bodies.grew("second", "conn-2", 4 * MIB)
    assert bodies.grew("third", "conn-3", 1 * MIB)
    assert set(bodies.finished("oldest")) == {"conn-2", "conn-3"}  # 5 MiB left: within the budget
    assert not bodies.over_budget


def test_while_still_over_the_budget_only_the_new_oldest_may_go_on():
    bodies = BodiesInAssembly(10 * MIB)
    bodies.grew("oldest", "conn-1", 2 * MIB)
    bodies.grew("second", "conn-2", 8 * MIB)
    assert bodies.grew("third", "conn-3", 4 * MIB)
    assert list(bodies.finished("oldest")) == ["conn-2"]
    assert not bodies.grew("second", "conn-2", 1 * MIB)
    assert bodies.grew("third", "conn-3", 1)


def test_a_body_never_counted_finishes_without_effect():
    bodies = BodiesInAssembly(10 * MIB)
    assert list(bodies.finished("single-frame")) == []
    assert bodies.total == 0
