"""One vhost served by every worker (`--workers` with `[server] spread_vhosts`,
docs/workers.md#one-vhost-on-every-worker): each worker keeps a copy of the vhost's definitions and serves the
clients the kernel gives it; a change a client makes anywhere is made by the vhost's worker and copied to every
other before its reply. These tests judge from outside: which worker the API names for each connection and queue,
what clients on either worker receive, what a kill -9 leaves."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Callable, TypeVar

import pika
import pika.exceptions
import pytest

from pamqp import commands, frame

from protocol.codec import encode_method, make_method
from tests.integration.helpers import Inbox, channel_error
from tests.integration.management import request
from tests.integration.rawclient import RawClient
from tests.integration.test_queues_across_workers import AckingInbox, fanout_to_six_balanced_queues, owners
from tests.integration.test_workers import worker_pids
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest
from tests.waiting import wait_for

if os.environ.get("WARREN_TEST_URL"):
    pytest.skip("starts brokers of its own", allow_module_level=True)

names = itertools.count()
Client = TypeVar("Client", pika.BlockingConnection, RawClient)
BINDINGS = 20_000  # of a queue a copy's client deletes (each bind copied to the other worker: 2 s a 10,000)
CLOSING_EXCLUSIVE = 2000  # exclusive queues, each with a binding, of a copy's connection that the server closes
REQUEUED = 10_000  # deliveries a consumer holds when its channel or connection closes (a requeue of several slices)


@pytest.fixture
def spread(own_broker, tmp_path):
    def start(config: str = ""):
        path = tmp_path / "warren.toml"
        path.write_text("[server]\nspread_vhosts = true\n" + config)
        return own_broker("--workers", "2", "--config", str(path))
    return start


def worker_of(broker, name: str) -> str | None:
    """The worker the API names for the connection of that client-provided name (None while it lists none)."""
    reply = request(broker, "GET", "/api/connections")
    assert reply.status == 200, reply
    found = [item["node"] for item in reply.body if item["client_properties"].get("connection_name") == name]
    return found[0].partition("@")[0].rpartition("-")[2] if found else None


def connect_on(broker, worker: str, user: str = "guest", vhost: str = "/") -> pika.BlockingConnection:
    """A connection to vhost served by that worker (landed_on)."""
    def opened(name: str) -> pika.BlockingConnection:
        parameters = pika.URLParameters(broker.url.replace("guest:guest", f"{user}:{user}") if user != "guest"
                                        else broker.url)
        parameters.virtual_host = vhost
        parameters.client_properties = {"connection_name": name}
        return pika.BlockingConnection(parameters)

    return landed_on(broker, worker, opened)


def landed_on(broker, worker: str, opened: Callable[[str], Client]) -> Client:
    """The first client opened (given the connection name it is to send) that the API lists on that worker, the
    others closed: every worker listens on the port, and the kernel picks one, so clients connect until one lands
    there (for a few seconds: a worker serves a vhost made since it started once its copy of it comes, within a
    second)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        name = f"client-{next(names)}"
        client = opened(name)
        if wait_for(lambda: worker_of(broker, name), what="the connection listed") == worker:
            return client
        client.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def wait_on_all(conns, condition, timeout: float = 10.0) -> None:
    """Until condition(), every connection handling what it received (deliveries to its consumers)."""
    def pumped() -> bool:
        for conn in conns:
            conn.process_data_events(time_limit=0.01)
        return bool(condition())
    wait_for(pumped, timeout, step=0)


