"""What a graceful restart (SIGTERM, then a new broker process on the same data dir) keeps: durable exchanges,
queues and bindings (exchange-to-exchange and amq.* sources included) and the persistent messages of durable
queues, exactly as they were, redelivered flags included; and what it drops: non-durable and exclusive queues,
non-durable exchanges, bindings with a non-durable end, transient messages, deleted definitions.

Each test runs a broker process of its own, so these run only against Warren. The redelivered flags expected here
were checked against RabbitMQ 3.10: after a restart a message is redelivered=True exactly when it had been
delivered (and not acked) before the stop."""

from __future__ import annotations

import contextlib
import signal

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    channel_error,
    connect,
    consume,
    drain_with_flags,
    enqueue,
    get,
    get_all,
    message_count,
    sync,
    wait_until,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def graceful_restart(broker, *clients: pika.BlockingConnection) -> None:
    """SIGTERM (the broker must exit 0), then a new process on the same port and data dir. `clients` still
    connected answer the broker's connection.close, so the stop need not wait for them."""
    broker.process.send_signal(signal.SIGTERM)
    for client in clients:
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            wait_until(client, lambda: False, timeout=10)  # returns only by the broker's connection.close
    assert broker.stop() == 0
    broker.start()


def abandon(conn: pika.BlockingConnection) -> None:
    """Let go of a connection whose broker was stopped or killed under it."""
    with contextlib.suppress(pika.exceptions.AMQPError):
        conn.close()


def routed_to(ch, publishes, queues) -> dict[str, list[bytes]]:
    """Publish each (exchange, routing key, body, headers) in confirm mode, then drain `queues`: where did they go?"""
    publisher = ch.connection.channel()
    publisher.confirm_delivery()
    for exchange, routing_key, body, headers in publishes:
        publisher.basic_publish(exchange, routing_key, body, pika.BasicProperties(headers=headers))
    publisher.close()
    return {queue: get_all(ch, queue) for queue in queues}


def not_found(action) -> tuple[int, str]:
    code, text = channel_error(action)
    return code, text.split(" - ")[0]


# --- definitions ---------------------------------------------------------------------------------------------

def declare_durable_topology(ch) -> None:
    """Durable exchanges of every type (one with an alternate exchange, one internal), durable queues with
    arguments, and bindings: exchange to queue (with a key, a pattern, header arguments), exchange to exchange,
    and amq.direct / amq.topic as sources."""
    ch.exchange_declare("d.fanout-ae", "fanout", durable=True)
    ch.exchange_declare("d.direct", "direct", durable=True, arguments={"alternate-exchange": "d.fanout-ae"})
    ch.exchange_declare("d.topic", "topic", durable=True)
    ch.exchange_declare("d.headers", "headers", durable=True)
    ch.exchange_declare("d.internal", "fanout", durable=True, internal=True)
    ch.queue_declare("q.direct", durable=True, arguments={"x-max-length": 100})
    for queue in ("q.topic", "q.headers", "q.ae", "q.amq", "q.chain"):
        ch.queue_declare(queue, durable=True)
    ch.queue_bind("q.direct", "d.direct", "k1")
    ch.queue_bind("q.topic", "d.topic", "a.*.c")
    ch.queue_bind("q.headers", "d.headers", "", arguments={"x-match": "all", "kind": "x", "size": 3})
    ch.queue_bind("q.ae", "d.fanout-ae")
    ch.queue_bind("q.amq", "amq.direct", "to-q-amq")
    ch.queue_bind("q.chain", "d.internal")
    ch.exchange_bind("d.topic", "d.direct", "a.b.c")  # destination, source, key
    ch.exchange_bind("d.internal", "amq.topic", "chain.#")


TOPOLOGY_QUEUES = ("q.direct", "q.topic", "q.headers", "q.ae", "q.amq", "q.chain")
TOPOLOGY_PUBLISHES = [
    ("d.direct", "k1", b"direct", None),
    ("d.topic", "a.x.c", b"topic", None),
    ("d.direct", "a.b.c", b"direct-to-topic", None),  # exchange-to-exchange
    ("d.headers", "", b"headers-match", {"kind": "x", "size": 3}),
    ("d.headers", "", b"headers-miss", {"kind": "x"}),
    ("d.direct", "unbound-key", b"alternate", None),  # unroutable in d.direct: to its alternate exchange
    ("amq.direct", "to-q-amq", b"amq-direct", None),
    ("amq.topic", "chain.one.two", b"amq-topic-to-internal", None),  # amq.* source, exchange-to-exchange
]
TOPOLOGY_ROUTES = {
    "q.direct": [b"direct"],
    "q.topic": [b"topic", b"direct-to-topic"],
    "q.headers": [b"headers-match"],
    "q.ae": [b"alternate"],
    "q.amq": [b"amq-direct"],
    "q.chain": [b"amq-topic-to-internal"],
}


