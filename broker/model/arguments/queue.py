"""queue.declare arguments: the checks of a new queue (rabbit_amqqueue:check_declare_arguments and declare_args)
and the equivalence of a redeclaration, with RabbitMQ 3.10's exact texts."""

import re

from broker.model.arguments.common import (
    ArgumentError, check_args_equivalent, check_flag, check_name_type, is_longstr, precondition_failed, text_of,
)
from protocol.constants import RESOURCE_LOCKED
from protocol.erlang_terms import amqp_type_name, erlang_string

_MAX_EXPIRY = 315360000000  # rabbit_misc:check_expiry: ten years in milliseconds
# rabbit_queue_location:queue_leader_locators() of RabbitMQ 4: the last three are deprecated names of "balanced"
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders", "min-masters")
MAX_STREAM_SEGMENT_BYTES = 3_000_000_000  # rabbit_stream_queue's ?MAX_STREAM_MAX_SEGMENT_SIZE


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
        "x-queue-leader-locator",  # RabbitMQ 4.0 (3.x refused it on classic queues)
        "x-consumer-timeout",  # RabbitMQ 3.12
        # beyond RabbitMQ, which has these for quorum queues only
        "x-delivery-limit",
        "x-delayed-retry-type",
        "x-delayed-retry-min",
        "x-delayed-retry-max",
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
        "x-consumer-timeout",
        "x-delayed-retry-type",  # RabbitMQ 4.3's delayed retry
        "x-delayed-retry-min",
        "x-delayed-retry-max",
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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_error(value) -> str | None:
    if _is_int(value):
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


def _check_int(value, arguments) -> str | None:
    return _int_error(value)


def _check_positive_size(value, arguments) -> str | None:
    error = _non_negative_int_error(value)
    if error is None and value == 0:
        return "{value_zero,0}"
    return error


def _unacceptable_type(value) -> str:
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _check_bool(value, arguments) -> str | None:
    return None if isinstance(value, bool) else _unacceptable_type(value)


def _check_dead_letter_exchange(value, arguments) -> str | None:
    return None if is_longstr(value) else _unacceptable_type(value)


def _check_dead_letter_routing_key(value, arguments) -> str | None:
    if not is_longstr(value):
        return _unacceptable_type(value)
    return None if "x-dead-letter-exchange" in arguments else "routing_key_but_no_dlx_defined"


def _one_of(allowed: tuple[str, ...], reason):
    """A validator accepting a long string among allowed; reason(text) renders the error for any other string."""

    def check(value, arguments) -> str | None:
        if not is_longstr(value):
            return _unacceptable_type(value)
        text = text_of(value)
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


DELAYED_RETRY_TYPES = ("all", "failed", "returned", "disabled")


_check_delayed_retry_type_name = _one_of(DELAYED_RETRY_TYPES, _quoted(
    "'{}' is not a valid delayed retry type. Must be one of: " + ", ".join(DELAYED_RETRY_TYPES)))


def _check_delayed_retry_type(value, arguments) -> str | None:
    """Warren checks what RabbitMQ 4.3 takes unchecked (and then ignores when wrong), with its policy texts."""
    error = _check_delayed_retry_type_name(value, arguments)
    if error is not None or text_of(value) == "disabled" or "x-delayed-retry-min" in arguments:
        return error
    return erlang_string(f"x-delayed-retry-min is required when x-delayed-retry-type is {text_of(value)}")


def _check_delayed_retry_max(value, arguments) -> str | None:
    error = _check_positive_size(value, arguments)
    low = arguments.get("x-delayed-retry-min")
    if error is None and _is_int(low) and value < low:
        return erlang_string(f"x-delayed-retry-max ({value}) must not be smaller than x-delayed-retry-min ({low})")
    return error



# seconds per unit of an age such as x-max-age's '7D' (rabbit_amqqueue:check_max_age; also x-stream-offset intervals)
AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_AGE = re.compile(r"([0-9]+)([YMDhms])")


def age_ms(text: str) -> int | None:
    """Milliseconds of an age: a positive number and one unit of AGE_UNITS ('7D', '30m'); None if it is not one."""
    match = _AGE.fullmatch(text)
    if match is None or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) * AGE_UNITS[match.group(2)] * 1000


def _check_max_age(value, arguments) -> str | None:
    if not is_longstr(value):
        return _unacceptable_type(value)
    return None if age_ms(text_of(value)) is not None else "invalid_max_age"


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
    "x-consumer-timeout": _check_non_negative_int,
    "x-queue-type": _one_of(tuple(QUEUE_TYPE_MODULES), _quoted("unsupported queue type '{}'")),
    "x-quorum-initial-group-size": _check_positive_size,
    "x-max-age": _check_max_age,
    "x-stream-max-segment-size-bytes": _check_non_negative_int,
    "x-initial-cluster-size": _check_positive_size,
    "x-queue-leader-locator": _one_of(LEADER_LOCATORS, _atom("invalid_queue_locator_arg")),
    # RabbitMQ 4 takes these without a check (a value it cannot use falls back to its default); Warren refuses one
    # it could not use rather than ignore it
    "x-delivery-limit": _check_int,
    "x-delayed-retry-type": _check_delayed_retry_type,
    "x-delayed-retry-min": _check_positive_size,
    "x-delayed-retry-max": _check_delayed_retry_max,
}


