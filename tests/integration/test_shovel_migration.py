"""A live migration from RabbitMQ (the reference 3.10, with its shovel plugin) to Warren through a shovel, under
load and faults: nothing a publisher had confirmed at RabbitMQ is lost, whichever side's shovel moves it.

MIGRATION_MESSAGES (environment; 20,000 by default, 200,000 for the figure in docs/shovels.md) messages are
preloaded in RabbitMQ before the shovel starts, while a publisher goes on publishing there with confirms."""

from __future__ import annotations

import os
import threading
from collections import Counter

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import connect, declare_queue, message_count
from tests.integration.reference import reference_rabbitmq
from tests.waiting import wait_for

REFERENCE_PORT = 17380  # below the ephemeral range, as test_definitions' reference (which uses 17360)
MESSAGES = int(os.environ.get("MIGRATION_MESSAGES", "20000"))
MOVED_WITHIN = 30 + MESSAGES / 1000  # seconds the whole move may take (about 5,000 a second here)
# (preloading with a confirm per publish goes at about 3,000 a second here)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + MESSAGES / 250)]
QUEUE = "legacy"


@pytest.fixture(scope="module")
def rabbitmq():
    with reference_rabbitmq(REFERENCE_PORT, "--shovel") as node:
        management.wait_for_api(node, timeout=60)
        yield node


class Publisher:
    """Publishes persistent messages to a queue with confirms, in a thread, until stopped; what was confirmed."""

    def __init__(self, node, prefix: str):
        self.node, self.prefix = node, prefix
        self.confirmed: list[bytes] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def preload(self, count: int) -> None:
        self._publish(count)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> list[bytes]:
        self.stopping.set()
        self.thread.join(60)
        return self.confirmed

    def _run(self) -> None:
        while not self.stopping.is_set():
            self._publish(100)

    def _publish(self, count: int) -> None:
        with connect(self.node) as conn:
            channel = conn.channel()
            channel.confirm_delivery()
            for _ in range(count):
                body = b"%s-%d" % (self.prefix.encode(), len(self.confirmed))
                channel.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(body)  # (basic_publish returned: confirmed)


def shovel_connection(node, name: str) -> str | None:
    """The name of the connection RabbitMQ lists for a shovel (its client's connection_name), if any yet."""
    for connection in management.request(node, "GET", "/api/connections").body or []:
        if (connection.get("client_properties") or {}).get("connection_name") == f"Shovel {name}":
            return connection["name"]
    return None


def preloaded(rabbitmq, own_broker, prefix: str) -> tuple[Publisher, object]:
    """RabbitMQ's queue, made anew and preloaded with MESSAGES (bodies starting with prefix), a publisher ready to
    go on publishing there, and a Warren with the queue of the same name."""
    with connect(rabbitmq) as conn:
        channel = conn.channel()
        channel.queue_delete(QUEUE)
        declare_queue(channel, QUEUE, durable=True)
    publisher = Publisher(rabbitmq, prefix)
    publisher.preload(MESSAGES)
    warren = own_broker()
    with connect(warren) as conn:
        declare_queue(conn.channel(), QUEUE, durable=True)
    return publisher, warren


def drained(node) -> Counter:
    with connect(node) as conn:
        channel = conn.channel()
        received: Counter = Counter()
        while (message := channel.basic_get(QUEUE, auto_ack=True))[0] is not None:
            received[message[2]] += 1
        return received


