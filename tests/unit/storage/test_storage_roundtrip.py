"""What goes into the store comes back after a restart: messages, flags, definitions, deleted queues."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import subprocess
import sys

from storage.store import REMOVAL_SLICE, MessageStore
from tests.conftest import REPO_ROOT
from tests.unit.storage.storage_support import reopen, run


def bodies(recovered, queue: str) -> list[bytes]:
    return [message.body for message in recovered.messages.get(queue, [])]


def test_messages_come_back_in_order_with_all_fields(tmp_path):
    def work(store):
        for msg_id in range(5):
            store.append_message(msg_id, ("orders",), "shop", "order.new", b"\x00\x3c" + bytes([msg_id]), b"b%d" % msg_id)

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    messages = list(recovered.messages["orders"])
    assert [m.msg_id for m in messages] == [0, 1, 2, 3, 4]
    assert messages[3].exchange == "shop"
    assert messages[3].routing_key == "order.new"
    assert messages[3].header_payload == b"\x00\x3c\x03"
    assert messages[3].body == b"b3"
    assert not any(m.redelivered for m in messages)
    assert recovered.next_msg_id == 5
    assert recovered.report["messages"] == 5
    assert recovered.report["clean_shutdown"] is True


def test_interleaved_addresses_and_headers_come_back_exactly_with_equal_values_shared(tmp_path):
    """Consecutive records that differ only slightly (a longer key, a longer header, another queue, a delivered
    flag) each come back as written; equal names and headers read back together come back as one object each."""
    variants = [
        (("q",), "ex", "k", b"h"),
        (("q",), "ex", "kk", b"h"),
        (("q",), "ex", "k", b"hh"),
        (("q", "r"), "ex", "k", b"h"),
        (("r",), "", "k", b"h"),
        (("q",), "échange", "clé", b"\x00\x3c"),
    ]
    expected: dict[str, list[tuple]] = {"q": [], "r": []}

    def work(store):
        for msg_id in range(60):
            queues, exchange, routing_key, header = variants[msg_id * 7 % len(variants)]
            body = header + routing_key.encode() if msg_id % 2 else b""  # bodies that resemble what precedes them
            store.append_message(msg_id, queues, exchange, routing_key, header, body)
            for queue in queues:
                expected[queue].append((msg_id, exchange, routing_key, header, body, msg_id % 3 == 0))
            if msg_id % 3 == 0:
                store.append_delivered(queues[0], [msg_id])
            if msg_id % 3 == 0 and len(queues) > 1:
                store.append_delivered(queues[1], [msg_id])

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    for queue, messages in expected.items():
        assert [(m.msg_id, m.exchange, m.routing_key, m.header_payload, m.body, m.redelivered)
                for m in recovered.messages[queue]] == messages
    messages = list(recovered.messages["q"])  # one run of records, read back at once
    assert len({id(m.header_payload) for m in messages}) == 3
    assert len({id(m.routing_key) for m in messages}) == 3
    assert len({id(m.exchange) for m in messages}) == 2


def test_removed_messages_stay_gone_and_delivered_ones_come_back_redelivered(tmp_path):
    def work(store):
        for msg_id in range(6):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"m%d" % msg_id)
        store.append_delivered("q", [0, 1, 2])
        store.append_removed("q", [0, 1])

    run(tmp_path, work)
    messages = reopen(tmp_path).messages["q"]
    assert [(m.msg_id, m.redelivered) for m in messages] == [(2, True), (3, False), (4, False), (5, False)]


def test_a_message_in_several_queues_leaves_each_queue_separately(tmp_path):
    def work(store):
        store.append_message(10, ("a", "b", "c"), "fan", "", b"h", b"shared")
        store.append_message(11, ("a",), "fan", "", b"h", b"only-a")
        store.append_delivered("b", [10])
        store.append_removed("a", [10])

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert bodies(recovered, "a") == [b"only-a"]
    assert [(m.body, m.redelivered) for m in recovered.messages["b"]] == [(b"shared", True)]
    assert [(m.body, m.redelivered) for m in recovered.messages["c"]] == [(b"shared", False)]
    assert recovered.next_msg_id == 12


def test_state_survives_several_restarts_without_duplicates(tmp_path):
    run(tmp_path, lambda store: [store.append_message(i, ("q",), "", "q", b"h", b"%d" % i) for i in range(3)])
    run(tmp_path, lambda store: store.append_removed("q", [1]))
    run(tmp_path, lambda store: store.append_message(3, ("q",), "", "q", b"h", b"3"))
    assert bodies(reopen(tmp_path), "q") == [b"0", b"2", b"3"]
    assert bodies(reopen(tmp_path), "q") == [b"0", b"2", b"3"]


def test_definitions_keep_creation_order_latest_state_and_deletions(tmp_path):
    arguments = {"x-bytes": b"\x01\x02", "x-decimal": decimal.Decimal("1.25"),
                 "x-when": datetime.datetime(2024, 5, 1, 12, 0), "x-list": [1, "two", None], "x-flag": True}

    def work(store):
        store.append_definition("exchange", "/|logs", {"name": "logs", "type": "fanout"})
        store.append_definition("exchange", "/|jobs", {"name": "jobs", "type": "direct"})
        store.append_definition("queue", "/|q1", {"name": "q1", "arguments": arguments})
        store.append_definition("exchange", "/|logs", {"name": "logs", "type": "topic"})  # update keeps position
        store.append_definition("binding", "/|jobs|q1|k", {"source": "jobs", "destination": "q1", "key": "k"})
        store.append_definition("exchange", "/|jobs", None)
        store.append_definition("vhost", "/", {"name": "/"})
        store.append_definition("user", "guest", {"name": "guest", "tags": ["administrator"]})
        store.append_definition("policy", "/|ttl", {"pattern": ".*", "definition": {"message-ttl": 1000}})

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert recovered.exchanges == [{"name": "logs", "type": "topic"}]
    assert recovered.queues == [{"name": "q1", "arguments": arguments}]
    assert recovered.bindings == [{"source": "jobs", "destination": "q1", "key": "k"}]
    assert recovered.vhosts == [{"name": "/"}]
    assert recovered.users == [{"name": "guest", "tags": ["administrator"]}]
    assert recovered.policies == [{"pattern": ".*", "definition": {"message-ttl": 1000}}]


def test_deleted_queue_loses_its_messages_even_when_declared_again(tmp_path):
    def work(store):
        store.append_definition("queue", "q", {"name": "q"})
        store.append_message(0, ("q",), "", "q", b"h", b"old-0")
        store.append_message(1, ("q", "other"), "", "q", b"h", b"old-1")
        store.delete_queue("q")
        store.append_definition("queue", "q", {"name": "q", "again": True})
        store.append_message(2, ("q",), "", "q", b"h", b"new")

    run(tmp_path, work)
    recovered = reopen(tmp_path)
    assert recovered.queues == [{"name": "q", "again": True}]
    assert bodies(recovered, "q") == [b"new"]
    assert bodies(recovered, "other") == [b"old-1"]


def test_definitions_log_is_snapshotted_when_it_outgrows_the_live_state(tmp_path):
    def work(store):
        for round_ in range(3000):
            store.append_definition("queue", "churn", {"name": "churn", "round": round_})
            store.append_definition("queue", "churn", None)
        store.append_definition("queue", "kept", {"name": "kept"})

    run(tmp_path, work)
    appended = 6001 * 40  # every record is at least this long
    assert (tmp_path / "definitions.log").stat().st_size < appended / 10
    assert reopen(tmp_path).queues == [{"name": "kept"}]
    run(tmp_path, lambda store: store.append_definition("queue", "later", {"name": "later"}))
    assert reopen(tmp_path).queues == [{"name": "kept"}, {"name": "later"}]


def test_message_ids_must_increase(tmp_path):
    errors = []

    def work(store):
        store.append_message(5, ("q",), "", "q", b"h", b"x")
        try:
            store.append_message(5, ("q",), "", "q", b"h", b"again")
        except ValueError as error:
            errors.append(error)

    run(tmp_path, work)
    assert errors
    assert bodies(reopen(tmp_path), "q") == [b"x"]


def test_recovery_reads_bodies_when_asked_so_a_big_backlog_is_not_all_in_memory_at_once(tmp_path):
    """Recovery keeps a few columns per message; bodies are read back from their segments when asked for."""
    import tracemalloc

    body_size, count = 64 * 1024, 1000  # 64 MiB of bodies in four segments

    def work(store):
        for msg_id in range(count):
            store.append_message(msg_id, ("big",), "", "big", b"\x00\x3c", bytes([msg_id % 256]) * body_size)

    run(tmp_path, work)
    tracemalloc.start()
    try:
        recovered = reopen(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20  # about one segment read at a time, not the 64 MiB of bodies
    messages = recovered.messages["big"]
    assert [len(messages), messages.read(300, 301)[0].body] == [count, bytes([300 % 256]) * body_size]
    assert [len(run) for run in messages.runs(0, max_bytes=1 << 20)] == [16] * 62 + [8]  # runs stay in a segment


def test_removals_and_deliveries_from_one_queue_in_one_batch_are_written_as_one_record_each(tmp_path):
    run(tmp_path, lambda store: [store.append_message(i, ("q",), "", "q", b"h", b"%d" % i) for i in range(10)])

    def settle_one_by_one(store):
        for msg_id in range(5):
            store.append_removed("q", [msg_id])
        for msg_id in range(5, 8):
            store.append_delivered("q", [msg_id])

    run(tmp_path, settle_one_by_one)
    recovered = reopen(tmp_path)
    assert [(m.msg_id, m.redelivered) for m in recovered.messages["q"]] == [
        (5, True), (6, True), (7, True), (8, False), (9, False)]
    assert recovered.report["records"] == 10 + 2


# Appends MANY messages, then removes all but the last three at once and, as soon as a durability callback
# registered after that removal says it is on disk, ends without closing the store (as a kill -9 would end it).
REMOVE_AND_END = """
import asyncio, os, sys
from pathlib import Path
from storage.store import MessageStore