def test_both_workers_serve_the_vhost_and_a_binding_made_on_one_routes_a_publish_on_the_other_at_once(spread):
    """Fifty times each way: an exchange, a queue and a binding made by a client of one worker, then at once a
    mandatory publish by a client of the other, which the binding routes (no return) to the queue."""
    broker = spread()
    ends = {worker: connect_on(broker, worker) for worker in ("0", "1")}
    channels = {worker: conn.channel() for worker, conn in ends.items()}
    for channel in channels.values():
        channel.confirm_delivery()
    for number in range(50):
        for maker, publisher in (("0", "1"), ("1", "0")):
            name = f"x{number}-{maker}"
            channels[maker].exchange_declare(name, "direct")
            channels[maker].queue_declare(name)
            channels[maker].queue_bind(name, name, "key")
            channels[publisher].basic_publish(name, "key", b"m", mandatory=True)  # (unroutable raises)
    for maker in ("0", "1"):
        placed = owners(broker)
        assert {placed[f"x{number}-{maker}"] for number in range(50)} == {maker}  # client-local: where declared
        for number in range(50):
            assert channels["0"].queue_declare(f"x{number}-{maker}", passive=True).method.message_count == 1
    for conn in ends.values():
        conn.close()


def test_consumers_on_either_worker_get_the_messages_of_queues_of_either(spread):
    """A queue of each worker, a consumer of each on the other worker, publishers on both: each consumer gets
    every message of its queue once and in order."""
    broker = spread()
    ends = {worker: connect_on(broker, worker) for worker in ("0", "1")}
    for worker, conn in ends.items():
        conn.channel().queue_declare(f"of-{worker}", durable=True)
    assert owners(broker) == {"of-0": "0", "of-1": "1"}
    inboxes = {}
    for worker, conn in ends.items():
        other = "1" if worker == "0" else "0"
        channel = conn.channel()
        channel.basic_qos(prefetch_count=50)
        inboxes[other] = AckingInbox()
        channel.basic_consume(f"of-{other}", inboxes[other])
    for worker, conn in ends.items():
        channel = conn.channel()
        channel.confirm_delivery()
        for number in range(500):
            for queue in ("of-0", "of-1"):
                channel.basic_publish("", queue, f"{worker}-{number}".encode())
    wait_on_all(ends.values(), lambda: all(len(inbox.bodies) == 1000 for inbox in inboxes.values()))
    for inbox in inboxes.values():
        for worker in ("0", "1"):
            assert [body for body in inbox.bodies if body.startswith(f"{worker}-".encode())] == [
                f"{worker}-{number}".encode() for number in range(500)]


def test_an_exclusive_queue_stays_with_its_connection_locked_to_the_others_and_goes_with_it(spread):
    broker = spread()
    here, there = connect_on(broker, "1"), connect_on(broker, "0")
    holder = here.channel()
    exclusive = holder.queue_declare("", exclusive=True).method.queue
    holder.queue_declare("mine", exclusive=True)
    holder.queue_bind(exclusive, "amq.fanout")  # (its own connection may bind it, through worker 0)
    assert owners(broker)[exclusive] == owners(broker)["mine"] == "1"
    for name in (exclusive, "mine"):
        code, text = channel_error(lambda: there.channel().queue_declare(name, passive=True))
        assert code == 405 and text == (
            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. It could be "
            "originally declared on another connection or the exclusive property value does not match that of the "
            "original declaration.")
    publisher = there.channel()
    publisher.confirm_delivery()
    publisher.basic_publish("amq.fanout", "", b"to the exclusive one")
    assert holder.basic_get(exclusive, auto_ack=True)[2] == b"to the exclusive one"
    here.close()  # (its close-ok comes once the queues are gone on every worker)
    checker = there.channel()
    checker.queue_declare("mine", exclusive=True)  # free again at once, on the other worker
    placed = owners(broker)
    assert exclusive not in placed and placed["mine"] == "0"
    there.close()


