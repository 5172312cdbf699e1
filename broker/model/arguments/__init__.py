"""queue.declare / exchange.declare argument checks with RabbitMQ's exact reply texts.

The checks and texts come from RabbitMQ 3.10 (rabbit_amqqueue:check_declare_arguments and declare_args,
rabbit_misc:assert_args_equivalence, rabbit_exchange:assert_equivalence, the r_arg type checks of
rabbit_channel). RabbitMQ validates the arguments of a *new* queue or exchange only; a redeclaration is checked
for equivalence instead, so callers use validate_* for a new entity and check_*_equivalent for an existing one.

pamqp decodes field-table values into plain Python values and forgets their AMQP type, yet RabbitMQ names the
type in several texts. amqp_type_name() infers it the way pika and the Java client encode values:

    bool -> bool            int -> signedint (32-bit range) or long       float -> double
    decimal.Decimal -> decimal      str -> longstr      bytes -> longstr (a long string that is not UTF-8)
    bytearray -> binary     datetime -> timestamp       dict -> table     list -> array     None -> void

A pamqp-based client (aio-pika) sends the narrowest integer type instead (5 is a 'byte'), so RabbitMQ would name
that type where Warren says 'signedint'; the checks themselves do not depend on the integer width.
"""

import calendar
import datetime
import decimal
import re

from protocol.constants import PRECONDITION_FAILED, RESOURCE_LOCKED
from protocol.errors import AMQPError

_INT32 = range(-(2**31), 2**31)
_MAX_EXPIRY = 315360000000  # rabbit_misc:check_expiry: ten years in milliseconds


class ArgumentError(AMQPError):
    """A declaration RabbitMQ refuses (406 PRECONDITION_FAILED, or 405 RESOURCE_LOCKED for exclusivity)."""


def _precondition_failed(explanation: str) -> ArgumentError:
    return ArgumentError(PRECONDITION_FAILED, explanation)


# ---------------------------------------------------------------------------------------------------------------
# Field-table values as RabbitMQ sees and prints them


def amqp_type_name(value) -> str:
    """RabbitMQ's name for the field-table type a client most likely used for value (see module docstring)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if value in _INT32 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, bytearray):
        return "binary"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    raise TypeError(f"not a field-table value: {value!r}")


def _as_bytes(value: str | bytes | bytearray) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _from_bytes(raw: bytes) -> str:
    """Erlang formats binaries byte by byte and sends the bytes on: decoding them as UTF-8 gives the same text."""
    return raw.decode("utf-8", errors="replace")


_ERLANG_ESCAPES = {
    ord('"'): '\\"',
    ord("\\"): "\\\\",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\v"): "\\v",
    ord("\b"): "\\b",
    ord("\f"): "\\f",
    27: "\\e",
}


def _printable_latin1(raw: bytes) -> bool:
    """io_lib's test (default latin1 printable range) for printing a byte list as a quoted string."""
    return all(32 <= b <= 126 or 160 <= b or b in _ERLANG_ESCAPES for b in raw)


def _erlang_chars(raw: bytes, open_quote: str, close_quote: str, as_integers) -> str:
    if not _printable_latin1(raw):
        return as_integers(",".join(str(b) for b in raw))
    escaped = bytearray()
    for b in raw:
        escaped += _ERLANG_ESCAPES[b].encode() if b in _ERLANG_ESCAPES else bytes((b,))
    return open_quote + _from_bytes(bytes(escaped)) + close_quote


def erlang_string(text: str) -> str:
    """~p of an Erlang string (a character list), as RabbitMQ prints error reasons built with format/2."""
    return _erlang_chars(text.encode(), '"', '"', lambda ints: f"[{ints}]")


def _erlang_binary(raw: bytes) -> str:
    return _erlang_chars(raw, '<<"', '">>', lambda ints: f"<<{ints}>>")


def erlang_atom(name: str) -> str:
    """~p of an atom: bare when it is a plain lower-case word, otherwise single-quoted."""
    if re.fullmatch(r"[a-z][A-Za-z0-9_@]*", name):
        return name
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _erlang_float(value: float) -> str:
    """~p of a float: shortest round-trip digits, placed as io_lib_format:fwrite_g places them (integral floats
    from 2**53 up always take the exponent form)."""
    if value == 0.0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign = "-" if value < 0 else ""
    exact = decimal.Decimal(repr(abs(value))).normalize()
    digits = "".join(map(str, exact.as_tuple().digits))
    length = len(digits)
    place = length + exact.as_tuple().exponent  # value == 0.<digits> * 10**place
    if 0 < place < length:
        return sign + digits[:place] + "." + digits[place:]
    if place == 0:
        return sign + "0." + digits
    exponent = str(place - 1)
    exponent_cost = len(exponent) + 1 + (2 if length == 1 else 1)
    if place < 0 and 2 - place <= exponent_cost:
        return sign + "0." + "0" * -place + digits
    if place >= length and place - length + 2 <= exponent_cost and abs(value) < 2.0**53:
        return sign + digits + "0" * (place - length) + ".0"
    mantissa = digits[0] + "." + (digits[1:] or "0")
    return sign + mantissa + "e" + exponent


