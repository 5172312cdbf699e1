"""Policies and operator policies: named, prioritised sets of queue and exchange settings applied by name pattern,
with RabbitMQ 3.10's validation texts (rabbit_policy, rabbit_policies) and its rules for combining them.

A queue or exchange has at most one policy and one operator policy: of those whose pattern matches its name
(re:run, a search) and whose apply-to covers it, the one of highest priority (on a tie, the greatest name, as the
reference picks). The two merge key by key; for a key both set, the lower value wins (operator policies cap
limits). A queue's own x-arguments then combine with the merged keys: for limits and TTLs the lower value wins,
for the rest the argument wins (rabbit_amqqueue_process's res_min / res_arg).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Callable, Iterable, NamedTuple

from broker.model.arguments.queue import LEADER_LOCATORS
from broker.model.patterns import PatternError, compile_pattern

APPLY_TO = ("all", "queues", "exchanges")


class PolicyError(ValueError):
    """A policy RabbitMQ refuses; str() is its reply's reason."""

    def __init__(self, problem: str):
        super().__init__(f"Validation failed\n\n{problem}\n")
        self.problem = problem  # what is wrong, without RabbitMQ's framing


class PolicyKey(NamedTuple):
    valid: Callable[[object], bool]  # whether a JSON value is acceptable
    refusal: str  # RabbitMQ's text after the printed value when it is not
    kind: str  # "queues" or "exchanges": what it configures ("any": neither's settings, read by federation)
    lowest_wins: bool  # True: the lower of policy, operator policy and argument applies; else the argument wins
    operator: bool  # an operator policy may set it
    # (policy value, operator policy value) -> the one that applies, where it is not the lower one
    merge: Callable[[object, object], object] | None = None
    # (policy value, argument) -> the one that applies, where lowest_wins does not say it
    resolve: Callable[[object, object], object] | None = None