def test_a_server_close_comes_once_a_copys_exclusive_queues_are_gone_on_every_worker(spread):
    """A connection error closes a connection of worker 1 (which keeps a copy of "/") holding exclusive queues, each
    bound to a topic exchange, as RabbitMQ sends its close once they are deleted: a connection of worker 0, the
    vhost's home, declares all of them as its own right after."""
    broker = spread()
    client, other = raw_client_on(broker, "1"), raw_client_on(broker, "0")
    names = [f"closing-{number}" for number in range(CLOSING_EXCLUSIVE)]
    # (each declare and bind answered, unlike test_connection_close.many_exclusive_queues' nowait ones: made so, the
    # old code failed this test 2 runs of 2; with that helper, 1 of 2)
    client.send(1, commands.Exchange.Declare(exchange="closing", exchange_type="topic"))
    client.expect(commands.Exchange.DeclareOk, channel=1)
    client.send_raw(b"".join(
        frame.marshal(commands.Queue.Declare(queue=name, exclusive=True), 1)
        + frame.marshal(commands.Queue.Bind(queue=name, exchange="closing", routing_key=f"{name}.#"), 1)
        for name in names))
    for _ in names:
        client.expect(commands.Queue.DeclareOk, channel=1)
        client.expect(commands.Queue.BindOk, channel=1)
    client.send(0, commands.Basic.Qos(prefetch_count=1))  # a channel method on channel 0 is a connection error
    assert client.expect_connection_close().reply_code == 504  # (answered with close-ok)
    other.send_raw(b"".join(frame.marshal(commands.Queue.Declare(queue=name, exclusive=True), 1) for name in names))
    for name in names:
        assert other.expect(commands.Queue.DeclareOk, channel=1).queue == name
    client.close()
    other.close()


@pytest.mark.parametrize("closing", ["channel", "connection"])
def test_a_close_ok_comes_once_the_deliveries_are_back_in_a_queue_the_other_worker_owns(spread, closing):
    """A consumer on worker 1 holds every message of a queue worker 0 owns, unacked; as RabbitMQ's close-ok follows
    its queues' requeue, a client of worker 0 that asks right after its close-ok counts them all back."""
    broker = spread()
    observer = connect_on(broker, "0").channel()
    observer.queue_declare("held")
    assert owners(broker)["held"] == "0"
    observer.confirm_delivery()
    for number in range(REQUEUED):
        observer.basic_publish("", "held", str(number).encode())
    consumer = raw_client_on(broker, "1")
    consumer.send(1, commands.Basic.Consume(queue="held", consumer_tag="holding"))
    consumer.expect(commands.Basic.ConsumeOk, channel=1)
    for _ in range(REQUEUED):
        consumer.expect(commands.Basic.Deliver, channel=1)
        consumer.read_frame()  # (its content header)
        consumer.read_frame()  # (its body)
    assert observer.queue_declare("held", passive=True).method.message_count == 0
    if closing == "channel":
        consumer.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        consumer.expect(commands.Channel.CloseOk, channel=1)
    else:
        consumer.close_connection()
    declared = observer.queue_declare("held", passive=True).method
    assert (declared.message_count, declared.consumer_count) == (REQUEUED, 0)
    consumer.close()


def test_a_change_refused_at_the_vhosts_worker_closes_the_channel_with_rabbitmqs_error(spread):
    broker = spread()
    assert request(broker, "PUT", "/api/users/limited", {"password": "limited", "tags": ""}).status == 201
    assert request(broker, "PUT", "/api/permissions/%2F/limited",
                   {"configure": "^own-.*", "write": ".*", "read": ".*"}).status == 201
    conn = connect_on(broker, "1")
    conn.channel().exchange_declare("kind", "direct")
    code, text = channel_error(lambda: conn.channel().exchange_declare("kind", "fanout"))
    assert (code, text) == (406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'kind' in vhost '/': "
                                 "received 'fanout' but current is 'direct'")
    channel = conn.channel()
    channel.queue_declare("used")
    channel.basic_consume("used", Inbox())
    code, text = channel_error(lambda: conn.channel().queue_delete("used", if_unused=True))
    assert (code, text) == (406, "PRECONDITION_FAILED - queue 'used' in vhost '/' in use")
    limited = connect_on(broker, "1", user="limited")
    code, text = channel_error(lambda: limited.channel().queue_declare("theirs"))
    assert (code, text) == (403, "ACCESS_REFUSED - access to queue 'theirs' in vhost '/' refused for user 'limited'")
    limited.channel().queue_declare("own-queue")
    assert "theirs" not in owners(broker) and owners(broker)["own-queue"] == "1"
    limited.close()
    conn.close()


