"""RabbitMQ's checks of a runtime parameter's value (rabbit_parameter_validation), with its texts: a shovel's and a
federation upstream's definitions are JSON objects whose keys each have a check."""

from __future__ import annotations

from typing import Any, Callable

from broker.links.uri import UriError, parse, without_credentials
from protocol.erlang_terms import erlang_term, pretty

# (key, value) -> why the value is refused, or None
Check = Callable[[str, Any], "str | None"]


class DefinitionError(ValueError):
    """The value is not a definition the component takes: RabbitMQ's "Validation failed" text, each reason on a
    line."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("Validation failed\n\n" + "".join(f"{reason}\n" for reason in reasons))
        self.reasons = reasons


def proplist(name: str, value: Any, checks: dict[str, Check], mandatory: tuple[str, ...]) -> list[str]:
    """Why a JSON object is not a definition whose keys have these checks, in RabbitMQ's order
    (rabbit_parameter_validation:proplist): unknown keys first, then each key's refusal or absence (a mandatory one)
    from the last check to the first."""
    if not isinstance(value, dict):
        return [f"{name} should be a JSON object, actually was {write_value(value)}"]
    reasons = []
    unknown = [(key, item) for key, item in value.items() if key not in checks]
    if unknown:
        terms = "[" + ",".join(f"{{{write_value(key)},{write_value(item)}}}" for key, item in unknown) + "]"
        reasons.append(f"Unrecognised terms {terms} in {name}")
    for key, check in reversed(checks.items()):
        if key in value:
            reason = check(key, value[key])
            if reason:
                reasons.append(reason)
        elif key in mandatory:
            reasons.append(f'Key "{key}" not found in {name}')
    return reasons


def binary(key: str, item: Any) -> str | None:
    return None if isinstance(item, str) else f"{key} should be binary, actually was {write_value(item)}"


def short_binary(key: str, item: Any) -> str | None:
    """A binary an AMQP short string can carry (a queue's name)."""
    if not isinstance(item, str):
        return binary(key, item)
    return f"{key} should be less than 255 bytes, actually was {write_value(item)}" if len(item.encode()) > 255 \
        else None


def number(key: str, item: Any) -> str | None:
    if isinstance(item, bool) or not isinstance(item, (int, float)) or item < 0:
        return f"{key} should be a number, actually was {write_value(item)}"
    return None


def prefetch(key: str, item: Any) -> str | None:
    """A number a basic.qos can carry (RabbitMQ takes any number here, and its link then fails at every start)."""
    if reason := number(key, item):
        return reason
    return f"{key} should be at most 65535, actually was {write_value(item)}" if item > 65535 else None


def boolean(key: str, item: Any) -> str | None:
    return None if isinstance(item, bool) else f"{key} should be boolean, actually was {write_value(item)}"


def table(key: str, item: Any) -> str | None:
    if isinstance(item, dict) or item == []:  # ([]: an empty proplist, as RabbitMQ takes)
        return None
    return f"{key} should be a JSON object, actually was {write_value(item)}"


def one_of(*allowed: str) -> Check:
    def check(key: str, item: Any) -> str | None:
        if not isinstance(item, str):
            return binary(key, item)
        if item not in allowed:
            return f"{key} should be one of {write_value(list(allowed))}, actually was {write_value(item)}"
        return None
    return check


def uris(key: str, item: Any) -> str | None:
    """One AMQP URI or a list of them, each one Warren can connect to."""
    given = item if isinstance(item, list) else [item]
    if not given or not all(isinstance(uri, str) for uri in given):
        return f"{key} should be list, actually was {write_value(item)}"
    for uri in given:
        try:
            parse(uri)
        except UriError as error:
            return f'"{without_credentials(uri)}" not a valid URI: {error}'
    return None


def write_value(value: Any) -> str:
    """A JSON value as RabbitMQ's texts print the Erlang term it becomes (~tp): a string as a binary, an object as
    a map."""
    if isinstance(value, str):
        return pretty(value.encode(), 1)
    if isinstance(value, (bool, int, float)):
        return erlang_term(value)
    if isinstance(value, list):
        return "[" + ",".join(write_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{write_value(key)} => {write_value(item)}" for key, item in value.items()) + "}"
    return "null"  # (JSON's null, as RabbitMQ's decoder gives it)
