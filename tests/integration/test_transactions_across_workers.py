"""Transactions whose publishes go to queues of several workers (`--workers 2`, queues placed `balanced`) commit on
every worker or on none (docs/workers.md#transactions-across-workers): judged from outside, by what consumers of
each queue get, whatever worker is killed and when."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import consume, wait_until
from tests.integration.test_queues_across_workers import PERSISTENT, connect, place_elsewhere, two_workers  # noqa: F401
from tests.integration.test_workers import worker_pids
from tests.waiting import wait_for

if os.environ.get("WARREN_TEST_URL"):
    pytest.skip("starts brokers of its own", allow_module_level=True)

HELD = b"\x00held|"  # what a store's segments hold while a transaction's share waits for its decision


def fanout_to_both(broker, channel) -> None:
    """Queue "here" on worker 0 (which serves the vhost's clients), "there" on worker 1, both bound to "both"."""
    channel.queue_declare("here", durable=True)
    place_elsewhere(broker, channel, {"there": {"durable": True}})
    channel.exchange_declare("both", "fanout", durable=True)
    for queue in ("here", "there"):
        channel.queue_bind(queue, "both")


def drained(broker, queue: str) -> list[bytes]:
    """Every message of queue, taken."""
    with connect(broker) as conn:
        channel = conn.channel()
        count = channel.queue_declare(queue, passive=True).method.message_count
        _, inbox = consume(channel, queue, auto_ack=True)
        inbox.wait_for(conn, count)
        return list(inbox.bodies)


def store_holds(data_dir: Path, worker: int, needle: bytes) -> bool:
    """Whether worker's message store (worker 0's is the data dir's own) has needle in its segments."""
    directory = data_dir / "messages" if worker == 0 else data_dir / "workers" / str(worker) / "messages"
    return any(needle in path.read_bytes() for path in directory.glob("*.seg"))


def test_a_commit_shows_on_both_workers_at_once_and_a_rollback_on_neither(two_workers):
    broker = two_workers()
    with connect(broker) as conn:
        channel, other = conn.channel(), conn.channel()
        fanout_to_both(broker, channel)
        for queue in ("here", "there"):
            channel.basic_publish("", queue, b"to ack", PERSISTENT)
        channel.tx_select()
        for number in range(3):
            channel.basic_publish("both", "", b"%d" % number, PERSISTENT)
        counts = {queue: other.queue_declare(queue, passive=True).method.message_count for queue in ("here", "there")}
        assert counts == {"here": 1, "there": 1}  # nothing of it before the commit
        channel.tx_rollback()
        channel.basic_publish("both", "", b"3", PERSISTENT)
        got = [channel.basic_get(queue) for queue in ("here", "there")]
        for method, _, body in got:
            assert body == b"to ack"
            channel.basic_ack(method.delivery_tag)
        channel.tx_commit()
        counts = {queue: other.queue_declare(queue, passive=True).method.message_count for queue in ("here", "there")}
        assert counts == {"here": 1, "there": 1}  # the message in, the acked one out, on both at the commit-ok
    broker.restart()
    assert drained(broker, "here") == drained(broker, "there") == [b"3"]


def test_a_coordinator_killed_while_a_worker_holds_its_share_commits_it_nowhere(two_workers, tmp_path):
    """Worker 0 (which serves the client) holds its share and has sent worker 1's, but worker 1 is stopped and
    cannot answer: worker 0 is killed. Worker 1, woken, holds its share until worker 0 is back and says it never
    decided to commit: then drops it."""
    broker = two_workers()
    with connect(broker) as conn:
        fanout_to_both(broker, conn.channel())
    pids = worker_pids(broker)
    outcome: list[BaseException] = []

    def commit() -> None:
        with connect(broker) as conn:
            channel = conn.channel()
            channel.tx_select()
            channel.basic_publish("both", "", b"never", PERSISTENT)
            try:
                channel.tx_commit()
            except pika.exceptions.AMQPError as error:
                outcome.append(error)

    os.kill(pids[1], signal.SIGSTOP)
    committing = threading.Thread(target=commit, daemon=True)
    try:
        committing.start()
        wait_for(lambda: store_holds(tmp_path / "data", 0, HELD), what="worker 0 holding its share")
        os.kill(pids[0], signal.SIGKILL)
    finally:
        os.kill(pids[1], signal.SIGCONT)
    committing.join(30)
    assert outcome and not committing.is_alive()  # no commit-ok: the connection went with worker 0
    wait_for(lambda: store_holds(tmp_path / "data", 1, HELD), what="worker 1 holding its share once woken")
    wait_for(lambda: worker_pids(broker)[0] != pids[0], timeout=30, what="worker 0 serving again")
    with connect(broker) as conn:  # (a confirm from worker 1 comes after what worker 0 said first on their link)
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "there", b"after", PERSISTENT)
    assert drained(broker, "here") == [] and drained(broker, "there") == [b"after"]
    broker.restart()
    with connect(broker) as conn:
        channel = conn.channel()
        assert [channel.queue_declare(queue, passive=True).method.message_count for queue in ("here", "there")] \
            == [0, 0]


class Committer(threading.Thread):
    """Commits transactions one after another on a fresh channel after each error (a new connection where it was
    lost), each publishing its number to "both"; records the numbers whose commit-ok came."""

    def __init__(self, broker, stop: threading.Event):
        super().__init__(daemon=True)
        self.broker, self.stop = broker, stop
        self.committed: list[int] = []
        self.failures = 0  # commits that got no commit-ok

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            try:
                with connect(self.broker) as conn:
                    channel = conn.channel()
                    channel.tx_select()
                    while not self.stop.is_set():
                        number += 1
                        channel.basic_publish("both", "", b"%d" % number, PERSISTENT)
                        channel.tx_commit()
                        self.committed.append(number)
            except (pika.exceptions.AMQPError, OSError):
                self.failures += 1
                self.stop.wait(0.05)  # (the worker serving the vhost may be starting again: not a busy loop)


@pytest.mark.parametrize("victim", [1, 0], ids=["owner", "coordinator"])
def test_every_transaction_is_in_both_queues_or_in_neither_whichever_worker_is_killed(two_workers, victim):
    broker = two_workers()
    with connect(broker) as conn:
        fanout_to_both(broker, conn.channel())
    stop = threading.Event()
    committer = Committer(broker, stop)
    committer.start()
    try:
        wait_for(lambda: len(committer.committed) >= 300, timeout=60, what="300 transactions committed")
        killed = worker_pids(broker)[victim]
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: worker_pids(broker)[victim] != killed, timeout=30, what=f"worker {victim} started again")
        after = len(committer.committed)
        wait_for(lambda: len(committer.committed) >= after + 100, timeout=60, what="commits going on again")
    finally:
        stop.set()
        committer.join(30)
    assert committer.failures >= 1  # (the kill cut a commit or the connection)
    here, there = drained(broker, "here"), drained(broker, "there")
    assert len(set(here)) == len(here) and len(set(there)) == len(there)  # each once
    assert set(here) == set(there)  # every transaction on both workers or on neither
    assert {b"%d" % number for number in committer.committed} <= set(here)  # each commit-ok kept
