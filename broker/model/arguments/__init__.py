"""queue.declare / exchange.declare argument checks with RabbitMQ's exact reply texts, one module per concern:
queue.py (new queues and their redeclaration), exchange.py (likewise for exchanges), common.py (the error, and
the equivalence of a redeclaration's arguments). The field-table values in the texts are printed by
protocol.erlang_terms.

The checks and texts come from RabbitMQ 3.10 (rabbit_amqqueue:check_declare_arguments and declare_args,
rabbit_misc:assert_args_equivalence, rabbit_exchange:assert_equivalence, the r_arg type checks of
rabbit_channel). RabbitMQ validates the arguments of a *new* queue or exchange only; a redeclaration is checked
for equivalence instead, so callers use validate_* for a new entity and check_*_equivalent for an existing one.
"""

from broker.model.arguments.common import ArgumentError
from broker.model.arguments.exchange import check_exchange_equivalent, validate_exchange_arguments
from broker.model.arguments.queue import (
    QUEUE_TYPE_MODULES, check_queue_equivalent, check_queue_type_properties, queue_type_of, validate_consume_arguments,
    validate_queue_arguments,
)

__all__ = [
    "QUEUE_TYPE_MODULES", "ArgumentError", "check_exchange_equivalent", "check_queue_equivalent", "check_queue_type_properties",
    "queue_type_of", "validate_consume_arguments",
    "validate_exchange_arguments", "validate_queue_arguments",
]
