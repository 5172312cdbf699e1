import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.topic import TopicTrie, split_words


def reference_match(pattern: str, routing_key: str) -> bool:
    """Brute-force topic matching, written straight from the definition."""

    def match(p: list[str], w: list[str]) -> bool:
        if not p:
            return not w
        if p[0] == "#":
            return match(p[1:], w) or (bool(w) and match(p, w[1:]))
        if not w:
            return False
        return (p[0] == "*" or p[0] == w[0]) and match(p[1:], w[1:])

    return match(split_words(pattern), split_words(routing_key))


def trie_with(*patterns: str) -> TopicTrie:
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    return trie


def test_split_words_follows_rabbitmq():
    assert split_words("") == []
    assert split_words("a") == ["a"]
    assert split_words("a.") == ["a", ""]
    assert split_words(".") == ["", ""]
    assert split_words("a..b") == ["a", "", "b"]


@pytest.mark.parametrize(
    "pattern, routing_key, expected",
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("*", "a", True),
        ("*", "", False),
        ("*", "a.b", False),
        ("*", ".", False),
        ("*.*", ".", True),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("", "", True),
        ("", "a", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b", False),
        ("#.a", "a", True),
        ("#.a", "x.y.a", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("#.#", "", True),
        ("#.#", "a.b", True),
        ("*.#", "", False),
        ("*.#", "a", True),
        ("#.*", "a.b.c", True),
        ("a.*", "a.", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a.b", "a..b", False),
        ("a", "a.", False),
        ("a.#", "a.", True),
    ],
)
def test_rabbitmq_examples(pattern, routing_key, expected):
    assert reference_match(pattern, routing_key) is expected
    assert (trie_with(pattern).match(routing_key) == {pattern}) is expected


def test_several_destinations_and_patterns():
    trie = TopicTrie()
    trie.bind("stock.#", "q1")
    trie.bind("stock.*.nyse", "q2")
    trie.bind("*.usd.*", "q3")
    trie.bind("stock.#", "q4")
    assert trie.match("stock.usd.nyse") == {"q1", "q2", "q3", "q4"}
    assert trie.match("stock.eur.nyse") == {"q1", "q2", "q4"}
    assert trie.match("bond.usd.x") == {"q3"}
    assert trie.match("bond") == set()


def test_same_destination_matched_by_two_patterns_is_returned_once():
    trie = TopicTrie()
    trie.bind("a.*", "q")
    trie.bind("#", "q")
    assert trie.match("a.b") == {"q"}


def test_len_counts_distinct_pairs():
    trie = TopicTrie()
    trie.bind("a.b", "q1")
    trie.bind("a.b", "q1")
    trie.bind("a.b", "q2")
    trie.bind("#", "q1")
    assert len(trie) == 3
    trie.unbind("a.b", "q1")
    trie.unbind("a.b", "q1")
    trie.unbind("never.bound", "q1")
    trie.unbind("a.b", "never-bound")
    assert len(trie) == 2
    assert trie.match("a.b") == {"q1", "q2"}


def test_unbind_prunes_empty_nodes_but_keeps_shared_prefixes():
    trie = TopicTrie()
    trie.bind("a.b.c", "q1")
    trie.bind("a.b", "q2")
    trie.unbind("a.b.c", "q1")
    assert trie.match("a.b.c") == set()
    assert trie.match("a.b") == {"q2"}
    assert list(trie._root.children) == ["a"]
    trie.unbind("a.b", "q2")
    assert trie._root.children == {}
    assert len(trie) == 0


def test_literal_wildcard_words_in_routing_key():
    trie = trie_with("a.*", "a.#", "a.b")
    assert trie.match("a.*") == {"a.*", "a.#"}
    assert trie.match("a.#") == {"a.*", "a.#"}


words = st.sampled_from(["a", "b", "", "*", "#"])
keys = st.lists(words, max_size=6).map(".".join)


@settings(max_examples=400, deadline=None)
@given(patterns=st.lists(keys, max_size=12), routing_key=keys)
def test_trie_agrees_with_brute_force(patterns, routing_key):
    trie = TopicTrie()
    for index, pattern in enumerate(patterns):
        trie.bind(pattern, index)
    expected = {index for index, pattern in enumerate(patterns) if reference_match(pattern, routing_key)}
    assert trie.match(routing_key) == expected


@settings(max_examples=200, deadline=None)
@given(
    patterns=st.lists(st.tuples(keys, st.integers(0, 3)), max_size=12),
    removed=st.lists(st.tuples(keys, st.integers(0, 3)), max_size=12),
    routing_keys=st.lists(keys, max_size=5),
)
def test_bind_unbind_agrees_with_a_set_of_pairs(patterns, removed, routing_keys):
    trie = TopicTrie()
    pairs = set()
    for pattern, destination in patterns:
        trie.bind(pattern, destination)
        pairs.add((pattern, destination))
    for pattern, destination in removed:
        trie.unbind(pattern, destination)
        pairs.discard((pattern, destination))
    assert len(trie) == len(pairs)
    for routing_key in routing_keys:
        expected = {d for p, d in pairs if reference_match(p, routing_key)}
        assert trie.match(routing_key) == expected
    for pattern, destination in pairs:
        trie.unbind(pattern, destination)
    assert trie._root.children == {} and not trie._root.destinations
