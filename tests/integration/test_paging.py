"""Backlogs bigger than memory: past queue_messages_in_memory ready messages a queue pages the later ones to disk
(DATA_DIR/pages) and reads them back ahead of consumers. What a client sees does not change: order, redelivered
flags, TTLs, dead-lettering, length limits, purges and restarts behave as for a queue kept in memory; the management
API counts the paged messages as RabbitMQ's does (messages_paged_out, message_bytes_paged_out)."""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration import management
from tests.integration.helpers import (
    connect, consume, declare_queue, drain_with_flags, get, get_all, message_count, wait_for_message_count,
)
from tests.waiting import wait_for

IN_MEMORY = 20  # the broker's queue_messages_in_memory in these tests
COUNT = 300  # messages published: most of them paged
BODY_SIZE = 4096  # big enough that the paged ones fill several pages, which go to disk
TTL_MS = 100


def body(number: int) -> bytes:
    return f"{number:05d}".encode().ljust(BODY_SIZE, b".")


def number_of(data: bytes) -> int:
    return int(data[:5])


@pytest.fixture
def paging_broker(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text(f"[server]\nqueue_messages_in_memory = {IN_MEMORY}\n")
    return own_broker("--config", str(config))


def pages_dir(broker) -> list[str]:
    return sorted(path.name for path in (broker.data_dir / "pages").iterdir())


def fill(channel, queue: str, count: int = COUNT, persistent_every: int = 2, **properties) -> None:
    """Publish count numbered messages under confirms (every persistent_every-th persistent)."""
    channel.confirm_delivery()
    for number in range(count):
        mode = 2 if persistent_every and number % persistent_every == 0 else 1
        channel.basic_publish("", queue, body(number), pika.BasicProperties(delivery_mode=mode, **properties))


def consume_acking(channel, queue: str, count: int) -> list[int]:
    """The numbers of count messages consumed from queue with acks (prefetch 50), in delivery order."""
    channel.basic_qos(prefetch_count=50)
    received = []
    for method, _, data in channel.consume(queue, inactivity_timeout=5):
        received.append(number_of(data))
        channel.basic_ack(method.delivery_tag)
        if len(received) == count:
            break
    channel.cancel()
    return received


def queue_info(broker, queue: str) -> dict:
    return management.request(broker, "GET", f"/api/queues/%2F/{management.quote(queue)}").body


def test_a_deep_queue_keeps_its_order_and_reports_its_paged_messages(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True)
        fill(channel, unique)
        assert message_count(channel, unique) == COUNT
        info = queue_info(paging_broker, unique)
        assert (info["messages"], info["messages_ready"], info["messages_paged_out"], info["messages_ram"]) == (
            COUNT, COUNT, COUNT - IN_MEMORY, IN_MEMORY)
        assert info["message_bytes_paged_out"] == (COUNT - IN_MEMORY) * BODY_SIZE
        assert info["message_bytes_ready"] == COUNT * BODY_SIZE
        assert info["messages_persistent"] == COUNT // 2
        assert pages_dir(paging_broker)  # full pages went to disk

        received = consume_acking(channel, unique, COUNT)
        assert received == list(range(COUNT))
        assert message_count(channel, unique) == 0
    management.wait_for(paging_broker, f"/api/queues/%2F/{unique}", lambda queue: queue["messages_paged_out"] == 0)
    # read pages are deleted (by the page files' thread, after the count: on a busy machine, a moment later)
    wait_for(lambda: pages_dir(paging_broker), 10, "no page file left", until=lambda names: names == [])


def test_requeued_messages_go_back_before_the_paged_ones_flagged_redelivered(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique)
        fill(channel, unique)
        tags = [channel.basic_get(unique)[0].delivery_tag for _ in range(5)]
        channel.basic_nack(tags[-1], multiple=True, requeue=True)
        drained = drain_with_flags(channel, unique)
    assert [number_of(data) for data, _ in drained] == list(range(COUNT))
    assert [redelivered for _, redelivered in drained] == [True] * 5 + [False] * (COUNT - 5)


def test_a_queue_ttl_expires_paged_messages_and_dead_letters_them_in_order(paging_broker, unique):
    dead = f"{unique}-dead"
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, dead)
        declare_queue(channel, unique, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": "",
                                                  "x-dead-letter-routing-key": dead})
        fill(channel, unique)
        wait_for_message_count(channel, dead, COUNT, timeout=15)
        assert message_count(channel, unique) == 0
        first = get(channel, dead)
        assert first.properties.headers["x-death"][0]["reason"] == "expired"
        assert [number_of(first.body)] + [number_of(data) for data in get_all(channel, dead)] == list(range(COUNT))


