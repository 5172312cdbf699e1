"""What a graceful restart (SIGTERM, then a new broker process on the same data dir) keeps: durable exchanges,
queues and bindings (exchange-to-exchange and amq.* sources included) and the persistent messages of durable
queues, exactly as they were, redelivered flags included; and what it drops: non-durable and exclusive queues,
non-durable exchanges, bindings with a non-durable end, transient messages, deleted definitions.

Each test runs a broker process of its own, so these run only against Warren. The redelivered flags expected here
were checked against RabbitMQ 3.10: after a restart a message is redelivered=True exactly when it had been
delivered (and not acked) before the stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pika
import pytest

from broker.model.access import DEFAULT_HASHING, Permission, User, hash_password
from broker.model.vhost import VirtualHost
from storage.store import MessageStore
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


# --- store keys of names that hold "|" -------------------------------------------------------------------------

def vhost_url(broker, vhost: str) -> str:
    return broker.url.rsplit("/", 1)[0] + "/" + management.quote(vhost)


TENANTS = (("a", "b|c"), ("a|b", "c"))  # (vhost, queue): joined by "|", both were "a|b|c"


def test_queues_of_two_vhosts_whose_names_joined_are_alike_each_keep_their_own_messages(own_broker):
    """Vhost "a" with queue "b|c" and vhost "a|b" with queue "c": each keeps its own persistent message and its own
    definition across restarts (their store keys were once one: "a" lost its queue, "a|b" got both messages)."""
    broker = own_broker()
    for vhost, queue in TENANTS:
        management.add_vhost(broker, vhost)
        management.set_permissions(broker, vhost, "guest")
        with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, vhost))) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(queue, durable=True)
            ch.basic_publish("", queue, f"{vhost} {queue}".encode(), PERSISTENT)
    for _ in range(2):  # the second start finds the same
        graceful_restart(broker)
        for vhost, queue in TENANTS:
            with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, vhost))) as conn:
                assert message_count(conn.channel(), queue) == 1
    for vhost, queue in TENANTS:
        with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, vhost))) as conn:
            assert get_all(conn.channel(), queue) == [f"{vhost} {queue}".encode()]


def persistent_header(body: bytes) -> bytes:
    """The content header payload of a persistent message with no other property."""
    return b"\x00\x3c\x00\x00" + len(body).to_bytes(8, "big") + b"\x10\x00\x02"


def write_data_dir(data_dir, definitions: list[tuple[str, str, dict]], messages: list[tuple[str, bytes]]) -> None:
    """A data dir holding these definition records (kind, name, data) and persistent messages (store key, body)
    stored for the default exchange, as the store keeps them: the names and keys are given as they are."""
    async def write() -> None:
        store = MessageStore(data_dir)
        store.recover()
        for kind, name, data in definitions:
            store.append_definition(kind, name, data)
        for msg_id, (key, body) in enumerate(messages, 1):
            store.append_message(msg_id, (key,), "", key.rpartition("|")[2], persistent_header(body), body)
        written = asyncio.get_running_loop().create_future()
        store.when_durable(written.set_result)
        assert await written
        store.close()
    asyncio.run(write())


def earlier_data_dir(data_dir, vhosts: list[str], queues: list[tuple[str, str]],
                     messages: list[tuple[str, bytes]]) -> None:
    """A data dir as an earlier version wrote it: user guest with every permission on the vhosts and durable
    queues (vhost, name), under its keys (names joined by NUL or "|", as they were), with messages under those
    keys."""
    guest = User("guest", hash_password("guest"), DEFAULT_HASHING, ["administrator"])
    definitions = [("user", "guest", guest.definition())]
    for vhost in vhosts:
        definitions.append(("vhost", vhost, VirtualHost(vhost, None, None).definition()))
        permission = Permission("guest", vhost, ".*", ".*", ".*")
        definitions.append(("permission", f"{vhost}\x00guest", permission.definition()))
    for vhost, queue in queues:
        data = {"vhost": vhost, "name": queue, "durable": True, "auto_delete": False, "arguments": {}}
        definitions.append(("queue", f"{vhost}|{queue}", data))
    write_data_dir(data_dir, definitions, messages)


def test_a_data_dir_of_an_earlier_version_is_read_with_its_keys_rewritten(own_broker, tmp_path):
    """Queues of names holding "|", and vhosts' permissions (keys of NUL-joined names), each found under an
    earlier version's key: every queue keeps its messages, in order, and the next start finds them the same."""
    data_dir = tmp_path / "data"
    queues = [("p|q", "r"), ("/", "s|t"), ("/", "plain")]
    earlier_data_dir(data_dir, ["/", "p|q"], queues, [
        ("p|q|r", b"r-1"), ("/|s|t", b"st-1"), ("p|q|r", b"r-2"), ("/|plain", b"plain-1")])
    broker = own_broker(data_dir=data_dir)
    expected = {("p|q", "r"): [b"r-1", b"r-2"], ("/", "s|t"): [b"st-1"], ("/", "plain"): [b"plain-1"]}
    for _ in range(2):
        for (vhost, queue), bodies in expected.items():
            with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, vhost))) as conn:
                assert message_count(conn.channel(), queue) == len(bodies)
        graceful_restart(broker)
    assert broker.log().count("rewrote the store keys") == 1
    for (vhost, queue), bodies in expected.items():
        with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, vhost))) as conn:
            assert get_all(conn.channel(), queue) == bodies
    assert broker.stop() == 0
    store = MessageStore(data_dir)
    store.recover()
    names = {(kind, name) for kind, name, _ in store.definitions() if kind in ("queue", "permission")}
    store.close()
    assert names == {("queue", "p\\|q|r"), ("queue", "/|s\\|t"), ("queue", "/|plain"), ("permission", "/|guest"),
                     ("permission", "p\\|q|guest")}
    assert not (data_dir / "quarantine").exists()


