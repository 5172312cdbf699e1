"""Queues of one vhost owned by several workers (`--workers`, docs/workers.md#queues-of-one-vhost-over-workers): a
queue whose leader locator is `balanced` may be owned by another worker than the one that serves its vhost's
clients, which sends it its messages and serves its consumers, gets, acks and dead letters over a link. These tests
judge from outside: which node the API names for each queue, what clients receive, what a kill -9 or a restart
leaves."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import Inbox, channel_error, consume, message_count, stay_quiet, wait_until
from tests.integration.management import request
from tests.integration.test_warrenctl import failed, ok
from tests.integration.test_workers import ConfirmedPublisher, after_the_kill, worker_pids
from tests.waiting import wait_for
from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, message_frames

if os.environ.get("WARREN_TEST_URL"):
    pytest.skip("starts brokers of its own", allow_module_level=True)

BALANCED = {"x-queue-leader-locator": "balanced"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def two_workers(own_broker, tmp_path):
    def start(config: str = ""):
        path = tmp_path / "warren.toml"
        path.write_text(config)
        return own_broker("--workers", "2", "--config", str(path))
    return start


def connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url))


def owners(broker) -> dict[str, str]:
    """Each queue of / -> the node the API names as its owner (the worker's number, from warren-N@host)."""
    reply = request(broker, "GET", "/api/queues/%2F")
    assert reply.status == 200, reply
    return {queue["name"]: queue["node"].partition("@")[0].rpartition("-")[2] for queue in reply.body}


def place_elsewhere(broker, channel, queues: dict[str, dict]) -> None:
    """Declare queues (name -> queue_declare's keywords; balanced) after as many of the vhost's worker ("here-N"),
    so that balanced gives each to worker 1."""
    for number in range(len(queues)):
        channel.queue_declare(f"here-{number}")
    for name, keywords in queues.items():
        channel.queue_declare(name, **{**keywords, "arguments": {**BALANCED, **keywords.get("arguments", {})}})
    placed = owners(broker)
    assert {name: placed[name] for name in queues} == dict.fromkeys(queues, "1")


def declare_elsewhere(broker, channel, name: str, messages: int = 0, **arguments) -> None:
    """Declare a queue that worker 1 owns; then, in confirm mode, publish messages numbered from 0 to it."""
    place_elsewhere(broker, channel, {name: {"arguments": arguments}})
    channel.confirm_delivery()
    for number in range(messages):
        channel.basic_publish("", name, b"%d" % number)


async def publish_confirmed(broker, exchange: str, count: int, window: int = 500) -> None:
    """count persistent messages numbered from 0, to exchange, up to window unconfirmed; every one confirmed."""
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    channel = await connection.open_channel()
    tracker = ConfirmTracker(window, record_latency=False)
    await connection.select_confirms(channel, tracker)
    try:
        for index in range(count):
            await tracker.wait_for_room()
            tracker.published += 1
            await connection.send(message_frames(channel, exchange, "", b"%06d" % index, persistent=True))
        await tracker.wait_for_all()
        assert not tracker.nacked
    finally:
        connection.transport.abort()


def fanout_to_six_balanced_queues(broker, conn, count: int) -> tuple[list[str], dict[str, str]]:
    """Six durable queues declared balanced on conn (three on each worker) and bound to a fanout exchange, through
    which count confirmed persistent messages are published: the queues, and the worker that owns each."""
    queues = [f"q{number}" for number in range(6)]
    channel = conn.channel()
    channel.exchange_declare("spread", "fanout", durable=True)
    for name in queues:
        channel.queue_declare(name, durable=True, arguments=BALANCED)
        channel.queue_bind(name, "spread")
    placed = owners(broker)
    assert sorted(placed[name] for name in queues) == ["0", "0", "0", "1", "1", "1"]
    asyncio.run(publish_confirmed(broker, "spread", count))
    return queues, placed


class AckingInbox(Inbox):
    """An inbox that acks each delivery as it comes."""

    def __call__(self, channel, method, properties, body) -> None:
        super().__call__(channel, method, properties, body)
        channel.basic_ack(method.delivery_tag)


def test_balanced_queues_spread_over_the_workers_and_a_fanout_reaches_each_once_and_in_order(two_workers):
    """Six queues declared balanced: three on each worker; 20,000 confirmed persistent messages published to a
    fanout exchange bound to them all are in every queue once, in order, whichever worker owns it."""
    broker = two_workers()
    count = 20_000
    with connect(broker) as conn:
        queues, placed = fanout_to_six_balanced_queues(broker, conn, count)
    with connect(broker) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=500)
        inboxes = {name: AckingInbox() for name in queues}
        for name, inbox in inboxes.items():
            channel.basic_consume(name, inbox)
        wait_until(conn, lambda: all(len(inbox.deliveries) >= count for inbox in inboxes.values()), timeout=60)
        for name, inbox in inboxes.items():
            assert [int(body) for body in inbox.bodies] == list(range(count)), f"{name} (on worker {placed[name]})"
        channel.close()
        assert message_count(conn.channel(), queues[0]) == 0


