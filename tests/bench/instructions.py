"""Instructions per message, counted by callgrind: what a message costs the broker, free of the machine's noise.

    python -m tests.bench.instructions [--messages N] [--workers 1,2]

For each worker count, Warren runs under callgrind (valgrind), instrumenting nothing until the load starts: a
consumer (auto-ack) and a publisher of 16 B messages on vhost v1, in this process, the publisher kept at most
PACE messages ahead of the consumer. After a warm-up of WARM_UP messages, callgrind counts while N messages pass
and the counts are dumped per process and thread. Printed: instructions, first-level and last-level cache misses
(callgrind's simulated caches) per message, in the main thread of the process that serves v1 (one process, or
with several workers the one leading v1), in its other threads, and in the broker's other processes.

The counts repeat from run to run within about 0.4 % whatever else the machine does, where a timed run on a 2-core
machine swings by a third: the figure to compare two versions of the hot path with, or one process with a worker
(docs/workers.md). They count user-space instructions only: not the kernel's work for system calls, not waits on
memory a real cache would miss. Needs valgrind (apt-get install -y valgrind); about a minute per worker count.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.bench.brokers import RunningBroker, start_warren
from tests.bench.client import BenchConnection, BrokerURL, DeliveryCounter, message_frames
from tests.bench.process_memory import descendants
from tests.bench.workers import config_of, url

WARM_UP = 2_000  # messages passed before counting: first calls fill caches and run one-off code
PACE = 2_000  # messages the publisher may be ahead of the consumer
BATCH = 100  # messages per write
START_SECONDS = 300  # Warren under valgrind, startup uninstrumented
# the events of --cache-sim=yes, in callgrind's order
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")


class PacedCounter(DeliveryCounter):
    """Counts deliveries, and wakes the publisher once they reach the count it waits for."""

    def __init__(self, channel: int, target: int) -> None:
        super().__init__(channel, target=target)
        self._awaited = 0  # the delivery count the publisher waits for
        self._reached_awaited = asyncio.Event()

    def on_deliver(self, delivery_tag: int, outgoing: list[bytes]) -> None:
        super().on_deliver(delivery_tag, outgoing)
        if self.delivered >= self._awaited:
            self._reached_awaited.set()

    async def wait_for(self, count: int) -> None:
        self._awaited = count
        if self.delivered < count:
            self._reached_awaited.clear()
            await self._reached_awaited.wait()


async def pass_messages(target: str, count: int, queue: str = "instructions") -> None:
    """count messages of 16 B from a publisher to an auto-ack consumer, the publisher at most PACE ahead."""
    consumer = await BenchConnection.open(BrokerURL.parse(target))
    publisher = await BenchConnection.open(BrokerURL.parse(target))
    try:
        channel = await consumer.open_channel()
        await consumer.declare_queue(channel, queue)
        counter = PacedCounter(channel, count)
        await consumer.consume(channel, queue, counter, no_ack=True)
        publishing = await publisher.open_channel()
        batch = message_frames(publishing, "", queue, b"x" * 16) * BATCH
        for sent in range(BATCH, count + BATCH, BATCH):
            await publisher.send(batch)
            await counter.wait_for(sent - PACE)
        await counter.reached
    finally:
        await publisher.close()
        await consumer.close()


@dataclass
class Counts:
    """callgrind's totals for one thread of one process."""
    pid: int
    thread: int  # 1 is the main thread
    events: dict[str, int]


def read_dumps(directory: Path) -> list[Counts]:
    """The counts of the dump made after the load (file cg.PID.1-TID, callgrind's --separate-threads naming)."""
    found = []
    for path in directory.glob("cg.*.1-*"):
        pid, thread = re.fullmatch(r"cg\.(\d+)\.1-(\d+)", path.name).groups()
        text = path.read_text(errors="replace")
        names = re.search(r"^events: (.*)$", text, re.M).group(1).split()
        totals = re.search(r"^totals: (.*)$", text, re.M)
        values = [int(value) for value in totals.group(1).split()] if totals else [0] * len(names)
        found.append(Counts(int(pid), int(thread), dict(zip(names, values))))
    return found


def callgrind_control(option: str, pids: list[int]) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def count(workers: int, messages: int, workdir: Path) -> dict[str, dict[str, float]]:
    """Per message: the events of the busiest process's main thread, of its other threads, and of the others."""
    dumps = workdir / "callgrind"
    dumps.mkdir()
    config = workdir / "warren.toml"
    config.write_text(config_of(["v1"]))
    wrapper = ("valgrind", "--tool=callgrind", "--cache-sim=yes", "--instr-atstart=no", "--separate-threads=yes",
               "--trace-children=yes", f"--callgrind-out-file={dumps}/cg.%p")
    broker: RunningBroker = start_warren(workdir, "--workers", str(workers), "--config", str(config),
                                         wrapper=wrapper, start_seconds=START_SECONDS)
    try:
        target = url(broker, "v1")
        asyncio.run(pass_messages(target, WARM_UP))  # (with several workers, it also waits for v1's to serve)
        processes = [broker.process.pid, *descendants(broker.process.pid)]
        callgrind_control("--instr=on", processes)
        asyncio.run(pass_messages(target, messages))
        callgrind_control("--instr=off", processes)
        callgrind_control("--dump", processes)
    finally:
        broker.stop()
    counts = read_dumps(dumps)
    busiest = max({entry.pid for entry in counts},
                  key=lambda pid: sum(entry.events["Ir"] for entry in counts if entry.pid == pid))

    def per_message(entries: list[Counts]) -> dict[str, float]:
        return {event: sum(entry.events.get(event, 0) for entry in entries) / messages for event in EVENTS}

    return {
        "main thread": per_message([entry for entry in counts if entry.pid == busiest and entry.thread == 1]),
        "its other threads": per_message([entry for entry in counts if entry.pid == busiest and entry.thread != 1]),
        "other processes": per_message([entry for entry in counts if entry.pid != busiest]),
    }


def print_table(results: dict[int, dict[str, dict[str, float]]], messages: int) -> None:
    counts = list(results)
    print(f"per message, {messages} messages of 16 B, auto-ack, on vhost v1 (callgrind, simulated caches)")
    print(f"{'':44}" + "".join(f"{f'{n} worker' + ('s' if n > 1 else ''):>12}" for n in counts))
    for part in ("main thread", "its other threads", "other processes"):
        for label, events in (("instructions", ("Ir",)), ("L1 misses", ("I1mr", "D1mr", "D1mw")),
                              ("last-level misses", ("ILmr", "DLmr", "DLmw"))):
            name = f"{part if label == 'instructions' else '':20}{label:>24}"
            print(name + "".join(f"{sum(results[n][part][event] for event in events):12.1f}" for n in counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages counted (a multiple of 100)")
    parser.add_argument("--workers", default="1,2", help="worker counts to run, comma-separated")
    args = parser.parse_args(argv)
    if args.messages <= 0 or args.messages % BATCH:
        parser.error(f"--messages must be a positive multiple of {BATCH}")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return 1
    results = {}
    for workers in (int(number) for number in args.workers.split(",")):
        with tempfile.TemporaryDirectory(prefix="warren-instructions-") as workdir:
            results[workers] = count(workers, args.messages, Path(workdir))
    print_table(results, args.messages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
