"""The cluster tests' client tools, against one ordinary broker: the confirm-tracking publisher
(tests.cluster.publisher) and the drain with its check (tests.cluster.drain).

A broker killed with -9 and restarted on the same port and data dir stands in for a failover: the publisher
reconnects by itself, republishes what was unconfirmed, and no confirmed id is lost. A SIGSTOPped broker stands in
for a leader that hangs without closing its connections. The figures are printed: run with -s to see them.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.cluster.drain import QueueMissing, drain, verify
from tests.cluster.ids import describe, to_ranges
from tests.cluster.publisher import Ledger, Loss, Outstanding, start_publisher
from tests.conftest import free_port

COUNT = 20_000
WINDOW = 500
BODY_SIZE = 16
QUEUE = "cluster-ids"
TIMEOUT = 60.0  # bound on anything that waits for the publisher or the drain


@pytest.fixture
def publishers(tmp_path):
    """start(nodes, **options) -> a publisher of QUEUE with its own files; every one is killed at the end."""
    started = []

    def start(nodes, **options):
        handle = start_publisher(nodes, QUEUE, BODY_SIZE, WINDOW, tmp_path / f"publisher-{len(started)}", **options)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.kill()


def report_figures(title: str, result: dict, report) -> None:
    gaps = ", ".join(f"{gap:.3f} s" for gap in result["failover_gaps"]) or "none"
    print(f"\n{title}: {result['confirmed_count']} confirmed at {result['confirms_per_second']:,.0f}/s "
          f"({result['cpu_seconds']:.2f} s publisher CPU), {result['republished']} republished, "
          f"{result['connection_losses']} connection losses, failover gaps {gaps}\n  {report.summary}")


# --- against a broker ------------------------------------------------------------------------------------------

def test_publishes_a_count_and_the_drain_reads_each_id_once(own_broker, publishers):
    broker = own_broker()
    nobody = f"127.0.0.1:{free_port()}"  # refuses connections: the publisher and the drain move on to the broker
    result = publishers([nobody, broker], count=COUNT).wait(TIMEOUT)
    assert result["stopped_by"] == "count"
    assert result["confirmed"] == [[0, COUNT]]
    assert (result["ids_published"], result["publishes"], result["connection_losses"]) == (COUNT, COUNT, 0)

    drained = drain([nobody, broker], QUEUE, TIMEOUT)
    report = verify(result["confirmed"], drained)
    report_figures("one broker", result, report)
    assert drained["ids"] == Counter(range(COUNT))
    assert (drained["redelivered"], drained["node"]) == (0, f"{broker.host}:{broker.port}")
    assert report.ok and report.duplicates == report.unconfirmed_read == 0


def test_kill_9_mid_run_loses_no_confirmed_id(own_broker, publishers):
    broker = own_broker()
    publisher = publishers([broker])
    publisher.wait_confirmed(COUNT // 4, TIMEOUT)
    broker.kill()
    confirmed_before = publisher.wait_for(lambda progress: progress["losses"] == 1, TIMEOUT)["confirmed"]
    broker.start()  # the same port and data dir
    publisher.wait_confirmed(max(COUNT, confirmed_before + 1000), TIMEOUT)
    result = publisher.stop()

    assert result["stopped_by"] == "signal"
    assert result["confirmed"] == [[0, result["ids_published"]]], "every id ends confirmed after its republish"
    assert result["publishes"] == result["ids_published"] + result["republished"]
    (loss,) = result["losses"]
    assert loss["node"] == f"{broker.host}:{broker.port}"
    assert 0 < loss["reconnected"] <= loss["gap"] < TIMEOUT
    assert result["failover_gaps"] == [loss["gap"]]

    report = verify(result["confirmed"], drain([broker], QUEUE, TIMEOUT))
    report_figures("kill -9 and restart", result, report)
    assert report.ok, report.summary
    assert report.duplicates <= WINDOW
    assert report.unconfirmed_read == 0


def test_a_hung_broker_is_given_up_after_the_stall_timeout(own_broker, publishers):
    broker = own_broker()
    publisher = publishers([broker], stall_timeout=1.0)
    publisher.wait_confirmed(COUNT // 4, TIMEOUT)
    broker.process.send_signal(signal.SIGSTOP)
    try:
        publisher.wait_for(lambda progress: progress["losses"] == 1, TIMEOUT)
    finally:
        broker.process.send_signal(signal.SIGCONT)
    publisher.wait_confirmed(publisher.confirmed + 1000, TIMEOUT)
    result = publisher.stop()

    assert [loss["reason"] for loss in result["losses"]] == ["no confirm for 1.0 s"]
    assert len(result["failover_gaps"]) == 1
    report = verify(result["confirmed"], drain([broker], QUEUE, TIMEOUT))
    report_figures("SIGSTOP and SIGCONT", result, report)
    assert report.ok, report.summary
    assert report.duplicates <= WINDOW


def test_stops_when_the_until_file_appears(own_broker, publishers, tmp_path):
    broker = own_broker()
    until = tmp_path / "stop-now"
    publisher = publishers([broker], until_file=until)
    publisher.wait_confirmed(1000, TIMEOUT)
    until.touch()
    result = publisher.wait(TIMEOUT)
    assert result["stopped_by"] == "until-file"
    report = verify(result["confirmed"], drain([broker], QUEUE, TIMEOUT))
    assert report.ok and report.read == result["ids_published"] == report.confirmed, report.summary


def test_draining_a_queue_that_does_not_exist_fails_at_once(own_broker):
    with pytest.raises(QueueMissing):
        drain([own_broker()], "no-such-queue", TIMEOUT)


def test_draining_with_no_node_up_times_out():
    with pytest.raises(TimeoutError, match="could not drain"):
        drain([f"127.0.0.1:{free_port()}"], QUEUE, timeout=0.5)


# --- the pure parts --------------------------------------------------------------------------------------------

def test_ids_make_ranges():
    assert to_ranges([]) == []
    assert to_ranges([0, 1, 2, 5, 7, 8]) == [[0, 3], [5, 6], [7, 9]]
    assert describe([[0, 3], [5, 6], [7, 9]], limit=2) == "0-2, 5, ... (1 more runs)"


def test_the_ledger_follows_acks_nacks_and_losses():
    ledger = Ledger(count=10)
    channel = Outstanding(ledger)
    channel.add(ledger.take(6))  # ids 0-5 under tags 1-6
    channel.on_confirm(2, multiple=False, acked=True)
    channel.on_confirm(3, multiple=True, acked=True)  # tags 1 and 3; 2 came before
    channel.on_confirm(4, multiple=False, acked=False)
    assert (ledger.confirmed_count, ledger.nacks, list(ledger.retry), len(channel)) == (3, 1, [3], 2)

    ledger.lost(Loss("n1", "reset", at=0.0, since=0.0), channel.pending.values())  # ids 4 and 5 were in flight
    assert list(ledger.retry) == [3, 4, 5]
    retried = Outstanding(ledger)
    retried.add(ledger.take(100))  # 3, 4, 5 again, then the fresh 6-9, and no more: the count is 10
    assert (ledger.republished, ledger.next_id, ledger.publishes) == (3, 10, 13)
    retried.on_confirm(7, multiple=True, acked=True)
    assert ledger.done and not retried
    assert ledger.losses[0].gap is not None


def test_verify_counts_missing_duplicated_and_unconfirmed_ids():
    drained = {"ids": Counter([0, 1, 1, 2, 4, 9, 9, 9]), "redelivered": 2}
    report = verify([[0, 3], [4, 8]], drained)
    assert not report.ok
    assert (report.missing, report.missing_count) == ([[5, 8]], 3)
    assert (report.duplicates, report.duplicated_ids, report.unconfirmed_read) == (3, 2, 1)
    assert report.summary == ("7 confirmed, 8 read back: 3 confirmed ids MISSING (5-7); 3 duplicates of 2 ids; "
                              "1 ids read that were never confirmed; 2 redelivered")