def test_the_leader_locator_comes_from_the_argument_a_policy_or_the_config(two_workers):
    """RabbitMQ's keys: x-queue-leader-locator, its 3.x name x-queue-master-locator, the queue-leader-locator policy
    key, and [queues] leader_locator; client-local keeps a queue on the worker of its vhost, as do exclusive and
    server-named queues whatever is asked."""
    broker = two_workers('[queues]\nleader_locator = "balanced"\n')
    with connect(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("local-1", arguments={"x-queue-leader-locator": "client-local"})  # 0 queues: here
        channel.queue_declare("by-config")  # 1 here, 0 there
        channel.queue_declare("master-locator", arguments={"x-queue-master-locator": "client-local"})
        channel.queue_declare("exclusive", exclusive=True, arguments=BALANCED)
        server_named = channel.queue_declare("", arguments=BALANCED).method.queue
        reply = request(broker, "PUT", "/api/policies/%2F/local", {
            "pattern": "^pinned", "definition": {"queue-leader-locator": "client-local"}, "apply-to": "queues"})
        assert reply.status in (201, 204), reply
        channel.queue_declare("pinned")
        channel.queue_declare("by-argument", arguments=BALANCED)
        placed = owners(broker)
    assert placed == {"local-1": "0", "by-config": "1", "master-locator": "0", "exclusive": "0", server_named: "0",
                      "pinned": "0", "by-argument": "1"}


def test_a_queue_on_another_worker_serves_gets_settlements_prefetch_and_counts(two_workers):
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        declare_elsewhere(broker, channel, "there", messages=5)  # (balanced: this worker first among equals)
        assert channel.queue_declare("there", passive=True).method.message_count == 5
        method, _, body = channel.basic_get("there", auto_ack=True)
        assert (body, method.message_count) == (b"0", 4)
        method, _, body = channel.basic_get("there")
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, _, body = channel.basic_get("there")
        assert (body, method.redelivered) == (b"1", True)
        channel.basic_reject(method.delivery_tag, requeue=False)  # (no dead-letter exchange: dropped)
        channel.basic_qos(prefetch_count=1)
        tag, inbox = consume(channel, "there")
        wait_until(conn, lambda: len(inbox.deliveries) == 1)
        stay_quiet(conn)
        assert inbox.bodies == [b"2"]  # one at a time: the prefetch holds the rest at the owner
        channel.basic_ack(inbox.deliveries[0].delivery_tag)
        wait_until(conn, lambda: len(inbox.deliveries) == 2)
        assert inbox.bodies == [b"2", b"3"]
        channel.basic_cancel(tag)
        channel.close()  # (3 unacked: back to the queue)
        channel = conn.channel()
        wait_until(conn, lambda: channel.queue_declare("there", passive=True).method.message_count == 2)
        assert channel.queue_purge("there").method.message_count == 2
        assert channel.basic_get("there") == (None, None, None)
        assert channel.queue_delete("there").method.message_count == 0
        code, _ = channel_error(lambda: channel.queue_declare("there", passive=True))
        assert code == 404


def test_dead_letters_of_a_queue_on_another_worker_are_routed_by_the_worker_that_serves_the_vhost(two_workers):
    """The owner of a queue holds no bindings of its vhost: what it dead-letters (expired, rejected, over its
    length limit) goes to the worker that serves the vhost, which routes it to queues on either worker."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        channel.exchange_declare("dlx", "topic")
        channel.queue_declare("dead-here")  # worker 0
        channel.queue_declare("dead-there", arguments=BALANCED)  # worker 1
        channel.queue_bind("dead-here", "dlx", "#")
        channel.queue_bind("dead-there", "dlx", "#")
        channel.queue_declare("other-here")  # worker 0: 2 queues, worker 1: 1
        channel.queue_declare("source", arguments={**BALANCED, "x-message-ttl": 50, "x-dead-letter-exchange": "dlx"})
        assert owners(broker) == {"dead-here": "0", "dead-there": "1", "other-here": "0", "source": "1"}
        channel.basic_publish("", "source", b"expiring")
        wait_until(conn, lambda: message_count(channel, "dead-here") == 1 and message_count(channel, "dead-there") == 1)
        for queue in ("dead-here", "dead-there"):
            _, properties, body = channel.basic_get(queue, auto_ack=True)
            assert body == b"expiring"
            death = properties.headers["x-death"][0]
            assert (death["queue"], death["reason"], death["count"]) == ("source", "expired", 1)


def test_queues_on_another_worker_keep_their_messages_and_counts_across_a_restart(two_workers):
    """And a start with too few workers to read the store of the one that owns a queue is refused, naming it."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        place_elsewhere(broker, channel, {"kept": {"durable": True}})
        channel.confirm_delivery()
        for number in range(100):
            channel.basic_publish("", "kept", b"%d" % number, PERSISTENT)
    broker.restart()
    assert owners(broker)["kept"] == "1"
    with connect(broker) as conn:
        channel = conn.channel()
        wait_until(conn, lambda: channel.queue_declare("kept", passive=True).method.message_count == 100)
        _, inbox = consume(channel, "kept", auto_ack=True)
        inbox.wait_for(conn, 100)
        assert [int(body) for body in inbox.bodies] == list(range(100))
    broker.stop()
    broker.extra_args[1] = "1"  # one process would not read worker 1's store
    with pytest.raises(RuntimeError):
        broker.start()
    assert ("queue 'kept' in vhost '/' lives in the store of worker 1, which this node does not run: start it with "
            "at least 2 workers") in broker.log()


@pytest.mark.alone
def test_a_killed_owner_loses_nothing_confirmed_and_costs_the_other_workers_queues_nothing(two_workers):
    """kill -9 of the worker that owns a queue: its consumers elsewhere are cancelled, every confirmed message is
    there once it is back, and a publisher to a queue of the other worker keeps its confirms."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("survivor", durable=True)  # worker 0, which serves the vhost
        channel.queue_declare("victim", durable=True, arguments=BALANCED)
        assert owners(broker) == {"survivor": "0", "victim": "1"}
    stop = threading.Event()
    survivor = ConfirmedPublisher(broker, "/", "survivor", stop)
    victim = ConfirmedPublisher(broker, "/", "victim", stop, BALANCED)
    survivor.start()
    victim.start()
    wait_for(lambda: len(victim.confirmed) > 5000, timeout=60, what="5,000 confirmed in the victim's queue")
    with connect(broker) as conn:
        channel = conn.channel()
        cancelled = threading.Event()
        channel.add_on_cancel_callback(lambda _: cancelled.set())
        channel.basic_qos(prefetch_count=10)
        consume(channel, "victim")
        killed = worker_pids(broker)[1]
        before = len(survivor.latencies)
        os.kill(killed, signal.SIGKILL)
        wait_until(conn, cancelled.is_set, what="the consumer of the killed worker's queue cancelled")
    after_the_kill(broker, killed, survivor, victim, stop, before, p99_limit=0.100)


def test_a_transient_queue_goes_with_the_worker_that_owned_it_and_a_durable_one_stays(two_workers):
    """As RabbitMQ removes the transient queues of a node that goes down: kill -9 of their owner ends them."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        place_elsewhere(broker, channel, {"transient": {}, "durable": {"durable": True}})
        killed = worker_pids(broker)[1]
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: worker_pids(broker)[1] != killed, what="worker 1 started again")
        wait_until(conn, lambda: "transient" not in owners(broker), what="the transient queue gone")
        code, text = channel_error(lambda: channel.queue_declare("transient", passive=True))
        assert (code, text) == (404, "NOT_FOUND - no queue 'transient' in vhost '/'")
        channel = conn.channel()
        assert channel.queue_declare("durable", passive=True, arguments=BALANCED).method.queue == "durable"


