"""Deleting a queue or an exchange with many bindings: the bindings go first, a slice a loop turn, so that the
broker's other clients are held a few milliseconds at a time, not as long as the removal takes (a queue's 100,000
topic bindings took 0.24 s in one piece); the frames its client sent after the delete see it done, its reply counts
the queue's messages, and none of the bindings is left, nor comes back after a restart."""

from __future__ import annotations

import pytest
from pamqp import body, commands, header

from tests.integration.helpers import connect
from protocol.codec import encode_method, make_method
from tests.integration.management import add_vhost, delete_vhost, quote, request
from tests.integration.rawclient import RawClient
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest
from tests.waiting import wait_for

MANY = 100_000  # bindings of the queue deleted while another client is timed
SOME = 5_000  # more than a deletion removes at once (broker.model.vhost.BINDINGS_AT_ONCE), over a few loop turns
DURABLE = 100  # of the vhost's queues, those a restart would bring back if their deletion were lost
FEW_MORE = 1_100  # more than it removes at once, all in the first loop turn
WRITE = 10_000  # binds a write holds


def bound(broker, queue: str, exchange: str, count: int, durable: bool = True, auto_delete: bool = False,
          arguments: dict | None = None, consumer: str | None = None, exchange_auto_delete: bool = False) -> RawClient:
    """A raw client on channel 1 that declared the queue (consumed by consumer, if named, before it was bound) and
    topic exchange and bound the one to the other by count patterns k.<n>.# (binds without a reply, sent in writes
    of WRITE, encoded as the broker encodes: any name of up to 255 bytes); all made when this returns. (A durable
    binding's reply, or the next frame, waits for its record on disk: 100,000 take 25 s.)"""
    client = RawClient.connect(broker, timeout=60)
    client.handshake()
    client.open_channel(1)
    client.send_raw(encode_method(1, make_method(commands.Exchange.Declare, exchange=exchange, exchange_type="topic",
                                                 durable=durable, auto_delete=exchange_auto_delete)))
    client.expect(commands.Exchange.DeclareOk)
    client.send(1, commands.Queue.Declare(queue=queue, durable=durable, auto_delete=auto_delete, arguments=arguments))
    client.expect(commands.Queue.DeclareOk)
    if consumer is not None:
        client.send(1, commands.Basic.Consume(queue=queue, consumer_tag=consumer))
        client.expect(commands.Basic.ConsumeOk)
    for start in range(0, count, WRITE):
        client.send_raw(b"".join(encode_method(1, make_method(
            commands.Queue.Bind, queue=queue, exchange=exchange, routing_key=f"k.{number}.#", nowait=True))
            for number in range(start, min(start + WRITE, count))))
    client.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every bind before it is made
    client.expect(commands.Basic.QosOk, timeout=60)
    return client


def bindings_of(broker, exchange: str) -> list:
    response = request(broker, "GET", f"/api/exchanges/%2F/{quote(exchange)}/bindings/source")
    assert response.status == 200, response  # (an exchange that is gone has none)
    return response.body


def exchange_gone(broker, exchange: str) -> bool:
    return request(broker, "GET", f"/api/exchanges/%2F/{quote(exchange)}").status == 404


@pytest.mark.alone
@pytest.mark.parametrize("subject", ["queue", "exchange"])
@pytest.mark.parametrize("door", ["amqp", "api"])
def test_deleting_a_queue_or_exchange_of_a_hundred_thousand_bindings_holds_no_other_client(broker, unique, subject,
                                                                                          door):
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ")
    exchange = f"{unique}-x"
    with bound(broker, unique, exchange, MANY, durable=False) as client:
        round_trips = RoundTrips(broker)
        try:
            if door == "api":
                path = f"/api/queues/%2F/{unique}" if subject == "queue" else f"/api/exchanges/%2F/{exchange}"
                assert request(broker, "DELETE", path).status == 204
            elif subject == "queue":
                client.send(1, commands.Queue.Delete(queue=unique))
                client.expect(commands.Queue.DeleteOk, timeout=60)
            else:
                client.send(1, commands.Exchange.Delete(exchange=exchange))
                client.expect(commands.Exchange.DeleteOk, timeout=60)
        finally:
            times = round_trips.stop()
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
    assert bindings_of(broker, exchange) == [] if subject == "queue" else exchange_gone(broker, exchange)
    if subject == "exchange":  # (the default exchange's binding is left)
        assert [binding["source"] for binding in request(broker, "GET", f"/api/queues/%2F/{unique}/bindings").body
                ] == [""]


