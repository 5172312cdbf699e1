"""Dead-lettering: rejected, expired and length-limited messages go to the queue's dead-letter exchange with an
x-death history, as RabbitMQ 3.x records it."""

import pika
import pytest

from tests.integration.helpers import channel_error, connect, prefetch_one_consumer, stay_quiet, wait_until


class DeadLetters:
    """A dead-letter exchange (fanout) and the queue that collects what it receives."""

    def __init__(self, conn: pika.BlockingConnection, name: str):
        self.conn = conn
        self.ch = conn.channel()
        self.ch.confirm_delivery()
        self.exchange = f"{name}-dlx"
        self.collected = f"{name}-dead"
        self.ch.exchange_declare(self.exchange, "fanout", auto_delete=True)
        self.ch.queue_declare(self.collected, exclusive=True)
        self.ch.queue_bind(self.collected, self.exchange)

    def source(self, name: str, **arguments) -> str:
        self.ch.queue_declare(name, exclusive=True, arguments={"x-dead-letter-exchange": self.exchange, **arguments})
        return name

    def next(self) -> tuple:
        """The next dead-lettered message as (method, properties, body), waiting for it."""
        got = []
        wait_until(self.conn, lambda: got.append(self.ch.basic_get(self.collected, auto_ack=True)) or got[-1][0])
        return got[-1]


@pytest.fixture
def dead(broker, unique):
    with connect(broker) as conn:
        yield DeadLetters(conn, unique)


def test_a_rejected_message_is_dead_lettered_with_its_history(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"no", pika.BasicProperties(expiration="60000", headers={"kept": "yes"}))
    method, _properties, _body = dead.ch.basic_get(source)
    dead.ch.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = dead.next()
    assert (body, method.exchange, method.routing_key, method.redelivered) == (b"no", dead.exchange, source, False)
    assert properties.expiration is None
    headers = properties.headers
    [death] = headers["x-death"]
    assert {key: value for key, value in death.items() if key != "time"} == {
        "count": 1, "reason": "rejected", "queue": source, "exchange": "", "routing-keys": [source],
        "original-expiration": "60000"}
    assert (headers["kept"], headers["x-first-death-queue"], headers["x-first-death-reason"],
            headers["x-first-death-exchange"]) == ("yes", source, "rejected", "")


def test_dying_again_in_the_same_queue_counts_up(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"twice")
    for _ in range(2):
        method, _properties, _body = dead.ch.basic_get(source)
        dead.ch.basic_nack(method.delivery_tag, requeue=False)
        method, properties, body = dead.next()
        dead.ch.basic_publish("", source, body, properties)  # back to the source, history and all
    method, _properties, _body = dead.ch.basic_get(source)
    dead.ch.basic_nack(method.delivery_tag, requeue=False)
    _method, properties, _body = dead.next()
    assert [(death["queue"], death["reason"], death["count"]) for death in properties.headers["x-death"]] == [
        (source, "rejected", 3)]


def test_an_expired_message_uses_the_dead_letter_routing_key_and_drops_cc(dead, unique):
    source = dead.source(unique, **{"x-message-ttl": 50, "x-dead-letter-routing-key": "expired-key"})
    dead.ch.queue_bind(source, "amq.direct", unique)
    dead.ch.basic_publish("amq.direct", unique, b"late", pika.BasicProperties(headers={"CC": ["elsewhere"]}))
    method, properties, body = dead.next()
    assert (body, method.exchange, method.routing_key) == (b"late", dead.exchange, "expired-key")
    assert "CC" not in properties.headers
    [death] = properties.headers["x-death"]
    assert (death["reason"], death["queue"], death["exchange"], death["routing-keys"]) == (
        "expired", source, "amq.direct", [unique, "elsewhere"])
    assert dead.ch.queue_declare(source, passive=True).method.message_count == 0


def test_a_per_message_expiration_expires_it(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"short-lived", pika.BasicProperties(expiration="30"))
    _method, properties, body = dead.next()
    assert (body, properties.expiration, properties.headers["x-death"][0]["original-expiration"]) == (
        b"short-lived", None, "30")


@pytest.mark.parametrize("expiration, text", [
    ("soon", "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"),
    ("-5", "PRECONDITION_FAILED - invalid expiration '-5': {value_negative,-5}"),
])
def test_an_invalid_expiration_closes_the_channel(broker, unique, expiration, text):
    with connect(broker) as conn:
        ch = conn.channel()
        assert channel_error(
            lambda: ch.basic_publish("", unique, b"x", pika.BasicProperties(expiration=expiration)), ch) == (406, text)