class Nacks(ConfirmTracker):
    """Which publishes the broker nacked, by their tags."""

    def __init__(self) -> None:
        super().__init__(window=100, record_latency=False)
        self.nacked_tags: set[int] = set()

    def on_confirm(self, delivery_tag: int, multiple: bool, acked: bool) -> None:
        if not acked:
            self.nacked_tags.add(delivery_tag)
        super().on_confirm(delivery_tag, multiple, acked)


async def publish_in_one_write(broker, queue: str, count: int) -> Nacks:
    connection = await BenchConnection.open(BrokerURL.parse(broker.url))
    try:
        channel = await connection.open_channel()
        tracker = Nacks()
        await connection.select_confirms(channel, tracker)
        tracker.published = count
        await connection.send(b"".join(message_frames(channel, "", queue, b"%d" % number, persistent=True)
                                       for number in range(count)))
        await tracker.wait_for_all()
        return tracker
    finally:
        connection.transport.abort()


def test_a_queue_elsewhere_that_refuses_a_message_nacks_it(two_workers):
    """reject-publish at the owner: a message it refused is nacked, and one published in another read of the
    connection than a refused one is acked. Within one read, the refusal of one nacks every publish of that read to
    that worker (so the publisher sends them again: at least once), and none it nacked is lost."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        place_elsewhere(broker, channel, {"full": {"durable": True, "arguments": {"x-max-length": 2,
                                                                                 "x-overflow": "reject-publish"}}})
        channel.confirm_delivery()
        channel.basic_publish("", "full", b"0", PERSISTENT)
        channel.basic_publish("", "full", b"1", PERSISTENT)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "full", b"2", PERSISTENT)
        channel.queue_purge("full")
    tracker = asyncio.run(publish_in_one_write(broker, "full", 5))
    assert {3, 4, 5} <= tracker.nacked_tags
    with connect(broker) as conn:
        kept = [body for _, _, body in iter(lambda: conn.channel().basic_get("full", auto_ack=True),
                                            (None, None, None))]
    acked = {b"%d" % (tag - 1) for tag in range(1, 6) if tag not in tracker.nacked_tags}
    assert acked <= set(kept) and kept == [b"0", b"1"]


def test_policies_apply_at_the_owner_and_change_with_the_vhosts_policies(two_workers):
    """The owner holds none of the vhost's policies: those that apply to its queues are sent to it, at the declare
    and at every change."""
    broker = two_workers()
    reply = request(broker, "PUT", "/api/policies/%2F/short", {
        "pattern": "^short$", "definition": {"max-length": 2}, "apply-to": "queues"})
    assert reply.status in (201, 204), reply
    with connect(broker) as conn:
        channel = conn.channel()
        declare_elsewhere(broker, channel, "short", messages=5)
        assert channel.queue_declare("short", passive=True).method.message_count == 2  # (drop-head: 3 and 4)
        reply = request(broker, "PUT", "/api/policies/%2F/short", {
            "pattern": "^short$", "definition": {"max-length": 1}, "apply-to": "queues"})
        assert reply.status in (201, 204), reply
        wait_until(conn, lambda: channel.queue_declare("short", passive=True).method.message_count == 1,
                   what="the lower limit applied at the owner")
        assert channel.basic_get("short", auto_ack=True)[2] == b"4"


def test_counts_in_replies_are_the_owners_at_the_time_it_answers(two_workers):
    """declare-ok, purge-ok and delete-ok of a queue elsewhere wait for its owner's count, as RabbitMQ's queue
    process answers them: right after a requeue or an ack, they count it."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        declare_elsewhere(broker, channel, "counted", messages=3)
        method, _, _ = channel.basic_get("counted")
        assert channel.queue_declare("counted", passive=True).method.message_count == 2
        channel.basic_nack(method.delivery_tag, requeue=True)
        assert channel.queue_declare("counted", passive=True).method.message_count == 3
        assert channel.queue_purge("counted").method.message_count == 3
        channel.basic_publish("", "counted", b"again")
        assert channel.queue_delete("counted").method.message_count == 1


