"""Instructions per message, counted by callgrind: what a message costs the broker, free of the machine's noise.

    python -m tests.bench.instructions [--messages N] [--setups 1:v1,2:v1,2:/+v1,2:v1*]

For each setup (a worker count and the vhosts busy at once), Warren runs under callgrind (valgrind), instrumenting
nothing until the load starts: in each busy vhost a consumer (auto-ack) and a publisher of 16 B messages, in this
process, the publisher kept at most PACE messages ahead of its consumer. After a warm-up of WARM_UP messages,
callgrind counts while N messages pass in each vhost, and the counts are dumped per process and thread. Printed:
instructions, first-level and last-level cache misses (callgrind's simulated caches) per message, in the main
threads of the processes that served the load (one process, or the workers leading the busy vhosts), in their other
threads, in the broker's other processes (the supervisor, idle workers) and in all.

The default setups compare one process with one busy vhost, two workers with the same one vhost busy (what a worker
costs), two workers with a busy vhost each (what the hand-off and the shared definitions cost per message, summed
over every process), and two workers where the busy vhost's queue is owned by the other worker (a vhost written
with a star: what a crossing costs, docs/workers.md#queues-of-one-vhost-over-workers).

The counts move by about 1.5 % from run to run whatever else the machine does, where a timed run on a 2-core
machine swings by a third: the figure to compare two versions of the hot path with, or one process with a worker
(docs/workers.md). They count user-space instructions only: not the kernel's work for system calls, not waits on
memory a real cache would miss. Under callgrind the broker runs about 50 times slower, so a bound in time (a read's
READ_SECONDS, broker/connection/connection.py) ends after a fiftieth of the messages and the loop turns it adds are
counted as many times more: a change to such a bound moves the count far more than it moves a real run. Needs
valgrind (apt-get install -y valgrind); about a minute per setup.
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
from tests.bench.workers import config_of, url
from warrenperf.client import BenchConnection, BrokerURL, DeliveryCounter, message_frames
from warrenperf.process_memory import descendants

WARM_UP = 2_000  # messages passed before counting: first calls fill caches and run one-off code
PACE = 2_000  # messages the publisher may be ahead of the consumer
BATCH = 100  # messages per write
START_SECONDS = 300  # Warren under valgrind, startup uninstrumented
# the events of --cache-sim=yes, in callgrind's order
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
SERVING_SHARE = 0.1  # a process that ran more than this share of one busy vhost's instructions served the load


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


@dataclass(frozen=True)
class Setup:
    """A broker's worker count and the vhosts busy at once, each with its own publisher and consumer, and those of
    them whose queue another worker owns."""
    workers: int
    vhosts: tuple[str, ...]
    crossing: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Setup:
        """WORKERS:VHOST[+VHOST...], e.g. 2:/+v1; VHOST* for a vhost whose queue another worker owns"""
        workers, _, vhosts = text.partition(":")
        names = vhosts.split("+") if vhosts else ["v1"]
        return cls(int(workers), tuple(name.rstrip("*") for name in names),
                   tuple(name.rstrip("*") for name in names if name.endswith("*")))

    def __str__(self) -> str:
        return f"{self.workers}w {'+'.join(name + '*' * (name in self.crossing) for name in self.vhosts)}"


async def place_elsewhere(broker: RunningBroker, vhost: str) -> None:
    """Have the vhost's busy queue owned by another worker than the vhost's: its worker gets a queue first, and the
    busy one goes to the worker that owns the fewest (the config's balanced locator)."""
    connection = await BenchConnection.open(BrokerURL.parse(url(broker, vhost)))
    try:
        await connection.declare_queue(await connection.open_channel(), "instructions-filler")
    finally:
        await connection.close()


async def pass_everywhere(broker: RunningBroker, vhosts: tuple[str, ...], messages: int) -> None:
    await asyncio.gather(*(pass_messages(url(broker, vhost), messages) for vhost in vhosts))


def count(setup: Setup, messages: int, workdir: Path) -> dict[str, dict[str, float]]:
    """Per message (``messages`` in each busy vhost): the events of the processes that served them (their main
    threads, then their other threads), of the broker's other processes, and of all."""
    dumps = workdir / "callgrind"
    dumps.mkdir()
    config = workdir / "warren.toml"
    config.write_text(config_of(list(dict.fromkeys(["v1", *setup.vhosts])))
                      + ('[queues]\nleader_locator = "balanced"\n' if setup.crossing else ""))
    wrapper = ("valgrind", "--tool=callgrind", "--cache-sim=yes", "--instr-atstart=no", "--separate-threads=yes",
               "--trace-children=yes", f"--callgrind-out-file={dumps}/cg.%p")
    broker: RunningBroker = start_warren(workdir, "--workers", str(setup.workers), "--config", str(config),
                                         wrapper=wrapper, start_seconds=START_SECONDS)
    try:  # (with several workers, the warm-up also waits for each vhost's to serve)
        for vhost in setup.crossing:
            asyncio.run(place_elsewhere(broker, vhost))
        asyncio.run(pass_everywhere(broker, setup.vhosts, WARM_UP))
        processes = [broker.process.pid, *descendants(broker.process.pid)]
        callgrind_control("--instr=on", processes)
        asyncio.run(pass_everywhere(broker, setup.vhosts, messages))
        callgrind_control("--instr=off", processes)
        callgrind_control("--dump", processes)
    finally:
        broker.stop()
    counts = read_dumps(dumps)
    total = sum(entry.events["Ir"] for entry in counts)
    by_process = {pid: sum(entry.events["Ir"] for entry in counts if entry.pid == pid)
                  for pid in {entry.pid for entry in counts}}
    serving = {pid for pid, instructions in by_process.items()
               if instructions > total * SERVING_SHARE / len(setup.vhosts)}

    def per_message(entries: list[Counts]) -> dict[str, float]:
        return {event: sum(entry.events.get(event, 0) for entry in entries) / (messages * len(setup.vhosts))
                for event in EVENTS}

    return {
        "serving, main threads": per_message([entry for entry in counts
                                              if entry.pid in serving and entry.thread == 1]),
        "serving, other threads": per_message([entry for entry in counts
                                               if entry.pid in serving and entry.thread != 1]),
        "other processes": per_message([entry for entry in counts if entry.pid not in serving]),
        "in all": per_message(counts),
    }


def print_table(results: dict[Setup, dict[str, dict[str, float]]], messages: int) -> None:
    print(f"per message, {messages} messages of 16 B in each busy vhost, auto-ack (callgrind, simulated caches); "
          "NwV: N workers, vhosts V busy")
    print(f"{'':44}" + "".join(f"{str(setup):>14}" for setup in results))
    for part in ("serving, main threads", "serving, other threads", "other processes", "in all"):
        for label, events in (("instructions", ("Ir",)), ("L1 misses", ("I1mr", "D1mr", "D1mw")),
                              ("last-level misses", ("ILmr", "DLmr", "DLmw"))):
            name = f"{part if label == 'instructions' else '':24}{label:>20}"
            print(name + "".join(f"{sum(found[part][event] for event in events):14.1f}" for found in results.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages counted in each busy vhost (a "
                                                                      "multiple of 100)")
    parser.add_argument("--setups", default="1:v1,2:v1,2:/+v1,2:v1*",
                        help="WORKERS:VHOST[+VHOST...] to run, comma-separated (vhost / is led by worker 0, v1 by "
                             "worker 1; v1*: v1, its queue owned by the other worker)")
    args = parser.parse_args(argv)
    if args.messages <= 0 or args.messages % BATCH:
        parser.error(f"--messages must be a positive multiple of {BATCH}")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install -y valgrind)", file=sys.stderr)
        return 1
    results = {}
    for setup in dict.fromkeys(Setup.parse(text) for text in args.setups.split(",")):  # (each once)
        with tempfile.TemporaryDirectory(prefix="warren-instructions-") as workdir:
            results[setup] = count(setup, args.messages, Path(workdir))
    print_table(results, args.messages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
