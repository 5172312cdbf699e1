import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.model.routing.topic import TopicTrie, canonical_words, split_words


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
    assert dp_match(pattern, routing_key) is expected
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


def dp_match(pattern: str, routing_key: str) -> bool:
    """Topic matching by dynamic programming over (pattern words, key words): polynomial, for long inputs."""
    p, w = split_words(pattern), split_words(routing_key)
    # matches[j]: whether the pattern words read so far match the first j key words
    matches = [True] + [False] * len(w)
    for word in p:
        if word == "#":
            for j in range(1, len(w) + 1):
                matches[j] = matches[j] or matches[j - 1]
        else:
            matches = [False] + [matches[j] and (word == "*" or word == w[j]) for j in range(len(w))]
    return matches[-1]


@pytest.mark.parametrize(
    "pattern, canonical",
    [
        ("#.#", ["#"]), ("#.#.#.#", ["#"]), ("#.*", ["*", "#"]), ("*.#.*.#", ["*", "*", "#"]),
        ("a.#.#.b.#", ["a", "#", "b", "#"]), ("#.a.#", ["#", "a", "#"]), ("*.*", ["*", "*"]), ("", []),
        ("a..#.#", ["a", "", "#"]),
    ],
)
def test_runs_of_wildcards_holding_a_hash_are_collapsed(pattern, canonical):
    assert canonical_words(pattern) == canonical


def test_patterns_that_collapse_alike_stay_distinct_bindings():
    trie = TopicTrie()
    trie.bind("#.#", "q")
    trie.bind("#", "q")
    trie.bind("#.*", "q2")
    trie.bind("*.#", "q2")
    assert len(trie) == 4
    trie.unbind("#.#", "q")
    assert trie.match("a.b") == {"q", "q2"}  # "#" still binds q
    trie.unbind("#.*", "q2")
    assert trie.match("a") == {"q", "q2"}
    trie.unbind("#", "q")
    trie.unbind("*.#", "q2")
    assert len(trie) == 0 and trie.match("a") == set() and trie._root.children == {}


def longest(unit: list[str], limit: int = 255) -> str:
    """Repeat the words of unit as long as the joined key stays within limit bytes (AMQP short strings)."""
    words: list[str] = []
    while len(".".join(words + [unit[len(words) % len(unit)]])) <= limit:
        words.append(unit[len(words) % len(unit)])
    return ".".join(words)


ADVERSARIAL_SETS = {
    "#.#.#": [longest(["#"])],
    "*.#.*.#": [longest(["*", "#"])],
    "#.a.#.a": [longest(["#", "a"])],
    "#.a.b.#.a.b": [longest(["#", "a", "b"])],
    "#.*.a": [longest(["#", "*", "a"])],
    "ladder #.a...#.b": [".".join(["#.a"] * k + ["b"]) for k in range(1, 64)],
    "ladder #.a...#.*.b": [".".join(["#.a"] * k + ["*", "b"]) for k in range(1, 63)],
}
LONG_KEYS = [longest(["a"]), longest(["a", "b"]), longest(["a", "b", "c"]), longest(["a"], 200) + ".b",
             longest(["a"], 250) + ".b.c", longest(["b"])]


@pytest.mark.parametrize("name", ADVERSARIAL_SETS)
def test_adversarial_patterns_match_as_the_definition_says(name):
    patterns = ADVERSARIAL_SETS[name]
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    for routing_key in LONG_KEYS:
        assert trie.match(routing_key) == {p for p in patterns if dp_match(p, routing_key)}, routing_key


long_words = st.sampled_from(["a", "b", "*", "#", "#", ""])


@settings(max_examples=200, deadline=None)
@given(patterns=st.lists(st.lists(long_words, max_size=25).map(".".join), max_size=8),
       routing_key=st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=40).map(".".join))
def test_trie_agrees_with_the_definition_on_long_keys(patterns, routing_key):
    trie = TopicTrie()
    for index, pattern in enumerate(patterns):
        trie.bind(pattern, index)
    assert trie.match(routing_key) == {i for i, p in enumerate(patterns) if dp_match(p, routing_key)}
