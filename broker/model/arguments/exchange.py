"""exchange.declare arguments: RabbitMQ checks only the alternate exchange's type for a new exchange, and the
flags and alternate exchange of a redeclaration (rabbit_exchange:assert_equivalence)."""

from broker.model.arguments.common import check_args_equivalent, check_flag, check_name_type


def _exchange_resource(exchange: str, vhost: str) -> str:
    return f"exchange '{exchange}' in vhost '{vhost}'"


def validate_exchange_arguments(exchange: str, vhost: str, arguments: dict) -> None:
    """Check the arguments of an exchange about to be created (RabbitMQ checks only the alternate-exchange type)."""
    check_name_type(arguments, "alternate-exchange", _exchange_resource(exchange, vhost))


def check_exchange_equivalent(exchange: str, vhost: str, existing: dict, requested: dict) -> None:
    """existing/requested: {'type','durable','auto_delete','internal','arguments'}; raises ArgumentError with
    RabbitMQ's text when a redeclaration does not match the exchange."""
    resource = _exchange_resource(exchange, vhost)
    check_flag(resource, "type", existing["type"], requested["type"])
    for flag in ("durable", "auto_delete", "internal"):
        check_flag(resource, flag, bool(existing[flag]), bool(requested[flag]))
    check_args_equivalent(
        resource, existing.get("arguments") or {}, requested.get("arguments") or {}, ("alternate-exchange",)
    )