def test_paged_messages_with_their_own_ttl_expire_on_their_way_back_to_memory(paging_broker, unique):
    """Behind messages that do not expire, a paged message whose TTL passed leaves once it is read back (as a
    message of RabbitMQ's classic queues leaves once it reaches the head); it is never delivered."""
    dead = f"{unique}-dead"
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, dead)
        declare_queue(channel, unique, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        fill(channel, unique, count=IN_MEMORY)
        channel.basic_publish("", unique, b"short-lived", pika.BasicProperties(expiration=str(TTL_MS)))
        for _ in range(COUNT):
            channel.basic_publish("", unique, b"short-lived", pika.BasicProperties(expiration=str(TTL_MS)))
        published = time.monotonic()
        channel.basic_publish("", unique, b"keeper")
        time.sleep(max(0.0, TTL_MS / 1000 - (time.monotonic() - published)))  # the TTL passes
        _, inbox = consume(channel, unique, auto_ack=True)
        inbox.wait_for(conn, IN_MEMORY + 1)
        wait_for_message_count(channel, dead, COUNT + 1)
        assert [number_of(data) for data in inbox.bodies[:IN_MEMORY]] == list(range(IN_MEMORY))
        assert inbox.bodies[IN_MEMORY:] == [b"keeper"]
        assert message_count(channel, unique) == 0
        assert get(channel, dead).properties.headers["x-death"][0]["reason"] == "expired"


def test_drop_head_drops_the_oldest_across_the_paged_part(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, arguments={"x-max-length": 250})
        fill(channel, unique)
        assert message_count(channel, unique) == 250
        assert [number_of(data) for data in get_all(channel, unique)] == list(range(50, COUNT))


def test_paged_persistent_messages_survive_a_kill_in_order_with_their_flags(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True)
        fill(channel, unique, persistent_every=1)
        tags = [channel.basic_get(unique)[0].delivery_tag for _ in range(3)]
        channel.basic_nack(tags[-1], multiple=True, requeue=True)
        # the deliveries were recorded without waiting for the disk: a confirmed publish after them waits for it
        declare_queue(channel, f"{unique}-later", durable=True)
        fill(channel, f"{unique}-later", count=1, persistent_every=1)
        assert message_count(channel, unique) == COUNT
    paging_broker.kill()
    paging_broker.start()
    with connect(paging_broker) as conn:
        channel = conn.channel()
        assert message_count(channel, unique) == COUNT
        assert queue_info(paging_broker, unique)["messages_paged_out"] == COUNT - IN_MEMORY
        drained = drain_with_flags(channel, unique)
    assert [number_of(data) for data, _ in drained] == list(range(COUNT))
    assert [redelivered for _, redelivered in drained] == [True] * 3 + [False] * (COUNT - 3)


def test_persistent_messages_of_a_durable_queue_page_out_to_no_page_file(paging_broker, unique):
    """The store holds a durable queue's persistent messages already: its pages of them stay there (no second copy
    on disk), and come back in order with their counts; transient messages, or ones with a TTL, still go to the
    queue's page file."""
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True)
        fill(channel, unique, persistent_every=1)
        info = queue_info(paging_broker, unique)
        assert (info["messages"], info["messages_paged_out"], info["messages_persistent"]) == (
            COUNT, COUNT - IN_MEMORY, COUNT)
        assert info["message_bytes_paged_out"] == (COUNT - IN_MEMORY) * BODY_SIZE
        assert pages_dir(paging_broker) == []
        for queue, arguments, persistent_every in ((f"{unique}-transient", {}, 0),
                                                   (f"{unique}-ttl", {"x-message-ttl": 600000}, 1)):
            declare_queue(channel, queue, durable=True, arguments=arguments)
            fill(channel, queue, persistent_every=persistent_every)
        assert len(pages_dir(paging_broker)) == 2  # one page file each
        received = consume_acking(channel, unique, COUNT)
        assert received == list(range(COUNT))
        for queue in (f"{unique}-transient", f"{unique}-ttl"):
            assert [number_of(data) for data in get_all(channel, queue)] == list(range(COUNT))


