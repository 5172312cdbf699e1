"""Topic-exchange binding patterns held in a trie of words.

Semantics follow RabbitMQ's rabbit_exchange_type_topic: keys and patterns split on "." into words (the
empty key is zero words, so "a." is ["a", ""] and "a..b" is ["a", "", "b"]); in a pattern "*" matches exactly
one word and "#" matches zero or more words, so "a.#" matches "a" and "#" matches everything, "" included.

Patterns are stored in a canonical form that matches the same keys: every run of wildcard words that holds a
"#" becomes its "*"s followed by one "#" ("#.#" is "#", "#.*.#" is "*.#"), so a "#" never follows a "#".
Bindings are still told apart by their pattern as given ("#.#" and "#" are two bindings, as in RabbitMQ).

A match reads the routing key once, word by word, keeping the trie nodes reached after each word; a "#" node,
once reached, stays reached for every later word (it can absorb them all), so it is visited once per word
instead of being expanded over every remaining position. The cost is at most (words + 1) x (nodes reached),
never exponential, whatever patterns are bound.
"""

from collections.abc import Hashable, Iterable
from itertools import chain

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
        current: Iterable[_Node] = (self._root,)  # nodes other than "#" nodes reached with the words read so far
        any_words = _ReachedAnyWords()
        for word in split_words(routing_key):
            following: set[_Node] = set()  # nodes reached once the word is read
            # The active "#" nodes come after current: only nodes of current reach new "#" nodes (a "#" never
            # follows a "#"), so active is complete and unchanged by the time it is read.
            for node in chain(current, any_words.active):
                children = node.children
                if not children:
                    continue
                child = children.get(_ANY_WORDS)
                if child is not None:
                    any_words.reach(child)
                if word != _ANY_WORDS:  # a literal "#" word is taken by the "#" nodes, which take any word
                    child = children.get(word)
                    if child is not None:
                        following.add(child)
                if word != _ONE_WORD:  # a literal "*" word already reached the "*" child
                    child = children.get(_ONE_WORD)
                    if child is not None:
                        following.add(child)
            current = following
        found: set = set()
        for node in current:
            child = node.children.get(_ANY_WORDS)
            if child is not None:
                any_words.reach(child)
            found.update(node.destinations)
        for node in any_words.reached:
            found.update(node.destinations)
        return found

    def __len__(self) -> int:
        return self._pairs


class _ReachedAnyWords:
    """The "#" nodes reached so far in one match. Each stays reached for every later word, since it can take
    them all; it is visited for each word while it may still lead somewhere new."""

    __slots__ = ("reached", "active", "_waiting")

    def __init__(self) -> None:
        self.reached: set[_Node] = set()  # every "#" node reached
        self.active: dict[_Node, None] = {}  # reached "#" nodes to visit for the next word (insertion-ordered set)
        self._waiting: dict[_Node, list[_Node]] = {}  # "#" node -> active ones whose only path leads to it

    def reach(self, node: _Node) -> None:
        """Reach a "#" node: it matches zero words, so it is reached where its parent is."""
        if node in self.reached:
            return
        self.reached.add(node)
        for finished in self._waiting.pop(node, ()):
            del self.active[finished]  # the "#" its only path leads to is reached: nothing new down that path
        following = _sole_following_any_words(node)
        if following is None:
            self.active[node] = None
        elif following not in self.reached:
            self.active[node] = None
            self._waiting.setdefault(following, []).append(node)


def _sole_following_any_words(any_words: _Node) -> _Node | None:
    """The "#" node that is the only way on from any_words, through nodes with one child and no destinations,
    as in "#.a.*.#"; None if there is none. Once that "#" is reached, any_words has nothing new to reach:
    without this, a pattern "#.a.#.a.#..." keeps every one of its "#" nodes busy for every word."""
    node = any_words
    while len(node.children) == 1:
        [(word, child)] = node.children.items()
        if word == _ANY_WORDS:
            return child
        if child.destinations:
            return None
        node = child
    return None
