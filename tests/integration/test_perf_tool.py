"""warren-perf, the load tool (docs/benchmarks.md): producers and consumers in processes of their own against a
broker, their rates, latency percentiles and CPU, and what it leaves behind (nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika
import pytest

WARREN_PERF = str(Path(sys.executable).parent / "warren-perf")
RUN_TIMEOUT = 60  # seconds for a run of one second (the processes' start included)


def warren_perf(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([WARREN_PERF, *arguments], capture_output=True, text=True, timeout=RUN_TIMEOUT)


def queue_exists(broker, name: str) -> bool:
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as connection:
        try:
            connection.channel().queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
    return True


def test_two_producers_and_two_consumers_report_rates_latencies_and_cpu(broker, unique):
    done = warren_perf("--uri", broker.url, "--producers", "2", "--consumers", "2", "--seconds", "1",
                       "--rate", "500", "--latency", "--ack-every", "10", "--queue", unique, "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert 900 <= figures["published"] <= 1100  # two producers at 500 msg/s for a second
    assert 0 < figures["delivered"] <= figures["published"]
    assert 0 < figures["p50 ms"] <= figures["p95 ms"] <= figures["p99 ms"] <= figures["max ms"]
    assert figures["client cpu us/msg"] > 0
    if not broker.external:
        assert figures["cpu us/msg"] > 0  # the broker runs here: its CPU time is read
    assert not queue_exists(broker, unique)


def test_a_fanout_run_delivers_each_message_to_every_queue_and_prints_a_report(broker, unique):
    done = warren_perf("--uri", broker.url, "--queues", "3", "--seconds", "1", "--rate", "300", "--queue", unique,
                       "--confirm", "10", "--persistent")
    assert done.returncode == 0, done.stderr
    published, delivered = (line.split() for line in done.stdout.splitlines()[:2])
    assert published[0] == "published" and delivered[0] == "delivered"
    assert int(published[3].strip("(").replace(",", "")) >= 250
    assert int(delivered[3].strip("(").replace(",", "")) > int(published[3].strip("(").replace(",", ""))
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["published", "delivered", "CPU/msg"]
    assert not any(queue_exists(broker, f"{unique}-{index}") for index in range(3))


def test_a_refused_login_fails_the_run_with_the_brokers_reason(broker):
    done = warren_perf("--uri", broker.url.replace("guest:guest", "guest:wrong"), "--seconds", "1")
    assert done.returncode == 1
    assert done.stderr.startswith("warren-perf: the run failed: consumer: connection closed: 403 ACCESS_REFUSED - ")
    assert len(done.stderr.splitlines()) == 1  # a line, no traceback


def test_a_broker_that_is_not_there_fails_the_run_in_a_line():
    done = warren_perf("--uri", "amqp://guest:guest@127.0.0.1:1/%2F", "--seconds", "1")
    assert (done.returncode, done.stderr) == (1, "warren-perf: the run failed: consumer: [Errno 111] Connection "
                                                 "refused\n")


@pytest.mark.parametrize(("arguments", "message"), [
    (("--ack-every", "200"), "--ack-every above --prefetch would stall"),
    (("--latency", "--size", "4"), "--latency needs --size 8 or more"),
    (("--producers", "0"), "--producers must be at least 1"),
    (("--rate", "-5"), "--rate must not be negative"),
    (("--prefetch", "70000"), "--prefetch must be at most 65535"),
])
def test_options_that_cannot_work_are_refused_before_anything_runs(arguments, message):
    done = warren_perf("--uri", "amqp://guest:guest@127.0.0.1:1/%2F", *arguments)
    assert done.returncode == 2
    assert message in done.stderr
