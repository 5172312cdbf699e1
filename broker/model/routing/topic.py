"""Topic-exchange binding patterns held in a trie of words.

Semantics follow RabbitMQ's rabbit_exchange_type_topic: keys and patterns split on "." into words (the
empty key is zero words, so "a." is ["a", ""] and "a..b" is ["a", "", "b"]); in a pattern "*" matches exactly
one word and "#" matches zero or more words, so "a.#" matches "a" and "#" matches everything, "" included.

Patterns are stored in a canonical form that matches the same keys: every run of wildcard words that holds a
"#" becomes its "*"s followed by one "#" ("#.#" is "#", "#.*.#" is "*.#"), so a "#" never follows a "#".
Bindings are still told apart by their pattern as given ("#.#" and "#" are two bindings, as in RabbitMQ).

A match walks the trie once: no node is visited twice, so a match costs at most the size of the trie, whatever
patterns are bound and whatever the key. Until a "#" is reached a node is reached after exactly as many words as it
is deep, and the walk reads the key word by word. Below a "#" a node may be reached after any number of words: the
walk then carries, for each node, the set of word positions it is reached at as the bits of one integer, and takes
a child's set from its parent's with a shift and a mask (bit-parallel matching, as in Shift-And), instead of
visiting the node again for every word.
"""

from collections.abc import Hashable

_ONE_WORD = "*"
_ANY_WORDS = "#"


def split_words(key: str) -> list[str]:
    """RabbitMQ's split_topic_key: "" is zero words, every "." separates two (possibly empty) words."""
    return key.split(".") if key else []


def canonical_words(pattern: str) -> list[str]:
    """The pattern's words with each run of wildcards holding a "#" rewritten as its "*"s then a single "#"."""
    words: list[str] = []
    stars = 0  # "*" words in the current run of wildcards
    any_words = False  # whether that run holds a "#"
    for word in split_words(pattern) + [None]:  # None ends the last run
        if word == _ONE_WORD:
            stars += 1
        elif word == _ANY_WORDS:
            any_words = True
        else:
            words += [_ONE_WORD] * stars + [_ANY_WORDS] * any_words
            stars, any_words = 0, False
            if word is not None:
                words.append(word)
    return words


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}  # next pattern word -> node
        self.destinations: dict[Hashable, set[str]] = {}  # destination -> its patterns (as given) that end here


class TopicTrie:
    """Topic-exchange bindings: patterns of dot-separated words, '*' = exactly one word, '#' = zero or more."""

    def __init__(self) -> None:
        self._root = _Node()
        self._pairs = 0  # number of distinct (pattern, destination) pairs bound

    def bind(self, pattern: str, destination: Hashable) -> None:
        node = self._root
        for word in canonical_words(pattern):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        patterns = node.destinations.setdefault(destination, set())
        if pattern not in patterns:
            patterns.add(pattern)
            self._pairs += 1

    def unbind(self, pattern: str, destination: Hashable) -> None:
        """Remove one binding if present, then prune the nodes that no longer lead to any binding."""
        path = [self._root]
        words = canonical_words(pattern)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        node = path[-1]
        patterns = node.destinations.get(destination)
        if patterns is None or pattern not in patterns:
            return
        patterns.discard(pattern)
        if not patterns:
            del node.destinations[destination]
        self._pairs -= 1
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str) -> set:
        """Destinations of every pattern that matches routing_key."""
        words = split_words(routing_key)
        found: set = set()
        any_words: list[tuple[_Node, int]] = []  # "#" nodes reached, each with the first word it may take
        current = [self._root]  # nodes reached with the words read so far (each has one parent: no duplicates)
        for index, word in enumerate(words):
            following = []
            for node in current:
                children = node.children
                if not children:
                    continue
                child = children.get(_ANY_WORDS)
                if child is not None:
                    any_words.append((child, index))
                if word != _ANY_WORDS:  # a literal "#" word is taken by the "#" nodes, which take any word
                    child = children.get(word)
                    if child is not None:
                        following.append(child)
                if word != _ONE_WORD:  # a literal "*" word already reached the "*" child
                    child = children.get(_ONE_WORD)
                    if child is not None:
                        following.append(child)
            current = following
            if not current:
                break
        for node in current:
            found.update(node.destinations)
            child = node.children.get(_ANY_WORDS)
            if child is not None:
                any_words.append((child, len(words)))
        if any_words:
            _match_below_any_words(any_words, words, found)
        return found

    def __len__(self) -> int:
        return self._pairs


def _match_below_any_words(reached: list[tuple[_Node, int]], words: list[str], found: set) -> None:
    """Add to found the destinations of the "#" nodes reached (each with the first word it may take) and of the
    nodes below them. A node's positions are the bits of one integer: bit i set when the node is reached with the
    first i words read; bit len(words) set when it is reached with all of them, where its patterns match."""
    end = 1 << len(words)
    every_position = (end << 1) - 1
    taking_a_word = end - 1  # positions from which one more word can be taken
    positions_of: dict[str, int] | None = None  # literal word -> positions of the key holding it, built when needed
    pending: list[tuple[_Node, int]] = []  # (node, its positions), each node met once
    for node, first in reached:
        found.update(node.destinations)  # the "#" takes every remaining word
        if node.children:
            pending.append((node, every_position ^ ((1 << first) - 1)))
    while pending:
        node, positions = pending.pop()
        if positions & end:
            found.update(node.destinations)
        children = node.children
        child = children.get(_ANY_WORDS)
        if child is not None:  # reached from the first of node's positions on
            pending.append((child, every_position ^ ((positions & -positions) - 1)))
        taking = positions & taking_a_word
        if not taking:
            continue
        child = children.get(_ONE_WORD)
        if child is not None:
            pending.append((child, taking << 1))
        if positions_of is None:
            positions_of = _positions_of_literal_words(words)
        _reach_literal_children(children, taking, positions_of, pending)


def _reach_literal_children(children: dict[str, _Node], taking: int, positions_of: dict[str, int],
                            pending: list[tuple[_Node, int]]) -> None:
    """Add to pending each child reached through its literal word from the positions taking, looked up from the
    smaller side (the node's children or the key's words): a node with many children costs no more than the key."""
    if len(children) <= len(positions_of):
        for word, child in children.items():
            following = (taking & positions_of.get(word, 0)) << 1
            if following:
                pending.append((child, following))
    else:
        for word, word_positions in positions_of.items():
            literal_child = children.get(word)
            if literal_child is not None and taking & word_positions:
                pending.append((literal_child, (taking & word_positions) << 1))


def _positions_of_literal_words(words: list[str]) -> dict[str, int]:
    """Each word of the key with the positions that hold it, as the bits of one integer. "*" and "#" are left out:
    a "*" or "#" child is no literal child, it is reached apart (a literal "*" word reaches the "*" child, which
    takes any word, and a literal "#" word reaches only the "#" children)."""
    positions: dict[str, int] = {}
    for index, word in enumerate(words):
        if word != _ONE_WORD and word != _ANY_WORDS:
            positions[word] = positions.get(word, 0) | (1 << index)
    return positions