def test_a_rejected_message_is_dead_lettered_before_the_channels_next_method(two_workers):
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("dead")
        channel.queue_declare("source", arguments={**BALANCED, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": "dead"})
        assert owners(broker) == {"dead": "0", "source": "1"}
        channel.confirm_delivery()
        channel.basic_publish("", "source", b"rejected")
        method, _, _ = channel.basic_get("source")
        channel.basic_reject(method.delivery_tag, requeue=False)
        _, properties, body = channel.basic_get("dead", auto_ack=True)
        assert (body, properties.headers["x-death"][0]["reason"]) == (b"rejected", "rejected")


def test_an_unused_queue_elsewhere_expires_and_a_redeclare_keeps_it(two_workers):
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        place_elsewhere(broker, channel, {"kept-alive": {"arguments": {"x-expires": 300}},
                                          "expiring": {"arguments": {"x-expires": 300}}})

        def renewed_until_the_other_expired() -> bool:
            channel.queue_declare("kept-alive", passive=True)  # (renews its lease at the owner)
            return "expiring" not in owners(broker)

        wait_until(conn, renewed_until_the_other_expired, what="the unused queue expired")
        assert "kept-alive" in owners(broker)


def test_a_vhost_whose_queues_other_workers_own_is_not_moved_until_they_are_moved_to_its_worker(two_workers):
    broker = two_workers()
    with connect(broker) as conn:
        place_elsewhere(broker, conn.channel(), {"elsewhere": {"durable": True}})
    reply = request(broker, "PUT", "/api/vhosts/%2F/group", {"group": 1})
    assert reply.status == 400
    assert "vhost '/' has queues other workers own ('elsewhere')" in reply.body["reason"]
    assert request(broker, "PUT", "/api/queues/%2F/elsewhere/group", {"group": 0}).status == 204  # moved home first
    assert request(broker, "PUT", "/api/vhosts/%2F/group", {"group": 1}).status == 204
    assert set(owners(broker).values()) == {"1"}


def test_a_queue_moves_to_another_worker_and_back_with_its_messages_bindings_and_policy(two_workers):
    """PUT /api/queues/{vhost}/{name}/group (warrenctl move_queue) moves a durable queue to another worker: the
    workers that hold it stop and start again, and it comes back on the worker named with what a restart keeps, its
    bindings and its policy; what cannot move is refused, naming why."""
    broker = two_workers()
    with connect(broker) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.exchange_declare("orders", "direct", durable=True)
        channel.queue_declare("moving", durable=True)
        channel.queue_bind("moving", "orders", "new")
        for number in range(3):
            channel.basic_publish("orders", "new", b"order %d" % number, PERSISTENT)
        delivered, _, _ = channel.basic_get("moving")  # order 0, given back: it moves redelivered
        channel.basic_nack(delivered.delivery_tag, requeue=True)
        channel.queue_declare("transient")
        channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
        holder = connect(broker)
        holder.channel().queue_declare("mine", durable=True, exclusive=True)
    assert request(broker, "PUT", "/api/policies/%2F/short", {"pattern": "^moving$", "definition": {"max-length": 10},
                                                              "apply-to": "queues"}).status == 201
    assert owners(broker)["moving"] == "0"

    def refused(name: str, group) -> str:
        reply = request(broker, "PUT", f"/api/queues/%2F/{name}/group", {"group": group})
        assert reply.status == 400, reply
        return reply.body["reason"]

    assert refused("moving", 2) == "there is no group 2: this node runs 2 workers, groups 0 to 1"
    assert refused("moving", "1") == "group must be a number, got '1'"
    assert refused("transient", 1) == ("queue 'transient' in vhost '/' is not durable: moving a queue restarts the "
                                       "workers that hold it, which a transient queue does not outlive")
    assert refused("log", 1) == "queue 'log' in vhost '/' is a stream: a stream stays on the worker of its vhost"
    assert refused("mine", 1) == ("queue 'mine' in vhost '/' is exclusive: it stays on the worker that serves its "
                                  "connection")
    assert request(broker, "PUT", "/api/queues/%2F/nope/group", {"group": 1}).status == 404
    assert failed(broker, "move_queue", "nope", "1") == (69, "Error: Queue 'nope' does not exist in vhost '/'")
    holder.close()

    assert ok(broker, "move_queue", "moving", "1") == "Moving queue 'moving' in vhost '/' to group 1 ...\n"
    assert owners(broker)["moving"] == "1"
    assert request(broker, "GET", "/api/queues/%2F/moving").body["policy"] == "short"
    with connect(broker) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "new", b"after the move", PERSISTENT)  # routed by the binding it kept
        gets = [channel.basic_get("moving", auto_ack=True) for _ in range(5)]
        assert [(body, method.redelivered) for method, _, body in gets[:4]] == [
            (b"order 0", True), (b"order 1", False), (b"order 2", False), (b"after the move", False)]
        assert gets[4][0] is None
        for number in range(12):  # its policy applies where it is now
            channel.basic_publish("orders", "new", b"back %d" % number, PERSISTENT)
        assert channel.queue_declare("moving", passive=True).method.message_count == 10

    assert request(broker, "PUT", "/api/queues/%2F/moving/group", {"group": 0}).status == 204  # and back
    assert owners(broker)["moving"] == "0"
    broker.restart()
    assert not (broker.data_dir / "workers" / "moving.json").exists()
    assert owners(broker)["moving"] == "0"
    with connect(broker) as conn:
        channel = conn.channel()
        bodies = [channel.basic_get("moving", auto_ack=True)[2] for _ in range(11)]
        assert bodies == [b"back %d" % number for number in range(2, 12)] + [None]