@pytest.mark.alone
def test_deleting_a_vhost_of_a_hundred_thousand_queues_holds_no_other_client_and_leaves_nothing(broker, unique):
    """Its queues and exchanges go a few at a time (one's many bindings, a few at a time before it), the vhost unseen
    meanwhile (100,000 queues deleted in one piece held other clients 0.21 s); nothing of it comes back after a
    restart, and a vhost of that name made since is a new one."""
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ; restarts the broker")
    add_vhost(broker, unique)  # (its maker, guest, may use it)
    with RawClient.connect(broker, timeout=60) as client:
        client.handshake(vhost=unique)
        client.open_channel(1)
        client.send(1, commands.Exchange.Declare(exchange="x", exchange_type="topic", durable=True))
        client.expect(commands.Exchange.DeclareOk)
        for start in range(0, MANY, WRITE):  # (the first DURABLE durable: each declare's record is on disk before
            client.send_raw(b"".join(encode_method(1, make_method(  # the next frame is read, 0.6 ms here)
                commands.Queue.Declare, queue=f"q-{number}", durable=number < DURABLE, nowait=True))
                for number in range(start, start + WRITE)))
        client.send_raw(b"".join(encode_method(1, make_method(
            commands.Queue.Bind, queue="q-0", exchange="x", routing_key=f"k.{number}.#", nowait=True))
            for number in range(SOME)))
        client.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every frame before it is done
        client.expect(commands.Basic.QosOk, timeout=120)
    round_trips = RoundTrips(broker)
    try:
        deleted = request(broker, "DELETE", f"/api/vhosts/{unique}", timeout=120)
    finally:
        times = round_trips.stop()
    assert deleted.status == 204, deleted
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
    broker.restart()
    assert request(broker, "GET", f"/api/vhosts/{unique}").status == 404
    assert not [queue for queue in request(broker, "GET", "/api/queues").body if queue["vhost"] == unique]
    add_vhost(broker, unique)
    try:
        assert request(broker, "GET", f"/api/queues/{unique}").body == []
        assert [exchange["name"] for exchange in request(broker, "GET", f"/api/exchanges/{unique}").body
                if not exchange["name"].startswith("amq.")] == [""]
    finally:
        delete_vhost(broker, unique)


@pytest.mark.alone
@pytest.mark.parametrize("ending", ["auto-delete", "x-expires"])
def test_a_queue_of_a_hundred_thousand_bindings_that_goes_by_itself_holds_no_other_client(broker, unique, ending):
    """An auto-delete queue whose last consumer is cancelled, or one unused for its x-expires, goes at once, as
    RabbitMQ deletes it the moment it decides to (its bindings then leave the exchange's index a slice a loop
    turn: 245 ms in one piece; the exchange, auto-delete, goes with the last of them)."""
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ")
    exchange = f"{unique}-x"
    expires = {"x-expires": 100} if ending == "x-expires" else None
    with bound(broker, unique, exchange, MANY, durable=False, auto_delete=expires is None, arguments=expires,
               consumer="c", exchange_auto_delete=True) as client:
        round_trips = RoundTrips(broker)
        try:
            client.send(1, commands.Basic.Cancel(consumer_tag="c"))
            client.expect(commands.Basic.CancelOk)
            wait_for(lambda: request(broker, "GET", f"/api/queues/%2F/{unique}").status == 404, 10,
                     "the queue gone by itself")
            wait_for(lambda: exchange_gone(broker, exchange), 30, "the exchange gone with the last binding")
        finally:
            times = round_trips.stop()
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_an_auto_delete_queue_declared_again_at_once_is_a_new_one_bound_by_its_own_bindings_alone(broker, unique,
                                                                                                    durable):
    """The consumer of an auto-delete queue of many bindings cancels and declares it again at once (as one that
    reconnects): it gets a new, empty queue, which the old bindings do not reach and which keeps its own binding,
    also across a restart."""
    exchange = f"{unique}-x"
    with bound(broker, unique, exchange, FEW_MORE, durable=durable, auto_delete=True, consumer="c") as client:
        client.send(1, commands.Basic.Cancel(consumer_tag="c"))
        client.expect(commands.Basic.CancelOk)
        client.send(1, commands.Queue.Declare(queue=unique, durable=durable, auto_delete=True))
        declared = client.expect(commands.Queue.DeclareOk)
        assert (declared.message_count, declared.consumer_count) == (0, 0)
        client.publish(1, exchange, "k.2.x", b"lost", mandatory=True)
        assert client.expect(commands.Basic.Return).reply_text == "NO_ROUTE"
        client.expect(header.ContentHeader)
        client.expect(body.ContentBody)
        client.send(1, commands.Queue.Bind(queue=unique, exchange=exchange, routing_key="k.1.#"))
        client.expect(commands.Queue.BindOk)
        client.publish(1, exchange, "k.1.x", b"new")
        client.send(1, commands.Basic.Get(queue=unique, no_ack=True))
        assert client.expect(commands.Basic.GetOk).message_count == 0
        client.expect(header.ContentHeader)
        assert client.expect(body.ContentBody).value == b"new"
    assert [binding["routing_key"] for binding in bindings_of(broker, exchange)] == ["k.1.#"]
    if durable and not broker.external:
        broker.restart()
        assert [binding["routing_key"] for binding in bindings_of(broker, exchange)] == ["k.1.#"]
    with connect(broker) as connection:
        channel = connection.channel()
        channel.queue_delete(unique)
        channel.exchange_delete(exchange)


