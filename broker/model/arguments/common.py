"""What the argument checks share: their error, and the equivalence of a redeclaration's arguments with the
current ones (rabbit_misc:assert_args_equivalence / assert_field_equivalence)."""

from protocol.constants import PRECONDITION_FAILED
from protocol.erlang_terms import amqp_type_name, as_bytes, erlang_atom, erlang_term, from_bytes
from protocol.errors import AMQPError


class ArgumentError(AMQPError):
    """A declaration RabbitMQ refuses (406 PRECONDITION_FAILED, or 405 RESOURCE_LOCKED for exclusivity)."""


def precondition_failed(explanation: str) -> ArgumentError:
    return ArgumentError(PRECONDITION_FAILED, explanation)


def is_longstr(value) -> bool:
    return isinstance(value, (str, bytes))


def text_of(value: str | bytes | bytearray) -> str:
    """The text of a string value, as RabbitMQ prints it."""
    return from_bytes(as_bytes(value))


def plain(value) -> str:
    """~s of a binary, ~p of anything else (rabbit_misc:val/1)."""
    if isinstance(value, (str, bytes, bytearray)):
        return text_of(value)
    return erlang_term(value)


def check_name_type(arguments: dict, key: str, resource: str) -> None:
    """rabbit_channel's r_arg check: an exchange name given in arguments must be a long string."""
    if key in arguments and not is_longstr(arguments[key]):
        raise precondition_failed(f"invalid type '{amqp_type_name(arguments[key])}' for arg '{key}' in {resource}")


# ---------------------------------------------------------------------------------------------------------------
# Redeclarations

_MISSING = object()  # an argument absent from a table (Erlang's undefined)

_TYPE_CLASSES = {  # rabbit_misc:type_class/1; other types are their own class
    "signedint": "int",
    "long": "int",
    "decimal": "int",
    "double": "float",
}


def _erlang_identical(a, b) -> bool:
    """Erlang's =:= on the terms RabbitMQ holds for two decoded values."""
    if _is_text(a) and _is_text(b):
        return as_bytes(a) == as_bytes(b)
    return type(a) is type(b) and erlang_term(a) == erlang_term(b)


def _is_text(value) -> bool:
    return isinstance(value, (str, bytes, bytearray))


def _described(value) -> str:
    """rabbit_misc:val/1 for a {Type, Value} pair, or 'none' when absent."""
    if value is _MISSING:
        return "none"
    return f"the value '{plain(value)}' of type '{amqp_type_name(value)}'"


def _field_equivalent(key: str, current, received) -> bool:
    if current is _MISSING and received is _MISSING:
        return True
    if current is _MISSING or received is _MISSING:
        present = received if current is _MISSING else current
        return key == "x-queue-type" and is_longstr(present) and as_bytes(present) == b"classic"
    same_class = _TYPE_CLASSES.get(amqp_type_name(current), amqp_type_name(current)) == _TYPE_CLASSES.get(
        amqp_type_name(received), amqp_type_name(received)
    )
    return (same_class and erlang_term(current) == erlang_term(received)) or _erlang_identical(current, received)


def check_args_equivalent(resource: str, current: dict, received: dict, keys) -> None:
    for key in keys:
        was, now = current.get(key, _MISSING), received.get(key, _MISSING)
        if _field_equivalent(key, was, now):
            continue
        if was is _MISSING or now is _MISSING:
            shown_now, shown_was = _described(now), _described(was)
        else:
            shown_now, shown_was = f"'{plain(now)}'", f"'{plain(was)}'"
        raise precondition_failed(
            f"inequivalent arg '{key}' for {resource}: received {shown_now} but current is {shown_was}"
        )


def check_flag(resource: str, name: str, current, received) -> None:
    if current != received:
        raise precondition_failed(
            f"inequivalent arg '{name}' for {resource}: received '{_flag(received)}' but current is '{_flag(current)}'"
        )


def _flag(value) -> str:
    return erlang_term(value) if isinstance(value, bool) else erlang_atom(value)
