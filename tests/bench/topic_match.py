"""The cost of one topic match on the trie itself, for everyday binding sets and for the worst a client can bind:

    python -m tests.bench.topic_match [--rounds N]

Prints, per binding set, the median time of one TopicTrie.match over its keys and the median for its slowest
key. A benchmark prints figures; it asserts nothing (tests/robustness/test_topic_worst_case.py bounds the worst
sets).
"""

from __future__ import annotations

import argparse
import statistics
import time

from broker.model.routing.topic import TopicTrie
from tests.unit.broker.model.test_topic import ADVERSARIAL_SETS, longest

SYMBOLS = [f"S{index:04d}" for index in range(1000)]
MARKETS = ["nyse", "nasdaq", "lse", "tse"]

EVERYDAY_SETS = {  # binding sets of the kind applications bind, with a few keys they publish
    "3 literal bindings": (["orders.created", "orders.paid", "orders.shipped"], ["orders.paid", "users.created"]),
    "1000 literal bindings": ([f"stock.{symbol}.nyse" for symbol in SYMBOLS],
                              ["stock.S0500.nyse", "stock.S0500.lse"]),
    "1000 literal + wildcards": ([f"stock.{symbol}.nyse" for symbol in SYMBOLS]
                                 + ["stock.*.nasdaq", "stock.#", "#.lse", "*.S0001.*", "stock.S0002.#"],
                                 ["stock.S0500.nyse", "stock.S0001.lse", "bond.x.y"]),
    "logging a.#, #.error": (["app.#", "#.error", "*.*.warning", "app.db.*"],
                             ["app.db.query", "web.front.error", "x.y.warning", "a.b.c.d.e.f.g.h"]),
}

WORST_SETS = {  # per binding, the most a client can make a match cost (keys of up to 255 bytes)
    "'#' then 253 empty words": ["#" + "." * 253],
    "'#.a.a...a' (127 a)": ["#." + longest(["a"], 253)],
    "'#.a' ladder of 126": ["#." + longest(["a"], 2 * k + 1) for k in range(1, 127)],
    "256 prefixes x ladder": [
        ".".join("*" if (mask >> bit) & 1 else "a" for bit in range(8)) + "." + ".".join(["#.a"] * k + ["b"])
        for mask in range(256) for k in range(1, 56, 6)],
    **ADVERSARIAL_SETS,
}
WORST_KEYS = ["." * 255, longest(["a"]), longest(["a", "b"]), longest(["a"], 200) + ".b"]


def match_times(patterns: list[str], keys: list[str], rounds: int) -> dict[str, list[float]]:
    """Seconds per match, per key, for every round."""
    trie = TopicTrie()
    for pattern in patterns:
        trie.bind(pattern, pattern)
    times: dict[str, list[float]] = {key: [] for key in keys}
    for _ in range(rounds):
        for key in keys:
            started = time.perf_counter()
            trie.match(key)
            times[key].append(time.perf_counter() - started)
    return times


def report(title: str, sets: dict[str, tuple[list[str], list[str]]], rounds: int) -> None:
    print(f"{title:32s} {'bindings':>8s} {'median':>11s} {'slowest key':>12s}")
    for name, (patterns, keys) in sets.items():
        times = match_times(patterns, keys, rounds)
        overall = statistics.median([value for per_key in times.values() for value in per_key])
        slowest = max(statistics.median(per_key) for per_key in times.values())
        print(f"{name:32s} {len(patterns):8d} {overall * 1e6:8.2f} us {slowest * 1e6:9.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="matches per key of an everyday set")
    args = parser.parse_args()
    report("everyday set", EVERYDAY_SETS, args.rounds)
    print()
    report("worst set", {name: (patterns, WORST_KEYS) for name, patterns in WORST_SETS.items()},
           max(1, args.rounds // 200))


if __name__ == "__main__":
    main()