def _integer_from(low: int) -> Callable[[object], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


def _one_of(*allowed: str) -> Callable[[object], bool]:
    return lambda value: value in allowed


def _name(value) -> bool:
    return isinstance(value, str)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _limit_or_unlimited(first, second):
    """RabbitMQ 4's delivery-limit: a negative value means no limit; when one side sets none, the other side's
    limit is kept (the more conservative), else the lower limit applies."""
    return max(first, second) if first < 0 or second < 0 else min(first, second)


def _second(first, second):
    return second


def _first(first, second):
    return first


# rabbit_policies' validators, for the keys Warren acts on; a later feature adds its own line.
KEYS: dict[str, PolicyKey] = {
    "alternate-exchange": PolicyKey(_name, "is not a valid alternate exchange name", "exchanges", False, False),
    "dead-letter-exchange": PolicyKey(_name, "is not a valid dead letter exchange name", "queues", False, False),
    "dead-letter-routing-key": PolicyKey(_name, "is not a valid dead letter routing key", "queues", False, False),
    "message-ttl": PolicyKey(_integer_from(0), "is not a valid message TTL", "queues", True, True),
    "expires": PolicyKey(_integer_from(1), "is not a valid queue expiry", "queues", True, True),
    "max-length": PolicyKey(_integer_from(0), "is not a valid maximum length", "queues", True, True),
    "max-length-bytes": PolicyKey(_integer_from(0), "is not a valid maximum length in bytes", "queues", True, True),
    "overflow": PolicyKey(_one_of("drop-head", "reject-publish", "reject-publish-dlx"),
                          "is not a valid overflow value", "queues", False, False),
    "consumer-timeout": PolicyKey(_integer_from(0), "is not a valid consumer timeout", "queues", True, False),
    # where a queue is placed (RabbitMQ 4 takes both on every queue type; the policy's value wins over the argument).
    # rabbit_policies lists the leader locator's values itself, without "min-masters"; the master locator's are
    # rabbit_queue_location's, the arguments' (LEADER_LOCATORS)
    "queue-leader-locator": PolicyKey(_one_of("client-local", "balanced", "random", "least-leaders"),
                                      "is not a valid queue leader locator value", "queues", False, False, None,
                                      _first),
    "queue-master-locator": PolicyKey(_one_of(*LEADER_LOCATORS), "is not a valid master locator", "queues", False,
                                      True, _second, _first),  # 3.x's name, deprecated in 4.0
    # RabbitMQ 4's quorum-queue keys (rabbit_policies, rabbit_quorum_queue), which Warren applies to every queue
    "delivery-limit": PolicyKey(_integer, "is not a valid delivery limit", "queues", True, True,
                                _limit_or_unlimited, _limit_or_unlimited),
    "delayed-retry-type": PolicyKey(
        _one_of("all", "failed", "returned", "disabled"),
        "is not a valid delayed retry type. Must be one of: all, failed, returned, disabled", "queues", False, True,
        _second, _first),  # the operator policy's wins, then the policy's over the argument (4.3)
    "delayed-retry-min": PolicyKey(_integer_from(1), "is not a valid delayed retry minimum delay. Must be a positive "
                                   "integer", "queues", True, True, max),  # an operator raises the minimum
    "delayed-retry-max": PolicyKey(_integer_from(1), "is not a valid delayed retry maximum delay. Must be a positive "
                                   "integer", "queues", True, True),
    # federation (broker.federation): which upstreams a queue or exchange receives from; one of the three at most
    "federation-upstream": PolicyKey(_name, "is not a valid federation upstream name", "any", False, False),
    "federation-upstream-set": PolicyKey(_name, "is not a valid federation upstream set name", "any", False, False),
    # (a string that does not compile: _check_upstream_pattern's text)
    "federation-upstream-pattern": PolicyKey(_name, "is not a valid federation upstream pattern name", "any", False,
                                             False),
}
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


class Policy:
    """One validated policy (or operator policy) of a vhost."""

    def __init__(self, vhost: str, name: str, pattern: str, apply_to: str, priority: int | float, definition: dict,
                 regex):
        self.vhost = vhost
        self.name = name
        self.pattern = pattern
        self.apply_to = apply_to  # "all", "queues" or "exchanges"
        self.priority = priority  # the highest matching one applies; RabbitMQ accepts any number
        self.definition = definition  # policy key -> value
        self.regex = regex  # pattern, compiled by patterns.compile_pattern

    def applies_to(self, kind: str, name: str) -> bool:
        """kind: "queues" or "exchanges"."""
        return self.apply_to in ("all", kind) and self.regex.search(name) is not None

    def export(self) -> dict:
        """As RabbitMQ's API and definitions export show it."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}


def make_policy(vhost: str, name: str, pattern, definition, priority=0, apply_to="all",
                operator: bool = False) -> Policy:
    """A policy from its (JSON) fields, checked in RabbitMQ's order; raises PolicyError with RabbitMQ's reason."""
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise PolicyError(f"priority should be a number, actually was {erlang_json(priority)}")
    if not isinstance(pattern, str):
        raise PolicyError(f"pattern should be a binary but was {erlang_json(pattern)}")
    regex = _compiled(pattern)
    if apply_to not in APPLY_TO:
        raise PolicyError(f"apply-to '{_plain(apply_to)}' unrecognised; should be 'queues', 'exchanges' or 'all'")
    _check_definition(definition, operator)
    return Policy(vhost, name, pattern, apply_to, priority, dict(definition), regex)


def _check_definition(definition, operator: bool) -> None:
    if not isinstance(definition, dict):
        raise PolicyError(f"definition must be a dictionary: {erlang_json(definition)}")
    if not definition:
        raise PolicyError("no policy provided")
    allowed = {key for key, spec in KEYS.items() if spec.operator or not operator}
    if sum(key in definition for key in FEDERATION_KEYS) >= 2:
        raise PolicyError("cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern "
                          "together")
    for key in sorted(definition):
        if key in allowed and not KEYS[key].valid(definition[key]):
            raise PolicyError(f"{erlang_json(definition[key])} {KEYS[key].refusal}")
        if key == "federation-upstream-pattern":
            _check_upstream_pattern(definition[key])
    unknown = [(key, definition[key]) for key in sorted(definition) if key not in allowed]
    if unknown:
        printed = ",".join(f"{{{erlang_json(key)},{erlang_json(value)}}}" for key, value in unknown)
        raise PolicyError(f"[{printed}] are not recognised policy settings")
    _check_delayed_retry(definition)


def _check_delayed_retry(definition: dict) -> None:
    """rabbit_quorum_queue:validate_delayed_retry_constraints: a retry type needs a minimum delay, and the maximum
    is not below it."""
    kind, low, high = (definition.get(f"delayed-retry-{key}") for key in ("type", "min", "max"))
    if kind not in (None, "disabled") and low is None:
        raise PolicyError(f"delayed-retry-min is required when delayed-retry-type is {kind}")
    if low is not None and high is not None and high < low:
        raise PolicyError(f"delayed-retry-max ({high}) must not be smaller than delayed-retry-min ({low})")


# Python's re errors as PCRE words them (RabbitMQ compiles patterns with re:compile).
_PCRE_ERRORS = {
    "nothing to repeat": "nothing to repeat",
    "multiple repeat": "nothing to repeat",
    "unterminated character set": "missing terminating ] for character class",
    "missing ), unterminated subpattern": "missing )",
    "unbalanced parenthesis": "unmatched parentheses",
    "min repeat greater than max repeat": "numbers out of order in {} quantifier",
}
_AT_END = {"missing terminating ] for character class", "missing )"}  # PCRE reports these at the pattern's end
_REGEX_PROBLEM = "pattern should be regular expression but is invalid: "
_LINE_WIDTH = 80  # io_lib's ~p breaks a term that does not end before this column


def _compiled(pattern: str):
    """pattern compiled; PolicyError with RabbitMQ's reason (PCRE's words) when it is not a regular expression, or
    with why Warren cannot run it."""
    try:
        return compile_pattern(pattern)
    except PatternError as error:
        raise PolicyError(str(error)) from None
    except re.error as error:
        message, offset = _pcre_error(pattern, error)
        flat = f'{{"{message}",{offset}}}'
        if len(_REGEX_PROBLEM) + len(flat) >= _LINE_WIDTH:
            flat = f'{{"{message}",\n{" " * (len(_REGEX_PROBLEM) + 1)}{offset}}}'
        raise PolicyError(_REGEX_PROBLEM + flat) from None


def _pcre_error(pattern: str, error: re.error) -> tuple[str, int]:
    """What PCRE says of a pattern Python's re refuses: its words, and the byte offset it names."""
    message = _PCRE_ERRORS.get(error.msg, error.msg)
    return message, len(pattern.encode()) if message in _AT_END else (error.pos or 0)


