"""The worst binding sets a client can build cost a match no more than the size of the trie: below a "#" a node
used to be visited again for every word of the key, so one binding "#" followed by 253 empty words cost about 5 ms
per publish of a key of 256 empty words, and 2,560 long ladder bindings about 150 ms. Costs are medians of a few
matches on the trie itself (figures: python -m tests.bench.topic_match), with bounds generous enough for a shared
machine."""

import statistics
import time

import pytest

from broker.model.routing.topic import TopicTrie
from tests.bench.topic_match import WORST_KEYS, WORST_SETS
from tests.unit.broker.model.test_topic import dp_match

pytestmark = pytest.mark.alone  # it times the worst topic matches

SINGLE_BINDINGS = [name for name, patterns in WORST_SETS.items() if len(patterns) == 1]


def slowest_key_ms(patterns: list[str], rounds: int) -> float:
    """The median cost of one match for the routing key of WORST_KEYS that costs most."""
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    costs = []
    for key in WORST_KEYS:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            trie.match(key)
            times.append(time.perf_counter() - started)
        costs.append(statistics.median(times))
    return max(costs) * 1000


@pytest.mark.parametrize("name", WORST_SETS)
def test_worst_sets_match_as_the_definition_says(name):
    patterns = WORST_SETS[name]
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    for key in WORST_KEYS:
        assert trie.match(key) == {pattern for pattern in patterns if dp_match(pattern, key)}


@pytest.mark.parametrize("name", SINGLE_BINDINGS)
def test_one_binding_costs_well_under_a_millisecond_whatever_the_key(name):
    assert slowest_key_ms(WORST_SETS[name], rounds=15) < 1.0


def test_a_ladder_of_126_bindings_costs_under_a_millisecond():
    assert slowest_key_ms(WORST_SETS["'#.a' ladder of 126"], rounds=15) < 1.0


def test_thousands_of_long_ladder_bindings_cost_tens_of_milliseconds_at_most():
    # 2,560 bindings of about 120 words: about 28,000 trie nodes, each visited once at most.
    assert slowest_key_ms(WORST_SETS["256 prefixes x ladder"], rounds=3) < 60.0