def test_warrens_shovel_pulls_a_live_rabbitmq_queue_through_a_kill_and_a_closed_connection(rabbitmq, own_broker):
    """Warren's shovel (on-confirm) pulls the queue into Warren; Warren is killed -9 mid-way and the shovel's
    source connection closed once from RabbitMQ's side: every confirmed message arrives, RabbitMQ's queue ends
    empty."""
    publisher, warren = preloaded(rabbitmq, own_broker, "pull")
    name = "migration"
    assert management.request(warren, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": rabbitmq.url, "src-queue": QUEUE, "dest-uri": "amqp://", "dest-queue": QUEUE,
        "reconnect-delay": 1}}).status == 201
    publisher.start()
    with connect(warren) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, QUEUE), MOVED_WITHIN, "a quarter moved", step=0.01,
                 until=lambda count: count >= MESSAGES // 4)
    warren.kill()
    warren.start()
    with connect(warren) as conn:
        channel = conn.channel()
        wait_for(lambda: message_count(channel, QUEUE), MOVED_WITHIN, "half moved", step=0.01,
                 until=lambda count: count >= MESSAGES // 2)
    closed = wait_for(lambda: shovel_connection(rabbitmq, name), 30, "the shovel's connection listed by RabbitMQ")
    assert management.request(rabbitmq, "DELETE", f"/api/connections/{management.quote(closed)}").status == 204
    # the shovel comes back on a connection of its own and forwards what the publisher goes on publishing (its
    # count starts again from 0, as RabbitMQ's: the close may come when the last run had forwarded everything)
    wait_for(lambda: shovel_connection(rabbitmq, name), 30, "the shovel's new connection listed by RabbitMQ",
             until=lambda connection: connection not in (None, closed))
    status = wait_for(lambda: management.request(warren, "GET", "/api/shovels/%2F").body, 30,
                      "the shovel forwarding again", until=lambda status: status and status[0]["forwarded"] > 0)
    confirmed = publisher.stop()
    check_all_moved(rabbitmq, warren, confirmed)
    status = management.request(warren, "GET", "/api/shovels/%2F").body
    assert [(entry["name"], entry["state"]) for entry in status] == [(name, "running")]


def test_rabbitmqs_shovel_pushes_a_live_queue_into_warren_through_a_kill(rabbitmq, own_broker):
    """RabbitMQ's own shovel pushes the queue into Warren (Warren as its destination); Warren is killed -9
    mid-way: every confirmed message arrives."""
    publisher, warren = preloaded(rabbitmq, own_broker, "push")
    name = "push-to-warren"
    assert management.request(rabbitmq, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": {
        "src-uri": "amqp://", "src-queue": QUEUE, "dest-uri": warren.url, "dest-queue": QUEUE,
        "reconnect-delay": 1}}).status == 201
    try:
        publisher.start()
        with connect(warren) as conn:
            channel = conn.channel()
            wait_for(lambda: message_count(channel, QUEUE), MOVED_WITHIN, "a quarter moved", step=0.01,
                     until=lambda count: count >= MESSAGES // 4)
        warren.kill()
        warren.start()
        confirmed = publisher.stop()
        check_all_moved(rabbitmq, warren, confirmed)
    finally:
        management.request(rabbitmq, "DELETE", f"/api/parameters/shovel/%2F/{name}")


def check_all_moved(rabbitmq, warren, confirmed: list[bytes]) -> None:
    """Once RabbitMQ's queue is empty and Warren's has stopped growing: every confirmed message is in Warren's,
    duplicates (sent again after a failure) at most a few prefetches' worth; RabbitMQ's ends empty."""
    with connect(rabbitmq) as source, connect(warren) as target:
        source_channel, target_channel = source.channel(), target.channel()
        wait_for(lambda: message_count(source_channel, QUEUE), MOVED_WITHIN, "RabbitMQ's queue emptied",
                 until=lambda count: count == 0)
        counts = [-1]

        def settled() -> bool:  # (the same count twice, 0.5 s apart: what was in flight has landed)
            counts.append(message_count(target_channel, QUEUE))
            return counts[-1] == counts[-2] and counts[-1] >= len(confirmed)
        wait_for(settled, MOVED_WITHIN, "Warren's queue holding every confirmed message", step=0.5)
    received = drained(warren)
    missing = [body for body in confirmed if body not in received]
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:5]}"
    duplicates = sum(received.values()) - len(received)
    print(f"{len(confirmed)} confirmed, {sum(received.values())} received, {duplicates} duplicates")
    assert duplicates <= 3 * 1000  # what was in flight at each of the faults: a prefetch (1,000) each
    wait_for(lambda: management.request(rabbitmq, "GET", f"/api/queues/%2F/{QUEUE}").body.get("messages"), 30,
             "RabbitMQ's statistics showing the queue empty", until=lambda count: count == 0)