def test_six_balanced_queues_get_a_fanout_once_and_in_order_with_consumers_on_either_worker(spread):
    """The issue's scenario with the vhost spread: six queues declared balanced (three on each worker), 20,000
    confirmed persistent messages published through a fanout, consumers of three queues on each worker."""
    broker = spread()
    count = 20_000
    with connect_on(broker, "1") as conn:
        queues, placed = fanout_to_six_balanced_queues(broker, conn, count)
    ends = {worker: connect_on(broker, worker) for worker in ("0", "1")}
    inboxes = {name: AckingInbox() for name in queues}
    for number, name in enumerate(queues):
        channel = ends[str(number % 2)].channel()
        channel.basic_qos(prefetch_count=500)
        channel.basic_consume(name, inboxes[name])
    wait_on_all(ends.values(), lambda: all(len(inbox.bodies) >= count for inbox in inboxes.values()), timeout=60)
    for name, inbox in inboxes.items():
        assert [int(body) for body in inbox.bodies] == list(range(count)), f"{name} (on worker {placed[name]})"
    for conn in ends.values():
        conn.close()


def test_a_worker_killed_and_started_again_copies_the_vhost_before_it_serves_its_clients(spread):
    """kill -9 of the worker that keeps a copy: what it owned durably comes back; once it serves again, a client of
    it routes by the bindings made while it was down."""
    broker = spread()
    with connect_on(broker, "1") as conn:
        channel = conn.channel()
        channel.queue_declare("kept", durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", "kept", b"before", pika.BasicProperties(delivery_mode=2))
    killed = worker_pids(broker)[1]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: worker_pids(broker)[1] != killed, what="worker 1 started again")
    with connect_on(broker, "0") as conn:
        channel = conn.channel()
        channel.exchange_declare("later", "topic")
        channel.queue_declare("later-queue")
        channel.queue_bind("later-queue", "later", "#")
    with connect_on(broker, "1") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("later", "any", b"routed", mandatory=True)
        assert channel.basic_get("later-queue", auto_ack=True)[2] == b"routed"
        assert channel.basic_get("kept", auto_ack=True)[2] == b"before"


def test_the_api_shows_each_queue_as_its_owner_counts_it_with_the_consumers_of_every_worker(spread):
    """A queue of worker 1 with three messages and a consumer on each worker: its API entry and the listing count
    what its owner holds at once, and name both consumers; the connections of both workers are listed."""
    broker = spread()
    ends = {worker: connect_on(broker, worker) for worker in ("0", "1")}
    owner = ends["1"].channel()
    owner.queue_declare("counted")
    owner.confirm_delivery()
    for _ in range(3):
        owner.basic_publish("", "counted", b"m")
    assert owners(broker)["counted"] == "1"
    for worker, conn in ends.items():
        channel = conn.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("counted", Inbox(), consumer_tag=f"on-{worker}")
    shown = wait_for(lambda: request(broker, "GET", "/api/queues/%2F/counted").body,
                     what="both consumers shown, each with its delivery",
                     until=lambda body: body["consumers"] == 2 and body["messages_unacknowledged"] == 2)
    assert sorted(consumer["consumer_tag"] for consumer in shown["consumer_details"]) == ["on-0", "on-1"]
    assert shown["messages"] == 3
    [listed] = [queue for queue in request(broker, "GET", "/api/queues/%2F").body if queue["name"] == "counted"]
    assert (listed["messages"], listed["consumers"]) == (3, 2)
    nodes = {item["node"] for item in request(broker, "GET", "/api/vhosts/%2F/connections").body}
    assert {node.partition("@")[0].rpartition("-")[2] for node in nodes} == {"0", "1"}
    for conn in ends.values():
        conn.close()