# each queue type's arguments among _DECLARE_VALIDATORS, in their order (a declare runs those its arguments name)
_TYPE_VALIDATED = {queue_type: tuple(name for name in _DECLARE_VALIDATORS if name in allowed)
                   for queue_type, allowed in QUEUE_TYPE_ARGUMENTS.items()}


def check_queue_type_properties(queue: str, vhost: str, arguments: dict, durable: bool, exclusive: bool,
                                auto_delete: bool) -> None:
    """A quorum queue or a stream is durable, neither exclusive nor auto-delete (rabbit_queue_type_util's checks,
    in 4.x's order)."""
    queue_type = queue_type_of(arguments)
    if queue_type == "classic":
        return
    for refused, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"), (not durable, "non-durable")):
        if refused:
            raise precondition_failed(f"invalid property '{name}' for {queue_resource(queue, vhost)}")
    if queue_type == "stream" and arguments.get("x-stream-max-segment-size-bytes", 0) > MAX_STREAM_SEGMENT_BYTES:
        raise precondition_failed("Exceeded max value for x-stream-max-segment-size-bytes")


def queue_resource(queue: str, vhost: str) -> str:
    return f"queue '{queue}' in vhost '{vhost}'"


def queue_type_of(arguments: dict) -> str:
    """The queue type an argument table asks for ('classic' when x-queue-type is absent or not a string)."""
    requested = arguments.get("x-queue-type")
    text = text_of(requested) if is_longstr(requested) else "classic"
    return text if text in QUEUE_TYPE_MODULES else "classic"


def _run_validators(resource: str, arguments: dict, names, validators: dict = _DECLARE_VALIDATORS) -> None:
    for name in names:
        if name in arguments:
            error = validators[name](arguments[name], arguments)
            if error is not None:
                raise precondition_failed(f"invalid arg '{name}' for {resource}: {error}")


def validate_queue_arguments(queue: str, vhost: str, arguments: dict) -> None:
    """Check the arguments of a queue about to be created; raises ArgumentError with RabbitMQ's text."""
    if not arguments:
        return
    resource = queue_resource(queue, vhost)
    check_name_type(arguments, "x-dead-letter-exchange", resource)
    _run_validators(resource, arguments, ("x-queue-type",))
    queue_type = queue_type_of(arguments)
    allowed = QUEUE_TYPE_ARGUMENTS[queue_type]
    _run_validators(resource, arguments, _TYPE_VALIDATED[queue_type])
    for name in arguments:
        if name in _ALL_QUEUE_ARGUMENTS and name not in allowed:
            raise precondition_failed(
                f"invalid arg '{name}' for {resource} of queue type {QUEUE_TYPE_MODULES[queue_type]}"
            )


# rabbit_amqqueue:consume_args(), with Warren's own delayed retry after RabbitMQ's
_CONSUME_VALIDATORS = {
    "x-priority": _check_int,
    "x-consumer-timeout": _check_non_negative_int,
    "x-delayed-retry-type": _check_delayed_retry_type,
    "x-delayed-retry-min": _check_positive_size,
    "x-delayed-retry-max": _check_delayed_retry_max,
}


def validate_consume_arguments(queue: str, vhost: str, arguments: dict) -> None:
    """Check a basic.consume's arguments: its priority, its own acknowledgement timeout (RabbitMQ 4's) and delayed
    retry (beyond RabbitMQ), with the texts of queue arguments."""
    _run_validators(queue_resource(queue, vhost), arguments, _CONSUME_VALIDATORS, _CONSUME_VALIDATORS)


# ---------------------------------------------------------------------------------------------------------------
# Redeclarations


def check_queue_equivalent(queue: str, vhost: str, existing: dict, requested: dict) -> None:
    """existing/requested: {'durable','exclusive','auto_delete','arguments'}; raises ArgumentError with RabbitMQ's
    text when a redeclaration does not match the queue.

    Exclusivity is compared first (405 RESOURCE_LOCKED). Both dicts may carry an 'owner' (the exclusive owner's
    connection, None when not exclusive), compared when given; without it the 'exclusive' flags are compared,
    which is enough when the caller has already refused other connections access to an exclusive queue. A durable
    exclusive declaration is not durable, as in RabbitMQ.
    """
    resource = queue_resource(queue, vhost)
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
    check_flag(resource, "durable", _durable(existing), _durable(requested))
    check_flag(resource, "auto_delete", bool(existing["auto_delete"]), bool(requested["auto_delete"]))
    current = existing.get("arguments") or {}
    check_args_equivalent(
        resource, current, requested.get("arguments") or {}, QUEUE_TYPE_ARGUMENTS[queue_type_of(current)]
    )


def _durable(declaration: dict) -> bool:
    return bool(declaration["durable"]) and not declaration["exclusive"]