def _decimal_parts(value: decimal.Decimal) -> tuple[int, int]:
    """RabbitMQ's decimal {Scale, Unscaled} as the wire carried it (pamqp keeps the scale in the exponent)."""
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    return (-exponent, unscaled) if exponent <= 0 else (0, unscaled * 10**exponent)


def _timestamp_seconds(value: datetime.datetime) -> int:
    return calendar.timegm(value.utctimetuple())


def erlang_term(value) -> str:
    """~p of the Erlang term RabbitMQ holds for a decoded field-table value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, decimal.Decimal):
        scale, unscaled = _decimal_parts(value)
        return f"{{{scale},{unscaled}}}"
    if isinstance(value, (str, bytes, bytearray)):
        return _erlang_binary(_as_bytes(value))
    if isinstance(value, datetime.datetime):
        return str(_timestamp_seconds(value))
    if isinstance(value, dict):
        fields = (f"{{{_erlang_binary(_as_bytes(k))},{amqp_type_name(v)},{erlang_term(v)}}}" for k, v in value.items())
        return "[" + ",".join(fields) + "]"
    if isinstance(value, list):
        return "[" + ",".join(f"{{{amqp_type_name(v)},{erlang_term(v)}}}" for v in value) + "]"
    if value is None:
        return "undefined"
    raise TypeError(f"not a field-table value: {value!r}")


def _plain(value) -> str:
    """~s of a binary, ~p of anything else (rabbit_misc:val/1)."""
    if isinstance(value, (str, bytes, bytearray)):
        return _from_bytes(_as_bytes(value))
    return erlang_term(value)


# ---------------------------------------------------------------------------------------------------------------
# New queues: rabbit_amqqueue:check_declare_arguments

QUEUE_TYPE_MODULES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}

# queue_arguments of each queue type's capabilities(), in RabbitMQ's order (also the equivalence-check order)
QUEUE_TYPE_ARGUMENTS = {
    "classic": (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
    ),
    "quorum": (
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    ),
    "stream": (
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    ),
}
_ALL_QUEUE_ARGUMENTS = frozenset(name for names in QUEUE_TYPE_ARGUMENTS.values() for name in names)


def _int_error(value) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return erlang_string(f"expected integer, got {amqp_type_name(value)}")


def _non_negative_int_error(value) -> str | None:
    error = _int_error(value)
    if error is None and value < 0:
        return f"{{value_negative,{value}}}"
    return error


def _expiry_error(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > _MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return None


def _check_expires(value, arguments) -> str | None:
    error = _int_error(value)
    if error is None and value == 0:
        return "{value_zero,0}"
    return error or _expiry_error(value)


def _check_message_ttl(value, arguments) -> str | None:
    return _int_error(value) or _expiry_error(value)


def _check_non_negative_int(value, arguments) -> str | None:
    return _non_negative_int_error(value)


def _check_max_priority(value, arguments) -> str | None:
    error = _non_negative_int_error(value)
    if error is None and value > 255:
        return f"{{max_value_exceeded,{value}}}"
    return error


def _check_positive_size(value, arguments) -> str | None:
    error = _non_negative_int_error(value)
    if error is None and value == 0:
        return "{value_zero,0}"
    return error


def _is_longstr(value) -> bool:
    return isinstance(value, (str, bytes))


def _unacceptable_type(value) -> str:
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _check_bool(value, arguments) -> str | None:
    return None if isinstance(value, bool) else _unacceptable_type(value)


def _check_dead_letter_exchange(value, arguments) -> str | None:
    return None if _is_longstr(value) else _unacceptable_type(value)


def _check_dead_letter_routing_key(value, arguments) -> str | None:
    if not _is_longstr(value):
        return _unacceptable_type(value)
    return None if "x-dead-letter-exchange" in arguments else "routing_key_but_no_dlx_defined"


def _one_of(allowed: tuple[str, ...], reason):
    """A validator accepting a long string among allowed; reason(text) renders the error for any other string."""

    def check(value, arguments) -> str | None:
        if not _is_longstr(value):
            return _unacceptable_type(value)
        text = _from_bytes(_as_bytes(value))
        return None if text in allowed else reason(text)

    return check


def _atom(reason: str):
    return lambda text: reason


def _quoted(template: str):
    return lambda text: erlang_string(template.format(text))


def _check_queue_version(value, arguments) -> str | None:
    error = _non_negative_int_error(value)
    if error is None and value not in (1, 2):
        return erlang_string(f"unsupported queue version '{value}'")
    return error


_MAX_AGE_UNITS = ("Y", "M", "D", "h", "m", "s")


def _check_max_age(value, arguments) -> str | None:
    if not _is_longstr(value):
        return _unacceptable_type(value)
    number, unit = re.match(r"([0-9]*)(.*)", _from_bytes(_as_bytes(value))).groups()
    if number and int(number) > 0 and unit in _MAX_AGE_UNITS:
        return None
    return "invalid_max_age"


# rabbit_amqqueue:declare_args(), in RabbitMQ's order; x-queue-master-locator has no validator in 3.10
_DECLARE_VALIDATORS = {
    "x-expires": _check_expires,
    "x-message-ttl": _check_message_ttl,
    "x-dead-letter-exchange": _check_dead_letter_exchange,
    "x-dead-letter-routing-key": _check_dead_letter_routing_key,
    "x-dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), _atom("invalid_dlx_strategy")),
    "x-max-length": _check_non_negative_int,
    "x-max-length-bytes": _check_non_negative_int,
    "x-max-in-memory-length": _check_non_negative_int,
    "x-max-in-memory-bytes": _check_non_negative_int,
    "x-max-priority": _check_max_priority,
    "x-overflow": _one_of(("drop-head", "reject-publish", "reject-publish-dlx"), _atom("invalid_overflow")),
    "x-queue-mode": _one_of(("default", "lazy"), _quoted("unsupported queue mode '{}'")),
    "x-queue-version": _check_queue_version,
    "x-single-active-consumer": _check_bool,
    "x-queue-type": _one_of(tuple(QUEUE_TYPE_MODULES), _quoted("unsupported queue type '{}'")),
    "x-quorum-initial-group-size": _check_positive_size,
    "x-max-age": _check_max_age,
    "x-stream-max-segment-size-bytes": _check_non_negative_int,
    "x-initial-cluster-size": _check_positive_size,
    "x-queue-leader-locator": _one_of(
        ("client-local", "balanced", "random", "least-leaders"), _atom("invalid_queue_locator_arg")
    ),
}


def _queue_resource(queue: str, vhost: str) -> str:
    return f"queue '{queue}' in vhost '{vhost}'"


def _exchange_resource(exchange: str, vhost: str) -> str:
    return f"exchange '{exchange}' in vhost '{vhost}'"


def queue_type_of(arguments: dict) -> str:
    """The queue type an argument table asks for ('classic' when x-queue-type is absent or not a string)."""
    requested = arguments.get("x-queue-type")
    text = _from_bytes(_as_bytes(requested)) if _is_longstr(requested) else "classic"
    return text if text in QUEUE_TYPE_MODULES else "classic"


def _check_name_type(arguments: dict, key: str, resource: str) -> None:
    """rabbit_channel's r_arg check: an exchange name given in arguments must be a long string."""
    if key in arguments and not _is_longstr(arguments[key]):
        raise _precondition_failed(f"invalid type '{amqp_type_name(arguments[key])}' for arg '{key}' in {resource}")