def test_an_exclusive_queue_outlives_a_restart_of_the_vhosts_worker_still_locked_to_its_connection(spread):
    """kill -9 of the vhost's worker (its home), which kept the exclusive queue of a client of the other worker as a
    stand-in: once it serves again, the queue is there again for everyone, locked to its connection, which uses it."""
    broker = spread()
    holder = connect_on(broker, "1")
    channel = holder.channel()
    channel.queue_declare("held", exclusive=True)
    killed = worker_pids(broker)[0]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: worker_pids(broker)[0] != killed, what="worker 0 started again")
    other = connect_on(broker, "0")
    wait_for(lambda: channel_error(lambda: other.channel().queue_declare("held", exclusive=True))[0] == 405,
             what="the queue locked on worker 0 again")
    channel.queue_bind("held", "amq.fanout")  # (through worker 0, for its connection)
    publisher = other.channel()
    publisher.confirm_delivery()
    publisher.basic_publish("amq.fanout", "", b"after the restart")
    assert channel.basic_get("held", auto_ack=True)[2] == b"after the restart"
    holder.close()
    other.close()


def test_a_vhost_made_after_the_start_is_served_by_every_worker(spread):
    broker = spread()
    assert request(broker, "PUT", "/api/vhosts/later").status == 201  # (its maker, guest, may use it)
    ends = {worker: connect_on(broker, worker, vhost="later") for worker in ("0", "1")}
    ends["1"].channel().queue_declare("made-on-1")
    assert ends["0"].channel().queue_declare("made-on-1", passive=True).method.queue == "made-on-1"
    for conn in ends.values():
        conn.close()


def test_an_exclusive_consumer_is_exclusive_among_the_consumers_of_every_worker(spread):
    """An exclusive consumer on worker 1: a consumer of the queue on worker 0, which had not heard of it, is refused
    with RabbitMQ's 403 by the queue's owner, and the exclusive one keeps every message; a consumer on worker 0
    first makes an exclusive one on worker 1 refused the same way."""
    broker = spread()
    holder, other = connect_on(broker, "1"), connect_on(broker, "0")
    channel = holder.channel()
    channel.queue_declare("sole")
    inbox = Inbox()
    channel.basic_consume("sole", inbox, exclusive=True, auto_ack=True)
    late = other.channel()
    assert channel_error(lambda: late.basic_consume("sole", Inbox(), auto_ack=True)) == (
        403, "ACCESS_REFUSED - queue 'sole' in vhost '/' in exclusive use")
    publisher = other.channel()
    publisher.confirm_delivery()
    for number in range(10):
        publisher.basic_publish("", "sole", b"%d" % number)
    wait_on_all([holder], lambda: len(inbox.bodies) == 10)

    channel.queue_declare("shared")
    first = other.channel()
    first.basic_consume("shared", Inbox(), auto_ack=True)
    assert channel_error(lambda: holder.channel().basic_consume("shared", Inbox(), exclusive=True)) == (
        403, "ACCESS_REFUSED - queue 'shared' in vhost '/' in exclusive use")
    holder.close()
    other.close()


def test_a_message_waiting_in_a_delayed_exchange_of_a_worker_killed_meanwhile_is_routed_after_its_restart(spread):
    """Published through worker 1, a persistent delayed message waits there (in its store); kill -9 of worker 1:
    once started again, worker 1 routes it when due, by the bindings of the vhost's worker."""
    broker = spread()
    with connect_on(broker, "1") as conn:
        channel = conn.channel()
        channel.exchange_declare("later", "x-delayed-message", durable=True,
                                 arguments={"x-delayed-type": "direct"})
        channel.queue_declare("due", durable=True)
        channel.queue_bind("due", "later", "k")
        channel.confirm_delivery()
        channel.basic_publish("later", "k", b"waited",
                              pika.BasicProperties(delivery_mode=2, headers={"x-delay": 4000}))
    killed = worker_pids(broker)[1]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: worker_pids(broker)[1] != killed, what="worker 1 started again")
    with connect_on(broker, "0") as conn:
        channel = conn.channel()
        wait_for(lambda: channel.queue_declare("due", passive=True).method.message_count == 1,
                 what="the delayed message routed")
        assert channel.basic_get("due", auto_ack=True)[2] == b"waited"


