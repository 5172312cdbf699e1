"""A durable declare whose arguments look like the store's own encoding no longer stops every later start."""

from __future__ import annotations

import pika

from tests.integration.helpers import connect, enqueue, get_all

# One-key tables shaped like the tags of the first definitions format, with values that do not decode
HOSTILE_ARGUMENTS = {
    "x-foo": {"__warren_decimal__": "nope"},
    "foo": {"__warren_bytes__": "not base64!"},
    "when": {"__warren_datetime__": "yesterday"},
}


def test_a_queue_declared_with_arguments_shaped_like_the_encoding_survives_restarts(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("hostile", durable=True, arguments=HOSTILE_ARGUMENTS)
        enqueue(conn, "hostile", [b"kept"], properties=pika.BasicProperties(delivery_mode=2))
    for _ in range(2):
        broker.restart()
        with connect(broker) as conn:
            ch = conn.channel()
            ch.queue_declare("hostile", durable=True, arguments=HOSTILE_ARGUMENTS)  # equivalent: declare-ok
    with connect(broker) as conn:
        assert get_all(conn.channel(), "hostile") == [b"kept"]
    assert "Traceback" not in broker.log()
