"""Topic matching stays cheap for adversarial binding sets: one '#.#.#...' binding used to cost 262 ms per
publish (every '#' expanded over every remaining word from every state). Costs are medians of many matches on
the trie itself, with bounds generous enough for a shared machine (the figures measured are in docs/compatibility.md)."""

import pytest

from tests.bench.adversarial import median_match_ms
from tests.unit.broker.model.test_topic import ADVERSARIAL_SETS

pytestmark = pytest.mark.alone  # it times adversarial topic matches

SINGLE_BINDING_SETS = [name for name, patterns in ADVERSARIAL_SETS.items() if len(patterns) == 1]
LADDERS = [name for name, patterns in ADVERSARIAL_SETS.items() if len(patterns) > 1]


@pytest.mark.parametrize("name", SINGLE_BINDING_SETS)
def test_one_adversarial_binding_costs_well_under_a_millisecond(name):
    assert median_match_ms(ADVERSARIAL_SETS[name], rounds=30) < 1.0


@pytest.mark.parametrize("name", LADDERS)
def test_sixty_adversarial_bindings_cost_a_few_milliseconds_at_most(name):
    # Every binding of a ladder keeps a state alive for each word of the key: the cost grows with the number
    # of bindings (linearly), and stays far from the tens of milliseconds a single binding used to cost.
    assert median_match_ms(ADVERSARIAL_SETS[name], rounds=5) < 10.0