def _run_validators(resource: str, arguments: dict, names) -> None:
    for name in names:
        if name in arguments:
            error = _DECLARE_VALIDATORS[name](arguments[name], arguments)
            if error is not None:
                raise _precondition_failed(f"invalid arg '{name}' for {resource}: {error}")


def validate_queue_arguments(queue: str, vhost: str, arguments: dict) -> None:
    """Check the arguments of a queue about to be created; raises ArgumentError with RabbitMQ's text."""
    resource = _queue_resource(queue, vhost)
    _check_name_type(arguments, "x-dead-letter-exchange", resource)
    _run_validators(resource, arguments, ("x-queue-type",))
    queue_type = queue_type_of(arguments)
    allowed = QUEUE_TYPE_ARGUMENTS[queue_type]
    _run_validators(resource, arguments, [name for name in _DECLARE_VALIDATORS if name in allowed])
    for name in arguments:
        if name in _ALL_QUEUE_ARGUMENTS and name not in allowed:
            raise _precondition_failed(
                f"invalid arg '{name}' for {resource} of queue type {QUEUE_TYPE_MODULES[queue_type]}"
            )


def validate_exchange_arguments(exchange: str, vhost: str, arguments: dict) -> None:
    """Check the arguments of an exchange about to be created (RabbitMQ checks only the alternate-exchange type)."""
    _check_name_type(arguments, "alternate-exchange", _exchange_resource(exchange, vhost))