def test_a_restarted_deep_queue_pages_its_messages_in_from_the_store_without_copying_them(paging_broker, unique):
    """After a restart the paged part of a queue is read back from the message store's own records: no page file is
    written at start, the counts are those before, and later arrivals queue up behind."""
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True)
        fill(channel, unique, persistent_every=1)
    paging_broker.stop()
    paging_broker.start()
    assert pages_dir(paging_broker) == []
    info = queue_info(paging_broker, unique)
    assert (info["messages"], info["messages_paged_out"], info["messages_ram"], info["messages_persistent"]) == (
        COUNT, COUNT - IN_MEMORY, IN_MEMORY, COUNT)
    assert (info["message_bytes_paged_out"], info["message_bytes_ready"]) == (
        (COUNT - IN_MEMORY) * BODY_SIZE, COUNT * BODY_SIZE)
    with connect(paging_broker) as conn:
        channel = conn.channel()
        fill(channel, unique, count=5, persistent_every=0)
        received = consume_acking(channel, unique, COUNT + 5)
    assert received == list(range(COUNT)) + list(range(5))


def test_recovered_paged_messages_expire_from_the_restart_on_and_are_dead_lettered_in_order(paging_broker, unique):
    dead = f"{unique}-dead"
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, dead, durable=True)
        declare_queue(channel, unique, durable=True, arguments={
            "x-message-ttl": 3000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
        fill(channel, unique, persistent_every=1)
    paging_broker.kill()
    paging_broker.start()
    with connect(paging_broker) as conn:
        channel = conn.channel()
        assert message_count(channel, unique) == COUNT  # the TTL counts again from the restart
        wait_for_message_count(channel, dead, COUNT, timeout=15)
        assert message_count(channel, unique) == 0
        assert [number_of(data) for data in get_all(channel, dead)] == list(range(COUNT))


def test_a_purge_or_delete_after_a_restart_drops_the_messages_still_in_the_store(paging_broker, unique):
    purged, deleted = f"{unique}-purged", f"{unique}-deleted"
    with connect(paging_broker) as conn:
        channel = conn.channel()
        for queue in (purged, deleted):
            declare_queue(channel, queue, durable=True)
            fill(channel, queue, persistent_every=1)
    paging_broker.kill()
    paging_broker.start()
    with connect(paging_broker) as conn:
        channel = conn.channel()
        assert channel.queue_purge(purged).method.message_count == COUNT
        assert channel.queue_delete(deleted).method.message_count == COUNT
        declare_queue(channel, deleted, durable=True)
        fill(channel, purged, count=2, persistent_every=1)  # confirmed: the removals before it are on disk
    paging_broker.kill()
    paging_broker.start()
    with connect(paging_broker) as conn:
        channel = conn.channel()
        assert [number_of(data) for data in get_all(channel, purged)] == [0, 1]
        assert message_count(channel, deleted) == 0


def test_a_purge_drops_the_paged_messages_for_good(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, durable=True)
        fill(channel, unique, persistent_every=1)
        assert channel.queue_purge(unique).method.message_count == COUNT
        assert message_count(channel, unique) == 0
        fill(channel, unique, count=3, persistent_every=1)  # the queue goes on working
    paging_broker.kill()
    paging_broker.start()
    with connect(paging_broker) as conn:
        assert [number_of(data) for data in get_all(conn.channel(), unique)] == [0, 1, 2]


def test_deleting_a_paged_queue_deletes_its_pages(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique)
        fill(channel, unique)
        assert pages_dir(paging_broker)
        assert channel.queue_delete(unique).method.message_count == COUNT
    management.wait_for(paging_broker, "/api/overview", lambda _: pages_dir(paging_broker) == [])


def test_a_priority_queue_keeps_every_message_in_memory(paging_broker, unique):
    with connect(paging_broker) as conn:
        channel = conn.channel()
        declare_queue(channel, unique, arguments={"x-max-priority": 5})
        fill(channel, unique, count=100)
        assert queue_info(paging_broker, unique)["messages_paged_out"] == 0
        assert [number_of(data) for data in get_all(channel, unique)] == list(range(100))
