"""Topic-exchange binding patterns held in a trie of words.

Semantics follow RabbitMQ's rabbit_exchange_type_topic: keys and patterns split on "." into words (the
empty key is zero words, so "a." is ["a", ""] and "a..b" is ["a", "", "b"]); in a pattern "*" matches exactly
one word and "#" matches zero or more words, so "a.#" matches "a" and "#" matches everything, "" included.

A match walks the trie once per routing key: its cost grows with the number of words (and the wildcards met
on the way), never with the number of bindings.
"""

from collections.abc import Hashable

_ONE_WORD = "*"
_ANY_WORDS = "#"


def split_words(key: str) -> list[str]:
    """RabbitMQ's split_topic_key: "" is zero words, every "." separates two (possibly empty) words."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}  # next pattern word -> node
        self.destinations: set = set()  # destinations whose pattern ends here


class TopicTrie:
    """Topic-exchange bindings: patterns of dot-separated words, '*' = exactly one word, '#' = zero or more."""

    def __init__(self) -> None:
        self._root = _Node()
        self._pairs = 0  # number of distinct (pattern, destination) pairs bound

    def bind(self, pattern: str, destination: Hashable) -> None:
        node = self._root
        for word in split_words(pattern):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        if destination not in node.destinations:
            node.destinations.add(destination)
            self._pairs += 1

    def unbind(self, pattern: str, destination: Hashable) -> None:
        """Remove one binding if present, then prune the nodes that no longer lead to any binding."""
        path = [self._root]
        words = split_words(pattern)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        node = path[-1]
        if destination not in node.destinations:
            return
        node.destinations.discard(destination)
        self._pairs -= 1
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str) -> set:
        """Destinations of every pattern that matches routing_key."""
        words = split_words(routing_key)
        count = len(words)
        found: set = set()
        # States are (node, words consumed). Only states entered through a '#' can be reached twice (a trie path
        # without '#' fixes how many words it consumes), so only those are remembered.
        expanded: set = set()
        stack = [(self._root, 0)]
        while stack:
            node, consumed = stack.pop()
            children = node.children
            if consumed == count:
                found |= node.destinations
            elif children:
                word = words[consumed]
                if word != _ANY_WORDS:  # a literal '#' word is consumed by the '#' expansion below
                    child = children.get(word)
                    if child is not None:
                        stack.append((child, consumed + 1))
                if word != _ONE_WORD:  # a literal '*' word already reached the '*' child
                    child = children.get(_ONE_WORD)
                    if child is not None:
                        stack.append((child, consumed + 1))
            hash_child = children.get(_ANY_WORDS)
            if hash_child is not None:
                hash_id = id(hash_child)
                for skip_to in range(consumed, count + 1):
                    if (hash_id, skip_to) not in expanded:
                        expanded.add((hash_id, skip_to))
                        stack.append((hash_child, skip_to))
        return found

    def __len__(self) -> int:
        return self._pairs