def _check_upstream_pattern(pattern: str) -> None:
    """federation-upstream-pattern's regular expression, as rabbit_federation_parameters checks it."""
    try:
        compile_pattern(pattern)
    except PatternError as error:
        raise PolicyError(f"could not compile pattern {pattern} to a regular expression. Error: {error}") from None
    except re.error as error:
        message, offset = _pcre_error(pattern, error)
        raise PolicyError(f'could not compile pattern {pattern} to a regular expression. Error: '
                          f'{{"{message}",{offset}}}') from None


def _plain(value) -> str:
    return value if isinstance(value, str) else erlang_json(value)


def erlang_json(value) -> str:
    """A decoded JSON value as RabbitMQ prints it with ~p (strings are binaries, objects maps)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, str):
        raw = value.encode()
        if all(32 <= byte < 127 for byte in raw):
            return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
        return "<<" + ",".join(str(byte) for byte in raw) + ">>"
    if isinstance(value, list):
        return "[" + ",".join(erlang_json(item) for item in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{erlang_json(key)} => {erlang_json(item)}"
                               for key, item in sorted(value.items())) + "}"
    return repr(value)


def _erlang_float(value: float) -> str:
    """io_lib_format's shortest float: the digits of repr, a decimal point where it is cheaper than an exponent."""
    if not math.isfinite(value):
        return repr(value)
    sign, digits, exponent = Decimal(repr(abs(value))).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    place = len(digits) + exponent  # value = 0.<text> * 10 ** place
    if value == 0:
        text, place = "0", 1
    sign = "-" if value < 0 else ""
    length = len(text)
    if 0 < place < length:
        return f"{sign}{text[:place]}.{text[place:]}"
    if place == 0:
        return f"{sign}0.{text}"
    exponent_text = str(place - 1)
    exponent_cost = len(exponent_text) + 1 + (2 if length == 1 else 1)
    if place < 0 and 2 - place <= exponent_cost:
        return f"{sign}0.{'0' * -place}{text}"
    if place >= length and place - length + 2 <= exponent_cost:
        return f"{sign}{text}{'0' * (place - length)}.0"
    return f"{sign}{text[0]}.{text[1:] or '0'}e{exponent_text}"


