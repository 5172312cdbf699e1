"""exchange.declare arguments: RabbitMQ checks only the alternate exchange's type for a new exchange (and the
delayed message plugin its x-delayed-type), and the flags and alternate exchange of a redeclaration
(rabbit_exchange:assert_equivalence)."""

from broker.model.arguments.common import (
    check_args_equivalent, check_flag, check_name_type, is_longstr, precondition_failed, text_of,
)

DELAYED_TYPE = "x-delayed-message"  # the delayed message plugin's exchange type
FEDERATION_UPSTREAM_TYPE = "x-federation-upstream"  # what RabbitMQ's exchange federation declares on its upstream
ROUTING_KINDS = ("direct", "fanout", "topic", "headers")  # the exchange types one may route as


def _exchange_resource(exchange: str, vhost: str) -> str:
    return f"exchange '{exchange}' in vhost '{vhost}'"


def validate_exchange_arguments(exchange: str, vhost: str, kind: str, arguments: dict) -> None:
    """Check the arguments of an exchange of type kind about to be created (RabbitMQ checks only the
    alternate-exchange type; the delayed message plugin, x-delayed-type)."""
    check_name_type(arguments, "alternate-exchange", _exchange_resource(exchange, vhost))
    if kind == DELAYED_TYPE:
        _check_delayed_type(arguments.get("x-delayed-type"))
    if kind == FEDERATION_UPSTREAM_TYPE:  # (rabbit_federation_util:validate_arg)
        hops = arguments.get("x-max-hops")
        if hops is None:
            raise precondition_failed("Argument x-max-hops missing")
        if not isinstance(hops, int) or isinstance(hops, bool):
            raise precondition_failed("Argument x-max-hops must be of type long")


def _check_delayed_type(value) -> None:
    """rabbit_exchange_type_delayed_message:validate/1."""
    if not is_longstr(value):
        raise precondition_failed("Invalid argument, 'x-delayed-type' must be an existing exchange type")
    routing = text_of(value)
    if routing == DELAYED_TYPE:
        raise precondition_failed("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
    if routing not in ROUTING_KINDS:
        raise precondition_failed(f"unknown exchange type '{routing}'")


def check_exchange_equivalent(exchange: str, vhost: str, existing: dict, requested: dict) -> None:
    """existing/requested: {'type','durable','auto_delete','internal','arguments'}; raises ArgumentError with
    RabbitMQ's text when a redeclaration does not match the exchange."""
    resource = _exchange_resource(exchange, vhost)
    check_flag(resource, "type", existing["type"], requested["type"])
    for flag in ("durable", "auto_delete", "internal"):
        check_flag(resource, flag, bool(existing[flag]), bool(requested[flag]))
    compared = ("alternate-exchange", "x-max-hops") if existing["type"] == FEDERATION_UPSTREAM_TYPE else (
        "alternate-exchange",)
    check_args_equivalent(resource, existing.get("arguments") or {}, requested.get("arguments") or {}, compared)