def test_length_limits_dead_letter_as_maxlen(dead, unique):
    dropping = dead.source(f"{unique}-drop", **{"x-max-length": 1})
    refusing = dead.source(f"{unique}-refuse", **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    for queue in (dropping, refusing):
        dead.ch.basic_publish("", queue, b"first")
        try:
            dead.ch.basic_publish("", queue, b"second")
        except pika.exceptions.NackError:
            pass  # reject-publish-dlx refuses the second message (and dead-letters it)
    outcomes = sorted((body, properties.headers["x-death"][0]["queue"], properties.headers["x-death"][0]["reason"])
                      for _method, properties, body in (dead.next(), dead.next()))
    assert outcomes == [(b"first", dropping, "maxlen"), (b"second", refusing, "maxlen")]


def test_an_expiry_cycle_is_dropped_but_a_rejection_cycle_is_not(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        # expires into the default exchange with its own name as routing key: straight back into itself
        looping = f"{unique}-loop"
        ch.queue_declare(looping, exclusive=True, arguments={
            "x-message-ttl": 20, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": looping})
        ch.basic_publish("", looping, b"round and round")
        wait_until(conn, lambda: ch.queue_declare(looping, passive=True).method.message_count == 0)
        rejecting = f"{unique}-reject"
        ch.queue_declare(rejecting, exclusive=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": rejecting})
        ch.basic_publish("", rejecting, b"again")
        method, _properties, _body = ch.basic_get(rejecting)
        ch.basic_reject(method.delivery_tag, requeue=False)
        got = []
        wait_until(conn, lambda: got.append(ch.basic_get(rejecting, auto_ack=True)) or got[-1][0])
        assert got[-1][1].headers["x-death"][0]["reason"] == "rejected"


def test_a_missing_dead_letter_exchange_drops_the_message(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, exclusive=True, arguments={"x-dead-letter-exchange": f"{unique}-nowhere"})
        ch.basic_publish("", unique, b"lost")
        method, _properties, _body = ch.basic_get(unique)
        ch.basic_reject(method.delivery_tag, requeue=False)
        assert ch.queue_declare(unique, passive=True).method.message_count == 0


def test_a_message_behind_the_head_expires_on_time_once_the_head_is_delivered(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"head")
    dead.ch.basic_publish("", source, b"behind", pika.BasicProperties(expiration="100"))
    consumer = dead.conn.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(source, lambda *args: None)  # takes "head" and keeps it unacked
    _method, properties, body = dead.next()
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"behind", "expired")


def test_a_purged_message_never_expires_but_one_unacked_meanwhile_expires_once_returned(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"held", pika.BasicProperties(expiration="100"))
    method, _properties, _body = dead.ch.basic_get(source)
    dead.ch.basic_publish("", source, b"purged", pika.BasicProperties(expiration="100"))
    assert dead.ch.queue_purge(source).method.message_count == 1
    dead.conn.sleep(0.3)  # both TTLs run out: "purged" is gone, "held" is out of the queue
    dead.ch.basic_reject(method.delivery_tag, requeue=True)
    _method, properties, body = dead.next()
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"held", "expired")
    stay_quiet(dead.conn)
    assert dead.ch.basic_get(dead.collected)[0] is None


def test_an_expired_message_is_not_delivered_even_behind_a_live_one(broker, unique):
    with connect(broker) as conn:
        conn.channel().queue_declare(unique, exclusive=True)
        ch, got, publisher = prefetch_one_consumer(conn, unique)
        publisher.basic_publish("", unique, b"first")
        wait_until(conn, lambda: got)
        publisher.basic_publish("", unique, b"lives")
        publisher.basic_publish("", unique, b"expires", pika.BasicProperties(expiration="50"))
        conn.sleep(0.2)  # "expires" runs out of time while it waits behind "lives"
        ch.basic_ack(got[0][0])
        wait_until(conn, lambda: len(got) == 2)
        ch.basic_ack(got[1][0])
        stay_quiet(conn)
        assert [body for _, body in got] == [b"first", b"lives"]


def test_a_length_limit_that_keeps_nothing_dead_letters_the_message(dead, unique):
    source = dead.source(unique, **{"x-max-length": 0})
    dead.ch.basic_publish("", source, b"no room")
    _method, properties, body = dead.next()
    assert (body, properties.headers["x-death"][0]["reason"]) == (b"no room", "maxlen")


def test_a_rejected_delivery_of_a_deleted_queue_is_not_dead_lettered(dead, unique):
    source = dead.source(unique)
    dead.ch.basic_publish("", source, b"orphan")
    method, _properties, _body = dead.ch.basic_get(source)
    dead.conn.channel().queue_delete(source)
    dead.ch.basic_reject(method.delivery_tag, requeue=False)
    assert dead.ch.queue_declare(dead.collected, passive=True).method.message_count == 0