def test_a_federated_queue_another_worker_owns_fetches_for_the_consumers_there(spread):
    """The link runs at the vhost's worker (0), the federated queue and its consumer are on worker 1: the owner's
    counts tell the link that a consumer waits there."""
    broker = spread()
    with connect_on(broker, "1") as conn:
        channel = conn.channel()
        channel.queue_declare("upstream")
        channel.queue_declare("federated")  # client-local: worker 1's
        assert owners(broker)["federated"] == "1"
        assert request(broker, "PUT", "/api/parameters/federation-upstream/%2F/self",
                       {"value": {"uri": broker.url, "queue": "upstream"}}).status == 201
        assert request(broker, "PUT", "/api/policies/%2F/federated", {
            "pattern": "^federated$", "definition": {"federation-upstream": "self"},
            "apply-to": "queues"}).status == 201
        wait_for(lambda: [link["status"] for link in request(broker, "GET", "/api/federation-links/%2F").body],
                 30, "the link running", until=lambda statuses: statuses == ["running"])
        inbox = Inbox()
        channel.basic_consume("federated", inbox, auto_ack=True)
        channel.basic_publish("", "upstream", b"fetched")
        wait_on_all([conn], lambda: inbox.bodies == [b"fetched"])


def test_the_api_counts_the_messages_a_delayed_exchange_holds_in_every_worker(spread):
    broker = spread()
    for worker in ("0", "1"):
        with connect_on(broker, worker) as conn:
            channel = conn.channel()
            channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
            channel.confirm_delivery()
            channel.basic_publish("later", "k", b"waiting", pika.BasicProperties(headers={"x-delay": 60_000}))
    assert request(broker, "GET", "/api/exchanges/%2F/later").body["messages_delayed"] == 2
    for path in ("/api/exchanges/%2F", "/api/exchanges"):
        [later] = [item for item in request(broker, "GET", path).body if item["name"] == "later"]
        assert later["messages_delayed"] == 2, path


def raw_client_on(broker, worker: str) -> RawClient:
    """A raw client, its connection open to "/" with channel 1, that landed on that worker (landed_on)."""
    def opened(name: str) -> RawClient:
        client = RawClient.connect(broker, timeout=60)
        client.handshake(client_properties={"connection_name": name})
        return client

    client = landed_on(broker, worker, opened)
    client.open_channel(1)
    return client


@pytest.mark.alone
def test_a_delete_a_copy_forwards_removes_the_many_bindings_first_holding_no_client_of_the_home(spread):
    """A queue.delete sent on worker 1, which keeps a copy of "/", runs at worker 0, the vhost's home: the queue's
    20,000 bindings go a slice a loop turn before it, as for the home's own clients (in one piece, 163 ms)."""
    broker = spread()
    with raw_client_on(broker, "0") as maker:
        maker.send(1, commands.Exchange.Declare(exchange="x", exchange_type="topic"))
        maker.expect(commands.Exchange.DeclareOk)
        maker.send(1, commands.Queue.Declare(queue="q"))
        maker.expect(commands.Queue.DeclareOk)
        for start in range(0, BINDINGS, 10_000):
            maker.send_raw(b"".join(encode_method(1, make_method(
                commands.Queue.Bind, queue="q", exchange="x", routing_key=f"k.{number}.#", nowait=True))
                for number in range(start, start + 10_000)))
        maker.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every bind before it is made
        maker.expect(commands.Basic.QosOk, timeout=60)
    deleter = connect_on(broker, "1")
    round_trips = RoundTrips(client=raw_client_on(broker, "0"))
    try:
        assert deleter.channel().queue_delete("q").method.message_count == 0
    finally:
        times = round_trips.stop()
        deleter.close()
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
    assert request(broker, "GET", "/api/queues/%2F/q").status == 404
    assert request(broker, "GET", "/api/exchanges/%2F/x/bindings/source").body == []