def test_messages_two_vhosts_shared_under_an_earlier_versions_key_go_to_neither(own_broker, tmp_path):
    """An earlier version kept vhost "a"'s queue "b|c" and vhost "a|b"'s queue "c" under one key, the definition
    declared last ("a|b"'s) and both tenants' messages: nobody can tell whose each is, so they are set aside in
    quarantine/ with an ERROR naming the key, and the queue recorded last comes back empty."""
    data_dir = tmp_path / "data"
    earlier_data_dir(data_dir, ["/", "a", "a|b"], [("a|b", "c")], [("a|b|c", b"for a"), ("a|b|c", b"for a|b")])
    broker = own_broker(data_dir=data_dir)
    with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, "a|b"))) as conn:
        assert message_count(conn.channel(), "c") == 0
    with pika.BlockingConnection(pika.URLParameters(vhost_url(broker, "a"))) as conn:
        assert not_found(lambda: conn.channel().queue_declare("b|c", passive=True)) == (404, "NOT_FOUND")
    [kept] = (data_dir / "quarantine").iterdir()
    assert kept.read_bytes().count(b"for a") == 2
    assert "set aside in" in broker.log() and "'a|b|c'" in broker.log()


def test_policies_of_two_vhosts_whose_names_joined_by_nul_are_alike_both_survive(own_broker):
    """Names may hold a NUL (the API takes %00): vhost "a\\x00b" with policy "c" and vhost "a" with policy
    "b\\x00c" were once one record, the one set last; each keeps its own now, and clearing one leaves the other."""
    broker = own_broker()
    tenants = (("a\x00b", "c"), ("a", "b\x00c"))
    for vhost, policy in tenants:
        management.add_vhost(broker, vhost)
        management.set_policy(broker, vhost, policy, "^q", {"max-length": 1})
    graceful_restart(broker)
    for vhost, policy in tenants:
        reply = management.request(broker, "GET", f"/api/policies/{management.quote(vhost)}/{management.quote(policy)}")
        assert reply.status == 200, (vhost, policy)
        assert (reply.body["vhost"], reply.body["name"]) == (vhost, policy)
    management.clear_policy(broker, "a", "b\x00c")
    graceful_restart(broker)
    assert management.request(broker, "GET", "/api/policies/a%00b/c").status == 200
    assert management.request(broker, "GET", "/api/policies/a/b%00c").status == 404