# ---------------------------------------------------------------------------------------------------------------
# Redeclarations: rabbit_misc:assert_args_equivalence / assert_field_equivalence

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
        return _as_bytes(a) == _as_bytes(b)
    return type(a) is type(b) and erlang_term(a) == erlang_term(b)


def _is_text(value) -> bool:
    return isinstance(value, (str, bytes, bytearray))


def _described(value) -> str:
    """rabbit_misc:val/1 for a {Type, Value} pair, or 'none' when absent."""
    if value is _MISSING:
        return "none"
    return f"the value '{_plain(value)}' of type '{amqp_type_name(value)}'"


def _field_equivalent(key: str, current, received) -> bool:
    if current is _MISSING and received is _MISSING:
        return True
    if current is _MISSING or received is _MISSING:
        present = received if current is _MISSING else current
        return key == "x-queue-type" and _is_longstr(present) and _as_bytes(present) == b"classic"
    same_class = _TYPE_CLASSES.get(amqp_type_name(current), amqp_type_name(current)) == _TYPE_CLASSES.get(
        amqp_type_name(received), amqp_type_name(received)
    )
    return (same_class and erlang_term(current) == erlang_term(received)) or _erlang_identical(current, received)


def _check_args_equivalent(resource: str, current: dict, received: dict, keys) -> None:
    for key in keys:
        was, now = current.get(key, _MISSING), received.get(key, _MISSING)
        if _field_equivalent(key, was, now):
            continue
        if was is _MISSING or now is _MISSING:
            shown_now, shown_was = _described(now), _described(was)
        else:
            shown_now, shown_was = f"'{_plain(now)}'", f"'{_plain(was)}'"
        raise _precondition_failed(
            f"inequivalent arg '{key}' for {resource}: received {shown_now} but current is {shown_was}"
        )


def _check_flag(resource: str, name: str, current, received) -> None:
    if current != received:
        raise _precondition_failed(
            f"inequivalent arg '{name}' for {resource}: received '{_flag(received)}' but current is '{_flag(current)}'"
        )


def _flag(value) -> str:
    return erlang_term(value) if isinstance(value, bool) else erlang_atom(value)


def check_queue_equivalent(queue: str, vhost: str, existing: dict, requested: dict) -> None:
    """existing/requested: {'durable','exclusive','auto_delete','arguments'}; raises ArgumentError with RabbitMQ's
    text when a redeclaration does not match the queue.

    Exclusivity is compared first (405 RESOURCE_LOCKED). Both dicts may carry an 'owner' (the exclusive owner's
    connection, None when not exclusive), compared when given; without it the 'exclusive' flags are compared,
    which is enough when the caller has already refused other connections access to an exclusive queue. A durable
    exclusive declaration is not durable, as in RabbitMQ.
    """
    resource = _queue_resource(queue, vhost)
    if "owner" in existing and "owner" in requested:
        same_owner = existing["owner"] == requested["owner"]
    else:
        same_owner = bool(existing["exclusive"]) == bool(requested["exclusive"])
    if not same_owner:
        raise ArgumentError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked {resource}. It could be originally "
            "declared on another connection or the exclusive property value does not match that of the "
            "original declaration.",
        )
    _check_flag(resource, "durable", _durable(existing), _durable(requested))
    _check_flag(resource, "auto_delete", bool(existing["auto_delete"]), bool(requested["auto_delete"]))
    current = existing.get("arguments") or {}
    _check_args_equivalent(
        resource, current, requested.get("arguments") or {}, QUEUE_TYPE_ARGUMENTS[queue_type_of(current)]
    )


def _durable(declaration: dict) -> bool:
    return bool(declaration["durable"]) and not declaration["exclusive"]


def check_exchange_equivalent(exchange: str, vhost: str, existing: dict, requested: dict) -> None:
    """existing/requested: {'type','durable','auto_delete','internal','arguments'}; raises ArgumentError with
    RabbitMQ's text when a redeclaration does not match the exchange."""
    resource = _exchange_resource(exchange, vhost)
    _check_flag(resource, "type", existing["type"], requested["type"])
    for flag in ("durable", "auto_delete", "internal"):
        _check_flag(resource, flag, bool(existing[flag]), bool(requested[flag]))
    _check_args_equivalent(
        resource, existing.get("arguments") or {}, requested.get("arguments") or {}, ("alternate-exchange",)
    )