# --- choosing and merging ---------------------------------------------------------------------------------------
def choose(policies: Iterable[Policy], kind: str, name: str) -> Policy | None:
    """The policy that applies to the queue or exchange kind ("queues"/"exchanges") called name, if any."""
    best = None
    for policy in policies:
        if policy.applies_to(kind, name) and (
                best is None or (policy.priority, policy.name) > (best.priority, best.name)):
            best = policy
    return best


def choose_both(policies: Iterable[Policy], operator_policies: Iterable[Policy], kind: str,
                name: str) -> tuple[Policy | None, Policy | None]:
    """The policy and the operator policy that apply to the queue or exchange kind called name."""
    return choose(policies, kind, name), choose(operator_policies, kind, name)


def merged_definition(policy: Policy | None, operator_policy: Policy | None) -> dict:
    """The keys of a policy and an operator policy together (RabbitMQ's effective_policy_definition)."""
    merged = dict(policy.definition) if policy is not None else {}
    if operator_policy is not None:
        for key, value in operator_policy.definition.items():
            if key not in merged:
                merged[key] = value
            else:
                merge = KEYS[key].merge if key in KEYS else None
                merged[key] = (merge or min)(merged[key], value)
    return dict(sorted(merged.items()))


def effective_settings(arguments: dict, definition: dict, kind: str) -> dict:
    """Policy key -> the value in force for a queue or exchange with these arguments under this merged
    definition. A queue's argument for key is "x-" + key; an exchange's has no prefix."""
    prefix = "x-" if kind == "queues" else ""
    settings = {}
    for key, spec in KEYS.items():
        if spec.kind != kind:
            continue
        argument = arguments.get(prefix + key)
        value = definition.get(key)
        if argument is None:
            chosen = value
        elif value is None:
            chosen = argument
        elif spec.resolve is not None:
            chosen = spec.resolve(value, argument)
        else:
            chosen = min(value, argument) if spec.lowest_wins else argument
        if chosen is not None:
            settings[key] = chosen
    return settings


class PolicyChoices(NamedTuple):
    """The policy and operator policy chosen for each queue and exchange of a snapshot."""

    version: int  # the vhost's policies_version the choices were made at
    queues: list  # (queue, (policy, operator policy))
    exchanges: list  # (exchange, (policy, operator policy))


class PolicySnapshot(NamedTuple):
    """What choosing policies reads, copied on the event loop; choose() may then run on a worker thread."""

    version: int  # the vhost's policies_version when it was taken
    queues: list  # the vhost's queues
    exchanges: list  # its exchanges but the default one
    policies: list  # its policies
    operator_policies: list  # its operator policies

    def choose(self) -> PolicyChoices:
        policies, operator_policies = self.policies, self.operator_policies
        return PolicyChoices(
            self.version,
            [(queue, choose_both(policies, operator_policies, "queues", queue.name)) for queue in self.queues],
            [(exchange, choose_both(policies, operator_policies, "exchanges", exchange.name))
             for exchange in self.exchanges])
