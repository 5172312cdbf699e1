"""A consumer for the cluster tests that records every id it is delivered, run as a process of its own.

    python -m tests.cluster.consumer --nodes 127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 --queue NAME \\
        --out result.json [--progress PATH] [--until-file PATH] [--prefetch 500] [--ack-every 100]

It declares the durable queue (as tests.cluster.publisher does), sets basic.qos to --prefetch and consumes with
manual acks through any node. Each delivery's id (the first 8 bytes of its body, tests.cluster.ids) is recorded
before any ack covers it: one multiple ack every --ack-every deliveries, and one for what is left every 200 ms.
When the connection drops or the channel closes (a failover closes every connection), it tries the nodes
round-robin every 100 ms and consumes again; what was delivered and not acked comes back, so an id may be
recorded more than once.

It stops once --until-file exists, or on SIGTERM/SIGINT: it acks what it recorded, closes its connection and
writes --out (Consumer.result): the ids delivered as [start, stop) runs of distinct ids ("ids") plus one entry per
delivery beyond an id's first ("duplicates"), from which delivered_ids() gives back every count, and the
reconnections. Every 200 ms it rewrites the progress file (default: --out with the suffix .progress.json). A test
starts one with start_consumer(), and adds what it was delivered to a drain before checking it against what was
confirmed (tests.cluster.drain.with_consumed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop
from pamqp import commands, frame

from tests.cluster.ids import ID, to_ranges
from warrenperf.client import BenchConnection, BrokerClosed
from tests.cluster.publisher import (
    CONNECT_TIMEOUT,
    CONNECTION_ERRORS,
    RETRY_INTERVAL,
    TICK,
    ProcessHandle,
    broker_url,
    launch,
    node_address,
    write_json,
)

PREFETCH = 500  # deliveries unacked at once (basic.qos)
ACK_EVERY = 100  # deliveries per multiple ack


def log(text: str) -> None:
    print(f"consumer: {text}", file=sys.stderr, flush=True)


class Deliveries:
    """Every id delivered, over every connection of a run."""

    def __init__(self) -> None:
        self.seen = bytearray()  # seen[i] is 1 once id i was delivered (the publisher's ids are 0, 1, 2, ...)
        self.distinct = 0  # ids delivered at least once
        self.duplicates: list[int] = []  # an id once more for each delivery of it beyond the first

    @property
    def count(self) -> int:
        return self.distinct + len(self.duplicates)

    def record(self, id_: int) -> None:
        seen = self.seen
        if id_ >= len(seen):
            seen.extend(bytes(max(id_ + 1, 2 * len(seen)) - len(seen)))
        if seen[id_]:
            self.duplicates.append(id_)
        else:
            seen[id_] = 1
            self.distinct += 1


class Recorder:
    """One consuming channel, fed by BenchConnection as a DeliveryCounter is: a delivery's id is recorded when its
    body arrives (one body frame per message: bodies are at most a frame), and an ack covers only recorded ones."""

    reads_bodies = True  # BenchConnection hands each body frame to on_body

    def __init__(self, deliveries: Deliveries, connection: BenchConnection, channel: int, ack_every: int) -> None:
        self.deliveries = deliveries
        self.connection = connection
        self.channel = channel
        self.ack_every = ack_every
        self.delivery_tag = 0  # of the latest basic.deliver, whose body comes next
        self.recorded = 0  # the delivery tag of the latest delivery whose id is recorded
        self.acked = 0  # every delivery up to this tag is acked
        self.lost: asyncio.Future[BrokerClosed] = asyncio.get_running_loop().create_future()  # the channel's end

    def on_deliver(self, delivery_tag: int, outgoing: list[bytes]) -> None:
        self.delivery_tag = delivery_tag

    def on_body(self, body: bytearray, offset: int) -> None:
        self.deliveries.record(ID.unpack_from(body, offset)[0])
        self.recorded = self.delivery_tag
        if self.recorded - self.acked >= self.ack_every:
            self.ack()

    def ack(self) -> None:
        """One multiple ack of every delivery recorded and not acked yet."""
        transport = self.connection.transport
        if self.recorded > self.acked and not transport.is_closing():  # uvloop refuses a write once it closes
            transport.write(frame.marshal(commands.Basic.Ack(delivery_tag=self.recorded, multiple=True),
                                          self.channel))
            self.acked = self.recorded

    def fail(self, error: BrokerClosed) -> None:
        if not self.lost.done():
            self.lost.set_result(error)


class Consumer:
    """Consumes the queue through whichever node takes a connection until told to stop; see the module's doc."""

    def __init__(self, nodes: Sequence[str], queue: str, prefetch: int = PREFETCH, ack_every: int = ACK_EVERY,
                 until_file: Path | None = None, progress: Path | None = None) -> None:
        self.nodes = list(nodes)  # 'host:port' of every node
        self.queue = queue
        self.prefetch = prefetch
        self.ack_every = ack_every
        self.until_file = until_file  # stop once this path exists
        self.progress = progress  # the progress file, rewritten every TICK
        self.deliveries = Deliveries()
        self.connections = 0  # connections that began consuming
        self.losses: list[dict[str, Any]] = []  # each connection given up: node, reason, at (time.time())
        self.recorder: Recorder | None = None  # the channel consuming now, while there is one
        self.node: str | None = None  # the node it is connected to, while it is
        self.stopped_by: str | None = None  # "until-file" or "signal", once stopping
        self._stopping = asyncio.Event()  # set with stopped_by
        self._next_node = 0  # index (modulo the node count) of the node the next attempt tries

    async def run(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, "signal")
        ticker = asyncio.create_task(self._tick())
        try:
            while self.stopped_by is None and (node_recorder := await self._connect()) is not None:
                await self._use(*node_recorder)
        finally:
            ticker.cancel()
        self._write_progress()
        return self.result()

    def stop(self, reason: str) -> None:
        if self.stopped_by is None:
            self.stopped_by = reason
            self._stopping.set()

    async def _connect(self) -> tuple[str, Recorder] | None:
        """A consuming channel on the next node that takes one, trying them round-robin every RETRY_INTERVAL; None
        once stopping."""
        attempts = 0
        while self.stopped_by is None:
            node = self.nodes[self._next_node % len(self.nodes)]
            self._next_node += 1
            attempts += 1
            try:
                recorder = await asyncio.wait_for(self._subscribe(node), CONNECT_TIMEOUT)
            except CONNECTION_ERRORS:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RETRY_INTERVAL)
                continue
            self.connections += 1
            if self.losses:
                log(f"consuming from {node} after {attempts} attempt(s)")
            return node, recorder
        return None

    async def _subscribe(self, node: str) -> Recorder:
        connection = await BenchConnection.open(broker_url(node))
        try:
            channel = await connection.open_channel()
            await connection.declare_queue(channel, self.queue, durable=True)
            await connection.qos(channel, self.prefetch)
            recorder = Recorder(self.deliveries, connection, channel, self.ack_every)
            await connection.consume(channel, self.queue, recorder, no_ack=False)
        except BaseException:
            connection.transport.abort()
            raise
        return recorder

    async def _use(self, node: str, recorder: Recorder) -> None:
        """Consume until the channel fails (give the connection up) or stopping (ack what was recorded, close)."""
        self.node, self.recorder = node, recorder
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([recorder.lost, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            self.node, self.recorder = None, None
        if recorder.lost.done():
            recorder.connection.transport.abort()
            reason = str(recorder.lost.result())
            self.losses.append({"node": node, "reason": reason, "at": time.time()})
            log(f"lost {node} ({reason}); {recorder.delivery_tag - recorder.acked} delivered and not acked")
            return
        recorder.ack()
        try:  # the close-ok comes after the broker has handled the ack
            await asyncio.wait_for(recorder.connection.close(), CONNECT_TIMEOUT)
        except CONNECTION_ERRORS:
            recorder.connection.transport.abort()

    async def _tick(self) -> None:
        while True:
            if self.recorder is not None:
                self.recorder.ack()
            self._write_progress()
            if self.until_file is not None and self.until_file.exists():
                self.stop("until-file")
            await asyncio.sleep(TICK)

    def _write_progress(self) -> None:
        if self.progress is None:
            return
        write_json(self.progress, {
            "delivered": self.deliveries.count,
            "distinct": self.deliveries.distinct,
            "reconnections": max(0, self.connections - 1),
            "node": self.node,  # where it consumes now
            "written_at": time.time(),  # so that a reader can wait for figures taken after a moment of its own
        })

    def result(self) -> dict[str, Any]:
        """What --out holds."""
        deliveries = self.deliveries
        return {
            "queue": self.queue,
            "nodes": self.nodes,
            "prefetch": self.prefetch,
            "ack_every": self.ack_every,
            "stopped_by": self.stopped_by,
            "ids": to_ranges(id_ for id_, flag in enumerate(deliveries.seen) if flag),  # [start, stop) runs
            "duplicates": sorted(deliveries.duplicates),  # an id once more per delivery beyond its first
            "delivered": deliveries.count,
            "distinct": deliveries.distinct,
            "reconnections": max(0, self.connections - 1),  # connections that began consuming after the first
            "losses": self.losses,
        }


def delivered_ids(result: dict[str, Any]) -> Counter[int]:
    """id -> how many times it was delivered, from a consumer's result."""
    counts = Counter(id_ for start, stop in result["ids"] for id_ in range(start, stop))
    counts.update(result["duplicates"])
    return counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.consumer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, help="host:port of each node, comma-separated")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--out", type=Path, required=True, help="the result, written as JSON at the end")
    parser.add_argument("--progress", type=Path, help="rewritten every 200 ms (default: beside --out)")
    parser.add_argument("--until-file", type=Path, help="stop once this file exists")
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="deliveries unacked at once")
    parser.add_argument("--ack-every", type=int, default=ACK_EVERY, help="deliveries per multiple ack")
    args = parser.parse_args(argv)
    if not 1 <= args.ack_every <= args.prefetch:
        parser.error("--ack-every must be from 1 to --prefetch")
    args.progress = args.progress or args.out.with_suffix(".progress.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    consumer = Consumer(args.nodes.split(","), args.queue, args.prefetch, args.ack_every, args.until_file,
                        args.progress)
    write_json(args.out, uvloop.run(consumer.run()))