async def main():
    store = MessageStore(Path(sys.argv[1]))
    store.recover()
    many = int(sys.argv[2])
    for msg_id in range(many):
        store.append_message(msg_id, ("q",), "", "q", b"h", b"m%d" % msg_id)
    store.append_removed("q", list(range(many - 3)))
    done = asyncio.get_running_loop().create_future()
    store.when_durable(done.set_result)
    assert await done is True
    os._exit(0)

asyncio.run(main())
"""


def test_a_removal_of_many_ids_is_on_disk_before_a_callback_registered_after_it_runs(tmp_path):
    """It is marked a slice a loop turn; a callback registered meanwhile waits for the last slice."""
    many = 3 * REMOVAL_SLICE + 10
    subprocess.run([sys.executable, "-c", REMOVE_AND_END, str(tmp_path), str(many)], cwd=REPO_ROOT, check=True,
                   timeout=120)
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [many - 3, many - 2, many - 1]


def test_a_removal_of_many_ids_under_way_is_finished_by_the_close(tmp_path):
    many = 3 * REMOVAL_SLICE + 10

    async def main() -> None:
        store = MessageStore(tmp_path)
        store.recover()
        for msg_id in range(many):
            store.append_message(msg_id, ("q",), "", "q", b"h", b"m%d" % msg_id)
        store.append_removed("q", list(range(many - 3)))
        store.close()  # (in the loop turn of the removal's first slice)

    asyncio.run(main())
    assert [m.msg_id for m in reopen(tmp_path).messages["q"]] == [many - 3, many - 2, many - 1]