def test_durable_exchanges_queues_and_bindings_survive_a_restart(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        declare_durable_topology(ch)
        assert routed_to(ch, TOPOLOGY_PUBLISHES, TOPOLOGY_QUEUES) == TOPOLOGY_ROUTES

    graceful_restart(broker)
    with connect(broker) as conn:
        ch = conn.channel()
        declare_durable_topology(ch)  # an equivalent re-declaration is accepted: same types, flags, arguments
        assert routed_to(ch, TOPOLOGY_PUBLISHES, TOPOLOGY_QUEUES) == TOPOLOGY_ROUTES


def test_restored_definitions_keep_their_type_flags_and_arguments(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        declare_durable_topology(conn.channel())
    graceful_restart(broker)

    with connect(broker) as conn:
        code, text = channel_error(lambda: conn.channel().exchange_declare("d.topic", "direct", durable=True))
        assert (code, text) == (406, ("PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'd.topic' in vhost "
                                      "'/': received 'direct' but current is 'topic'"))
        code, text = channel_error(lambda: conn.channel().queue_declare("q.direct", durable=True,
                                                                         arguments={"x-max-length": 5}))
        assert (code, text) == (406, ("PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q.direct' in "
                                      "vhost '/': received '5' but current is '100'"))
        code, text = channel_error(lambda: conn.channel().queue_declare("q.topic", durable=False))
        assert (code, text) == (406, ("PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q.topic' in vhost "
                                      "'/': received 'false' but current is 'true'"))
        publisher = conn.channel()
        code, _ = channel_error(lambda: (publisher.basic_publish("d.internal", "", b"x"), sync(publisher)))
        assert code == 403  # still internal: clients cannot publish to it


def test_non_durable_and_exclusive_definitions_do_not_survive(own_broker):
    broker = own_broker()
    holder = pika.BlockingConnection(pika.URLParameters(broker.url))  # owns the exclusive queue until the stop
    ch = holder.channel()
    ch.exchange_declare("durable-x", "direct", durable=True)
    ch.exchange_declare("transient-x", "direct", durable=False)
    ch.queue_declare("durable-q", durable=True)
    ch.queue_declare("transient-q", durable=False)
    ch.queue_declare("exclusive-durable-q", durable=True, exclusive=True)
    ch.queue_bind("transient-q", "durable-x", "to-transient-q")  # durable source, non-durable queue
    ch.exchange_bind("transient-x", "durable-x", "to-transient-x")  # durable source, non-durable exchange
    ch.queue_bind("durable-q", "transient-x", "from-transient-x")  # non-durable source, durable queue
    ch.queue_bind("durable-q", "durable-x", "to-durable-q")  # the one binding that stays
    graceful_restart(broker, holder)

    with connect(broker) as conn:
        for action in (lambda c: c.exchange_declare("transient-x", passive=True),
                       lambda c: c.queue_declare("transient-q", passive=True),
                       lambda c: c.queue_declare("exclusive-durable-q", passive=True)):
            assert not_found(lambda action=action: action(conn.channel())) == (404, "NOT_FOUND")
        ch = conn.channel()
        # the same names declared again start without the old bindings
        ch.exchange_declare("transient-x", "direct")
        ch.queue_declare("transient-q")
        ch.queue_bind("transient-q", "transient-x", "to-transient-q")  # catches anything the old e2e binding passes
        publishes = [("durable-x", "to-transient-q", b"a", None), ("durable-x", "to-transient-x", b"b", None),
                     ("transient-x", "from-transient-x", b"c", None), ("durable-x", "to-durable-q", b"d", None)]
        assert routed_to(ch, publishes, ("transient-q", "durable-q")) == {"transient-q": [], "durable-q": [b"d"]}


def test_exclusive_durable_queue_does_not_come_back_after_a_crash(own_broker):
    broker = own_broker()
    owner = pika.BlockingConnection(pika.URLParameters(broker.url))  # still connected at the crash
    ch = owner.channel()
    ch.queue_declare("exclusive-durable-q", durable=True, exclusive=True)
    ch.queue_declare("durable-q", durable=True)
    enqueue(owner, "exclusive-durable-q", [b"x"], properties=PERSISTENT)
    enqueue(owner, "durable-q", [b"y"], properties=PERSISTENT)  # confirmed: everything before it is on disk
    broker.kill()
    abandon(owner)
    broker.start()
    with connect(broker) as conn:
        assert not_found(lambda: conn.channel().queue_declare("exclusive-durable-q", passive=True)) == \
            (404, "NOT_FOUND")
        assert message_count(conn.channel(), "durable-q") == 1


def test_deleted_definitions_stay_deleted(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("src", "direct", durable=True)
        ch.exchange_declare("dst", "fanout", durable=True)
        for queue in ("doomed", "kept", "via-dst"):
            ch.queue_declare(queue, durable=True)
        ch.queue_bind("doomed", "src", "to-doomed")
        ch.queue_bind("kept", "src", "unbound-later")
        ch.queue_bind("kept", "src", "to-kept")
        ch.exchange_bind("dst", "src", "to-dst")
        ch.queue_bind("via-dst", "dst")
        enqueue(conn, "doomed", [b"old-1", b"old-2"], properties=PERSISTENT)
    graceful_restart(broker)

    with connect(broker) as conn:
        ch = conn.channel()
        assert message_count(ch, "doomed") == 2
        ch.queue_delete("doomed")
        ch.queue_unbind("kept", "src", "unbound-later")
        ch.exchange_unbind("dst", "src", "to-dst")
        ch.exchange_delete("dst")
    graceful_restart(broker)

    with connect(broker) as conn:
        assert not_found(lambda: conn.channel().queue_declare("doomed", passive=True)) == (404, "NOT_FOUND")
        assert not_found(lambda: conn.channel().exchange_declare("dst", passive=True)) == (404, "NOT_FOUND")
        ch = conn.channel()
        assert ch.queue_declare("doomed", durable=True).method.message_count == 0  # old messages stay gone
        ch.exchange_declare("dst", "fanout", durable=True)
        ch.queue_bind("via-dst", "dst")
        publishes = [("src", "to-doomed", b"a", None), ("src", "unbound-later", b"b", None),
                     ("src", "to-dst", b"c", None), ("src", "to-kept", b"d", None)]
        assert routed_to(ch, publishes, ("doomed", "kept", "via-dst")) == \
            {"doomed": [], "kept": [b"d"], "via-dst": []}
    graceful_restart(broker)  # a re-declared queue of a deleted one's name is a new durable queue

    with connect(broker) as conn:
        ch = conn.channel()
        enqueue(conn, "doomed", [b"new"], properties=PERSISTENT)
    graceful_restart(broker)
    with connect(broker) as conn:
        assert drain_with_flags(conn.channel(), "doomed") == [(b"new", False)]


def test_same_named_exchanges_of_two_vhosts_both_survive(own_broker):
    """Each vhost's durable exchange keeps its own definition, and deleting one leaves the other."""
    broker = own_broker()
    management.add_vhost(broker, "other")
    management.set_permissions(broker, "other", "guest")
    other_url = broker.url.rsplit("/", 1)[0] + "/other"
    with connect(broker) as conn:
        conn.channel().exchange_declare("shared", "topic", durable=True)
    with pika.BlockingConnection(pika.URLParameters(other_url)) as conn:
        conn.channel().exchange_declare("shared", "fanout", durable=True)
    graceful_restart(broker)

    with connect(broker) as conn:
        conn.channel().exchange_declare("shared", "topic", durable=True)  # still a topic exchange: equivalent
    with pika.BlockingConnection(pika.URLParameters(other_url)) as conn:
        conn.channel().exchange_declare("shared", "fanout", durable=True)
        conn.channel().exchange_delete("shared")
    graceful_restart(broker)

    with connect(broker) as conn:
        conn.channel().exchange_declare("shared", "topic", passive=True)
    with pika.BlockingConnection(pika.URLParameters(other_url)) as conn:
        assert not_found(lambda: conn.channel().exchange_declare("shared", passive=True)) == (404, "NOT_FOUND")


# --- messages --------------------------------------------------------------------------------------------------

RICH_PROPERTIES = pika.BasicProperties(
    content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=3,
    correlation_id="corr-1", reply_to="replies", message_id="id-1", timestamp=1_700_000_000, type="kind",
    user_id="guest", app_id="tests", headers={"s": "text", "i": 7, "big": 2**40, "flag": True,
                                              "nested": {"list": [1, "two"], "inner": {"x": -1}}},
)


def test_persistent_messages_on_durable_queues_survive_and_nothing_else_does(own_broker):
    broker = own_broker()
    with connect(broker) as conn:
        ch = conn.channel()
        ch.exchange_declare("fan", "fanout", durable=True)
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("transient-q", durable=False)
        ch.queue_bind("durable-q", "fan")
        ch.queue_bind("transient-q", "fan")
        ch.confirm_delivery()
        for index in range(6):
            ch.basic_publish("", "durable-q", f"persistent-{index}".encode(), PERSISTENT)
            ch.basic_publish("", "durable-q", f"transient-{index}".encode(), TRANSIENT)
            ch.basic_publish("", "durable-q", f"no-mode-{index}".encode())
        ch.basic_publish("fan", "rk", b"fanned-persistent", PERSISTENT)
        ch.basic_publish("fan", "rk", b"fanned-transient", TRANSIENT)
        ch.basic_publish("", "transient-q", b"persistent-on-transient-q", PERSISTENT)
        ch.basic_publish("", "durable-q", b"rich", RICH_PROPERTIES)
        assert message_count(ch, "durable-q") == 6 * 3 + 3
    graceful_restart(broker)

    with connect(broker) as conn:
        ch = conn.channel()
        assert not_found(lambda: conn.channel().queue_declare("transient-q", passive=True)) == (404, "NOT_FOUND")
        survivors = []
        while (message := get(ch, "durable-q")) is not None:
            survivors.append(message)
        expected = [f"persistent-{index}".encode() for index in range(6)] + [b"fanned-persistent", b"rich"]
        assert [message.body for message in survivors] == expected
        assert [(m.exchange, m.routing_key, m.redelivered) for m in survivors] == \
            [("", "durable-q", False)] * 6 + [("fan", "rk", False), ("", "durable-q", False)]
        assert vars(survivors[-1].properties) == vars(RICH_PROPERTIES)


def test_graceful_stop_then_restart_shows_exactly_the_previous_state(own_broker):
    broker = own_broker()
    names = [f"m{index}".encode() for index in range(20)]
    client = pika.BlockingConnection(pika.URLParameters(broker.url))  # stays open across the stop
    ch = client.channel()
    ch.exchange_declare("fan", "fanout", durable=True)
    for queue in ("worked", "untouched"):
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "fan")
    publisher = client.channel()
    publisher.confirm_delivery()
    for body in names:
        publisher.basic_publish("fan", "", body, PERSISTENT)

    method, _, body = ch.basic_get("worked")
    assert body == b"m0"
    ch.basic_ack(method.delivery_tag)  # m0 is gone
    method, _, body = ch.basic_get("worked")
    ch.basic_reject(method.delivery_tag, requeue=True)  # m1 goes back to the head, redelivered
    ch.basic_qos(prefetch_count=4)
    tag, inbox = consume(ch, "worked")
    deliveries = inbox.wait_for(client, 4)
    ch.basic_cancel(tag)  # no more deliveries: exactly m1..m4 are out
    assert [(d.body, d.redelivered) for d in deliveries] == \
        [(b"m1", True), (b"m2", False), (b"m3", False), (b"m4", False)]
    ch.basic_ack(deliveries[1].delivery_tag)
    ch.basic_ack(deliveries[3].delivery_tag)
    sync(ch)  # m1 and m3 are unacked at the stop: they come back redelivered, in their places
    expected_worked = [(b"m1", True), (b"m3", True)] + [(body, False) for body in names[5:]]
    expected_untouched = [(body, False) for body in names]

    graceful_restart(broker, client)
    with connect(broker) as conn:
        ch = conn.channel()
        assert message_count(ch, "untouched") == len(expected_untouched)
        assert drain_with_flags(ch, "worked") == expected_worked
        publisher = conn.channel()
        publisher.confirm_delivery()
        for body in (b"after-1", b"after-2"):  # message ids continue after the restart
            publisher.basic_publish("fan", "", body, PERSISTENT)

    graceful_restart(broker)  # a second restart: no duplicates, nothing drained comes back, flags unchanged
    with connect(broker) as conn:
        ch = conn.channel()
        after = [(b"after-1", False), (b"after-2", False)]
        assert drain_with_flags(ch, "worked") == after
        assert drain_with_flags(ch, "untouched") == expected_untouched + after
    graceful_restart(broker)
    with connect(broker) as conn:
        ch = conn.channel()
        assert (message_count(ch, "worked"), message_count(ch, "untouched")) == (0, 0)