# --- driving the consumer from a test --------------------------------------------------------------------------

class ConsumerHandle(ProcessHandle):
    """A consumer process started by start_consumer(); its progress holds delivered, distinct, reconnections and
    node."""

    role = "the consumer"

    @property
    def delivered(self) -> int:
        return self.progress().get("delivered", 0)

    def wait_delivered(self, n: int, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until `n` deliveries in all were recorded (for n more: handle.delivered + n); returns the progress."""
        return self.wait_for(lambda progress: progress["delivered"] >= n, timeout)


def start_consumer(nodes: Sequence[Any], queue: str, out_dir: Path | str, *, until_file: Path | None = None,
                   prefetch: int = PREFETCH, ack_every: int = ACK_EVERY) -> ConsumerHandle:
    """Start `python -m tests.cluster.consumer` with its files in `out_dir` (one directory per consumer).

    `nodes` are 'host:port' strings or objects with .host and .port. Without `until_file` it consumes until
    handle.stop()."""
    arguments = ["--nodes", ",".join(map(node_address, nodes)), "--queue", queue, "--prefetch", str(prefetch),
                 "--ack-every", str(ack_every)]
    if until_file is not None:
        arguments += ["--until-file", str(until_file)]
    return launch(ConsumerHandle, "tests.cluster.consumer", arguments, out_dir)


if __name__ == "__main__":
    main()
