"""Headers-exchange matching, as RabbitMQ's rabbit_exchange_type_headers does it.

x-match "all" (the default, also used for any value that is not one of the four below) needs every binding
argument present in the headers with an equal value; "any" needs at least one. Binding arguments whose name starts
with "x-" take no part, except under "all-with-x" / "any-with-x"; "x-match" itself never does. A binding argument
of type void (None) matches on the presence of the header alone.

Values compare as Erlang's == compares the terms RabbitMQ decodes: the AMQP type is not compared, so a long string
equals a byte array with the same bytes, 1 equals 1.0, and a timestamp equals the integer of its seconds; a boolean
equals no number. pamqp has dropped the wire types by the time a value gets here, so nested tables and arrays
compare with the types amqp_type_name() infers for their elements.
"""

import datetime
import decimal

from protocol.erlang_terms import amqp_type_name, erlang_term

_X_MATCH_KINDS = ("all", "any", "all-with-x", "any-with-x")
_EXACT_TYPES = (str, int, bool)  # two values of one of these types are equal exactly when Python says so


def validate_x_match(binding_arguments: dict) -> str | None:
    """The reply text (406 PRECONDITION_FAILED) RabbitMQ closes the channel with for an invalid x-match, or None."""
    if "x-match" not in binding_arguments:
        return None
    value = binding_arguments["x-match"]
    if isinstance(value, (str, bytes)):
        if (value if isinstance(value, str) else value.decode("utf-8", errors="replace")) in _X_MATCH_KINDS:
            return None
        return (
            f"PRECONDITION_FAILED - Invalid x-match field value {erlang_term(value)}; "
            "expected all, any, all-with-x, or any-with-x"
        )
    return (
        f"PRECONDITION_FAILED - Invalid x-match field type {amqp_type_name(value)} "
        f"(value {erlang_term(value)}); expected longstr"
    )


def headers_match(binding_arguments: dict, message_headers: dict | None) -> bool:
    kind = binding_arguments.get("x-match", "all")
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", errors="replace")
    match_any = kind in ("any", "any-with-x")
    with_x = kind in ("all-with-x", "any-with-x")
    headers = message_headers or {}
    for name, expected in binding_arguments.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        if name in headers and (expected is None or _equal(expected, headers[name])):
            if match_any:
                return True
        elif not match_any:
            return False
    return not match_any


def _equal(a, b) -> bool:
    if type(a) is type(b) and type(a) in _EXACT_TYPES:
        return a == b
    return _erlang_value(a) == _erlang_value(b)


def _erlang_value(value):
    """A Python value that compares with == as Erlang's == compares the term RabbitMQ holds for value."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, datetime.datetime):
        return int(erlang_term(value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", erlang_term(value))
    if value is None:
        return ("undefined",)
    if isinstance(value, dict):
        return ("table", tuple((_erlang_value(k), amqp_type_name(v), _erlang_value(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple((amqp_type_name(v), _erlang_value(v)) for v in value))
    raise TypeError(f"not a field-table value: {value!r}")