@pytest.mark.parametrize("count", [FEW_MORE, SOME])
def test_the_frames_after_a_queue_delete_see_the_queue_gone_and_its_reply_counts_its_messages(broker, unique,
                                                                                              count):
    exchange = f"{unique}-x"
    with bound(broker, unique, exchange, count) as client:
        client.publish(1, exchange, "k.1", b"one")
        client.publish(1, exchange, "k.2", b"two")

        def counted() -> int:
            client.send(1, commands.Queue.Declare(queue=unique, passive=True))
            return client.expect(commands.Queue.DeclareOk).message_count

        wait_for(lambda: counted() == 2, 10, "both messages in the queue")  # (RabbitMQ counts them a moment later)
        client.send(1, commands.Queue.Delete(queue=unique), commands.Queue.Declare(queue=unique, passive=True))
        assert client.expect(commands.Queue.DeleteOk, timeout=30).message_count == 2
        client.expect_channel_error(1, 404, f"NOT_FOUND - no queue '{unique}' in vhost '/'", 50, 10)
    assert bindings_of(broker, exchange) == []


def test_an_exchange_of_a_long_name_and_many_bindings_is_deleted(broker, unique):
    """A name of up to 255 bytes, as RabbitMQ takes (the method the deletion runs once the bindings are gone was
    made by pamqp's constructor, which refuses more than 127 characters: the connection closed with 541)."""
    exchange = f"{unique}-".ljust(250, "x")
    with bound(broker, unique, exchange, FEW_MORE) as client:
        client.send_raw(encode_method(1, make_method(commands.Exchange.Delete, exchange=exchange)))
        client.expect(commands.Exchange.DeleteOk, timeout=30)
        client.send(1, commands.Queue.Declare(queue=unique, passive=True))
        client.expect(commands.Queue.DeclareOk)
    assert exchange_gone(broker, exchange)


def test_an_exchange_delete_refused_as_in_use_keeps_every_binding(broker, unique):
    exchange = f"{unique}-x"
    with bound(broker, unique, exchange, SOME) as client:
        client.send(1, commands.Exchange.Delete(exchange=exchange, if_unused=True))
        client.expect_channel_error(1, 406, f"PRECONDITION_FAILED - exchange '{exchange}' in vhost '/' in use", 40,
                                    20)
    assert len(bindings_of(broker, exchange)) == SOME


def test_a_queue_delete_goes_on_when_its_client_leaves_and_nothing_comes_back_after_a_restart(broker, unique):
    if broker.external:
        pytest.skip("restarts the broker")
    exchange = f"{unique}-x"
    client = bound(broker, unique, exchange, SOME)
    client.send(1, commands.Queue.Delete(queue=unique, nowait=True))
    client.close()
    wait_for(lambda: request(broker, "GET", f"/api/queues/%2F/{unique}").status == 404, 30, "the queue deleted")
    assert bindings_of(broker, exchange) == []
    broker.restart()
    assert request(broker, "GET", f"/api/queues/%2F/{unique}").status == 404
    assert bindings_of(broker, exchange) == []
    with connect(broker) as connection:
        connection.channel().exchange_delete(exchange)
