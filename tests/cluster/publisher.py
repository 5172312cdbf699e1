"""A confirm-tracking publisher for the cluster tests and the cluster benchmark, run as a process of its own.

    python -m tests.cluster.publisher --nodes 127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 --queue NAME \\
        --body-size 16 --window 500 --out results.json [--progress PATH] \\
        [--count N | --until-file PATH] [--stall-timeout SECONDS] [--rate PER_SECOND]

It declares the durable queue, selects confirms and publishes persistent messages to the queue through the default
exchange. Each body is a unique id (0, 1, 2, ... in order; tests.cluster.ids) padded to --body-size, and at most
--window publishes are unconfirmed at once (with --rate, at most that many go out a second). When the connection
drops or the channel closes (or, with --stall-timeout, no confirm comes for that long), it tries the nodes
round-robin every 100 ms, declares again and republishes every id not yet confirmed under the same id, as a client
of a failing-over cluster must. Nacked ids are republished too.

It stops once --count ids are confirmed, once --until-file exists, or on SIGTERM/SIGINT, after waiting up to 5 s
for the confirms of what it sent; then it writes --out (Publisher.result). Every 200 ms it rewrites the progress
file (default: --out with the suffix .progress.json), so that a test can wait for confirms without sleeping
blindly. A test starts one with start_publisher().

The result also tells when confirms came: every pause between two confirms longer than GAP_RECORDED ("gaps"), and
for each connection where it went, when it was ready and when its first and last confirms came ("connections"), so
that a test can say which confirms a node gave after a moment of its own (time.time() throughout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import uvloop

from tests import waiting
from tests.cluster.ids import ID, to_ranges
from warrenperf.client import BenchConnection, BrokerClosed, BrokerURL, message_frames

RETRY_INTERVAL = 0.1  # seconds between connection attempts while no node takes one
CONNECT_TIMEOUT = 2.0  # longest a connection attempt (handshake, declare, confirm.select) or a close may take
TICK = 0.2  # seconds between progress writes (and checks of the until-file and of a stall)
STOP_GRACE = 5.0  # longest a stop waits for the confirms of what was sent
BATCH = 100  # most messages written at once
GAP_RECORDED = 0.2  # seconds without a confirm that the result's "gaps" records
PROGRESS_GAPS = 20  # the latest gaps the progress file repeats, for a check made while the publisher runs
CONNECTION_ERRORS = (BrokerClosed, OSError, TimeoutError)  # what makes the publisher give a connection up


def log(text: str) -> None:
    print(f"publisher: {text}", file=sys.stderr, flush=True)


def write_json(path: Path, value: object) -> None:
    """Replace the file in one step, so that a reader never sees half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def node_address(node: Any) -> str:
    """'host:port' of a node given as that string or as anything with .host and .port (a test's broker)."""
    return node if isinstance(node, str) else f"{node.host}:{node.port}"


def broker_url(address: str) -> BrokerURL:
    host, port = address.rsplit(":", 1)
    return BrokerURL(host, int(port), "guest", "guest", "/")


@dataclass
class Loss:
    """A connection the publisher gave up."""

    node: str  # the node it was connected to
    reason: str
    at: float  # time.time() when the publisher noticed (at once for a reset, after --stall-timeout for a hang)
    since: float  # time.monotonic() of the same moment
    reconnected: float | None = None  # seconds until the next connection was ready to publish
    gap: float | None = None  # seconds until the first confirm after it: the failover gap

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "at": self.at, "reconnected": self.reconnected,
                "gap": self.gap}


@dataclass
class Link:
    """One connection that was ready to publish, and the confirms that came on it."""

    node: str  # the node it was made to (which may have forwarded it to the leader)
    opened_at: float  # time.time() when it was ready to publish
    first_confirm_at: float | None = None  # time.time() of its first confirm
    last_confirm_at: float | None = None  # and of its latest
    confirmed: int = 0  # ids confirmed on it

    def acked(self, count: int, at: float) -> None:
        if self.first_confirm_at is None:
            self.first_confirm_at = at
        self.last_confirm_at = at
        self.confirmed += count

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "opened_at": self.opened_at, "first_confirm_at": self.first_confirm_at,
                "last_confirm_at": self.last_confirm_at, "confirmed": self.confirmed}


class Ledger:
    """Which ids were sent and which confirmed, over every connection of a run."""

    def __init__(self, count: int | None) -> None:
        self.count = count  # ids to publish (0 .. count - 1), or None for no end
        self.next_id = 0  # every id below it was published at least once
        self.confirmed = bytearray()  # confirmed[i] is 1 once id i is confirmed
        self.confirmed_count = 0
        self.retry: deque[int] = deque()  # ids to publish again: unconfirmed at a loss, or nacked
        self.publishes = 0  # basic.publish sent, republishes included
        self.republished = 0  # publishes of an id that was sent before
        self.nacks = 0
        self.last_confirm = 0.0  # time.monotonic() of the latest confirm
        self.last_confirm_at: float | None = None  # time.time() of the same, None before the first
        self.losses: list[Loss] = []
        self._unanswered: list[Loss] = []  # losses that no confirm has followed yet
        self.links: list[Link] = []  # every connection that was ready to publish, in order
        self.gaps: list[tuple[float, float]] = []  # (time.time() of a confirm, seconds to the next) over GAP_RECORDED

    @property
    def done(self) -> bool:
        return self.confirmed_count == self.count

    def take(self, limit: int) -> list[int]:
        """Up to `limit` ids to publish next: those to republish first, then fresh ones."""
        retry = self.retry
        ids = [retry.popleft() for _ in range(min(limit, len(retry)))]
        self.republished += len(ids)
        fresh = limit - len(ids)
        if self.count is not None:
            fresh = min(fresh, self.count - self.next_id)
        if fresh > 0:
            ids.extend(range(self.next_id, self.next_id + fresh))
            self.next_id += fresh
            self.confirmed.extend(bytes(fresh))
        self.publishes += len(ids)
        return ids

    def acked(self, ids: list[int]) -> float:
        """Record a confirm of ``ids``; its time.time()."""
        confirmed = self.confirmed
        for id_ in ids:
            confirmed[id_] = 1
        self.confirmed_count += len(ids)
        now = time.monotonic()
        if self.last_confirm_at is not None and now - self.last_confirm > GAP_RECORDED:
            self.gaps.append((self.last_confirm_at, now - self.last_confirm))
        self.last_confirm = now
        self.last_confirm_at = at = time.time()
        if self._unanswered:
            for loss in self._unanswered:
                loss.gap = self.last_confirm - loss.since
            self._unanswered.clear()
        return at

    def nacked(self, ids: list[int]) -> None:
        self.nacks += len(ids)
        self.retry.extend(ids)

    def lost(self, loss: Loss, unconfirmed: Iterable[int]) -> None:
        """A connection was given up with these ids unconfirmed: they go to the front of the line, in id order."""
        self.losses.append(loss)
        self._unanswered.append(loss)
        self.retry = deque(sorted([*self.retry, *unconfirmed]))

    def reconnected(self, node: str) -> Link:
        """A connection to ``node`` is ready to publish: its Link."""
        now = time.monotonic()
        for loss in self._unanswered:
            if loss.reconnected is None:
                loss.reconnected = now - loss.since
        self.links.append(Link(node, time.time()))
        return self.links[-1]


class Outstanding:
    """The unconfirmed publishes of one channel. BenchConnection hands it the broker's acks and nacks and its
    failure, as it does to its own ConfirmTracker (on_confirm, fail)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.link: Link | None = None  # the connection's record, once it is ready to publish
        self.pending: dict[int, int] = {}  # delivery tag -> id, for every publish neither acked nor nacked
        self.next_tag = 1  # the delivery tag of the next publish
        self.lowest = 1  # no pending tag is below it
        self.last_progress = time.monotonic()  # of the latest confirm, or of the first publish when none was pending
        self.error: BrokerClosed | None = None  # the first reason the channel failed
        self._waiter: asyncio.Future[None] | None = None  # resolved at the next confirm, nack, wake() or failure

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, ids: list[int]) -> None:
        if not self.pending:
            self.last_progress = time.monotonic()
        tag = self.next_tag
        self.pending.update(zip(range(tag, tag + len(ids)), ids))
        self.next_tag = tag + len(ids)

    def on_confirm(self, delivery_tag: int, multiple: bool, acked: bool) -> None:
        pop = self.pending.pop
        if multiple:
            ids = [id_ for tag in range(self.lowest, delivery_tag + 1) if (id_ := pop(tag, None)) is not None]
            self.lowest = delivery_tag + 1
        else:
            ids = [pop(delivery_tag)]
        self.last_progress = time.monotonic()
        if acked:
            at = self.ledger.acked(ids)
            if self.link is not None:
                self.link.acked(len(ids), at)
        else:
            self.ledger.nacked(ids)
        self.wake()

    def fail(self, error: BrokerClosed) -> None:
        if self.error is None:
            self.error = error
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self.error)

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def changed(self) -> None:
        """Return at the next confirm, nack or wake(); raise once the channel has failed."""
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter


class Session:
    """A connection to one node with its confirm-mode channel, the queue declared: ready to publish."""

    def __init__(self, node: str, connection: BenchConnection, channel: int, outstanding: Outstanding, queue: str,
                 body_size: int) -> None:
        self.node = node
        self.connection = connection
        self.outstanding = outstanding
        template = message_frames(channel, "", queue, bytes(body_size), persistent=True)
        self._head = template[:-1 - body_size]  # the publish, the content header and the body frame's header
        self._tail = template[len(template) - 1 - body_size + ID.size:]  # the body's padding and the frame end

    @classmethod
    async def open(cls, node: str, ledger: Ledger, queue: str, body_size: int) -> Session:
        connection = await BenchConnection.open(broker_url(node))
        try:
            channel = await connection.open_channel()
            await connection.declare_queue(channel, queue, durable=True)
            outstanding = Outstanding(ledger)
            await connection.select_confirms(channel, outstanding)
        except BaseException:
            connection.transport.abort()
            raise
        return cls(node, connection, channel, outstanding, queue, body_size)

    async def publish(self, ids: list[int]) -> None:
        head, tail, pack = self._head, self._tail, ID.pack
        data = b"".join([head + pack(id_) + tail for id_ in ids])
        self.outstanding.add(ids)
        await self.connection.send(data)

    def abort(self) -> None:
        self.connection.transport.abort()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.connection.close(), CONNECT_TIMEOUT)
        except CONNECTION_ERRORS:
            self.abort()


class Publisher:
    """Publishes ids through whichever node takes a connection until told to stop; see the module's doc."""

    def __init__(self, nodes: Sequence[str], queue: str, body_size: int, window: int, count: int | None = None,
                 until_file: Path | None = None, progress: Path | None = None, stall_timeout: float = 0.0,
                 rate: float = 0.0) -> None:
        self.nodes = list(nodes)  # 'host:port' of every node
        self.queue = queue
        self.body_size = body_size
        self.window = window  # most publishes unconfirmed at once
        self.until_file = until_file  # stop once this path exists
        self.progress = progress  # the progress file, rewritten every TICK
        self.stall_timeout = stall_timeout  # give a connection up after this long without a confirm (0: never)
        self.rate = rate  # most publishes a second (0: as many as the window allows)
        self._tokens = 0.0  # publishes the rate allows now (at most a window's worth saved up)
        self._refilled = time.monotonic()  # when _tokens was last brought up to date
        self.ledger = Ledger(count)
        self.session: Session | None = None  # the connection in use, while there is one
        self.stopped_by: str | None = None  # "count", "until-file" or "signal", once stopping
        self._stopping = asyncio.Event()  # set with stopped_by, to cut a pause between attempts short
        self._next_node = 0  # index (modulo the node count) of the node the next attempt tries
        self._started: float | None = None  # time.monotonic() when the first connection was ready
        self._cpu_at_start = 0.0  # time.process_time() at the same moment

    async def run(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, "signal")
        ticker = asyncio.create_task(self._tick())
        try:
            while self.stopped_by is None and (session := await self._connect()) is not None:
                await self._use(session)
        finally:
            ticker.cancel()
        self._write_progress()
        return self.result()

    def stop(self, reason: str) -> None:
        if self.stopped_by is None:
            self.stopped_by = reason
            self._stopping.set()
        if self.session is not None:
            self.session.outstanding.wake()

    async def _connect(self) -> Session | None:
        """A session on the next node that takes one, trying them round-robin every RETRY_INTERVAL; None once
        stopping."""
        attempts = 0
        while self.stopped_by is None:
            node = self.nodes[self._next_node % len(self.nodes)]
            self._next_node += 1
            attempts += 1
            try:
                session = await asyncio.wait_for(Session.open(node, self.ledger, self.queue, self.body_size),
                                                 CONNECT_TIMEOUT)
            except CONNECTION_ERRORS:
                await self._pause(RETRY_INTERVAL)
                continue
            session.outstanding.link = self.ledger.reconnected(node)
            if self._started is None:
                self._started, self._cpu_at_start = time.monotonic(), time.process_time()
            if self.ledger.losses:
                log(f"connected to {node} after {attempts} attempt(s)")
            return session
        return None

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _use(self, session: Session) -> None:
        """Publish on the session until stopping, then let it settle and close it; or give it up when it fails."""
        self.session = session
        try:
            await self._publish(session)
            await self._settle(session)
        except CONNECTION_ERRORS as error:
            self._lose(session, session.outstanding.error or error)
        else:
            await session.close()
        finally:
            self.session = None

    async def _publish(self, session: Session) -> None:
        outstanding = session.outstanding
        while self.stopped_by is None:
            if self.ledger.done:
                self.stop("count")
                return
            room = min(self.window - len(outstanding), BATCH)
            ids = self.ledger.take(min(room, self._allowed()) if self.rate else room)
            if ids:
                self._tokens -= len(ids)
                await session.publish(ids)
            elif room > 0 and self.rate:  # held back by the rate: until it allows the room (a batch at most) to go,
                with contextlib.suppress(TimeoutError):  # a confirm comes, or the connection fails
                    await asyncio.wait_for(outstanding.changed(), (room - self._tokens) / self.rate)
            else:
                await outstanding.changed()

    def _allowed(self) -> int:
        """Publishes the rate allows now."""
        now = time.monotonic()
        self._tokens = min(float(self.window), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        return int(self._tokens)

    async def _settle(self, session: Session) -> None:
        """Wait up to STOP_GRACE for the confirms of what was sent."""
        deadline = time.monotonic() + STOP_GRACE
        while len(session.outstanding) and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.outstanding.changed(), left)

    def _lose(self, session: Session, error: Exception) -> None:
        session.abort()
        loss = Loss(session.node, str(error) or type(error).__name__, time.time(), time.monotonic())
        log(f"lost {session.node} ({loss.reason}); {len(session.outstanding)} unconfirmed to republish")
        self.ledger.lost(loss, session.outstanding.pending.values())

    async def _tick(self) -> None:
        while True:
            self._write_progress()
            if self.until_file is not None and self.until_file.exists():
                self.stop("until-file")
            self._check_stall()
            await asyncio.sleep(TICK)

    def _check_stall(self) -> None:
        session = self.session
        if self.stall_timeout and session is not None and len(session.outstanding) \
                and time.monotonic() - session.outstanding.last_progress > self.stall_timeout:
            session.outstanding.fail(BrokerClosed(f"no confirm for {self.stall_timeout} s"))
            session.abort()

    def _write_progress(self) -> None:
        if self.progress is None:
            return
        ledger = self.ledger
        write_json(self.progress, {
            "confirmed": ledger.confirmed_count,
            "last_confirm_at": ledger.last_confirm_at,  # time.time() of the latest confirm
            "gaps": ledger.gaps[-PROGRESS_GAPS:],  # the latest pauses between confirms, as the result's "gaps"
            "ids_published": ledger.next_id,
            "losses": len(ledger.losses),
            "node": None if self.session is None else self.session.node,  # where it publishes now
            "written_at": time.time(),  # so that a reader can wait for figures taken after a moment of its own
        })

    def result(self) -> dict[str, Any]:
        """What --out holds."""
        ledger = self.ledger
        seconds = ledger.last_confirm - self._started if ledger.confirmed_count else 0.0
        return {
            "queue": self.queue,
            "nodes": self.nodes,
            "body_size": self.body_size,
            "window": self.window,
            "stopped_by": self.stopped_by,
            "confirmed": to_ranges(id_ for id_, flag in enumerate(ledger.confirmed) if flag),  # [start, stop) runs
            "confirmed_count": ledger.confirmed_count,
            "ids_published": ledger.next_id,  # ids 0 .. ids_published - 1 were each sent at least once
            "publishes": ledger.publishes,  # ids_published + republished
            "republished": ledger.republished,
            "nacks": ledger.nacks,
            "connection_losses": len(ledger.losses),
            "losses": [loss.as_json() for loss in ledger.losses],
            "failover_gaps": [loss.gap for loss in ledger.losses if loss.gap is not None],
            "seconds": seconds,  # from the first connection to the last confirm, failovers included
            "confirms_per_second": ledger.confirmed_count / seconds if seconds else 0.0,
            "cpu_seconds": time.process_time() - self._cpu_at_start,  # the publisher's own, from the first connection
            "gaps": ledger.gaps,  # [time.time() of a confirm, seconds until the next] for pauses over GAP_RECORDED
            "connections": [link.as_json() for link in ledger.links],  # each connection ready to publish, in order
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.publisher", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, help="host:port of each node, comma-separated")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--body-size", type=int, default=16, help=f"body bytes, at least {ID.size} (the id)")
    parser.add_argument("--window", type=int, default=500, help="most publishes unconfirmed at once")
    parser.add_argument("--out", type=Path, required=True, help="the result, written as JSON at the end")
    parser.add_argument("--progress", type=Path, help="rewritten every 200 ms (default: beside --out)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="most publishes a second, republishes included (0: as many as the window allows)")
    parser.add_argument("--stall-timeout", type=float, default=0.0,
                        help="give a connection up when unconfirmed publishes get no confirm for this long (0: never)")
    end = parser.add_mutually_exclusive_group()
    end.add_argument("--count", type=int, help="stop once ids 0 .. COUNT - 1 are all confirmed")
    end.add_argument("--until-file", type=Path, help="stop once this file exists")
    args = parser.parse_args(argv)
    if not ID.size <= args.body_size <= 131072 - 8:
        parser.error(f"--body-size must be from {ID.size} to 131064 (one body frame)")
    if args.window < 1:
        parser.error("--window must be at least 1")
    args.progress = args.progress or args.out.with_suffix(".progress.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    publisher = Publisher(args.nodes.split(","), args.queue, args.body_size, args.window, args.count,
                          args.until_file, args.progress, args.stall_timeout, args.rate)
    write_json(args.out, uvloop.run(publisher.run()))


# --- driving the publisher from a test -------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL = 0.05  # seconds between reads of the progress file while a test waits on it


@dataclass
class ProcessHandle:
    """A client process of the cluster tests started by launch(): it rewrites a progress file as it runs and
    writes its result when it stops (this publisher, tests.cluster.consumer)."""

    process: subprocess.Popen
    out: Path  # its result, once it has stopped
    progress_path: Path
    log_path: Path  # its stderr
    role: ClassVar[str] = "the process"  # how failures name it

    def progress(self) -> dict[str, Any]:
        """The latest progress; {} before the first."""
        try:
            return json.loads(self.progress_path.read_text())
        except FileNotFoundError:
            return {}

    def wait_for(self, condition: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The first progress that satisfies `condition`; fails if the process exits first or time runs out."""
        def satisfied(progress: dict[str, Any]) -> bool:
            if progress and condition(progress):
                return True
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.role} exited with {self.process.returncode} first:\n{self.log()}")
            return False
        try:
            return waiting.wait_for(self.progress, timeout, f"{self.role}'s progress", POLL, until=satisfied)
        except AssertionError as error:
            raise TimeoutError(f"{error}\n{self.log()}") from None

    def wait(self, timeout: float = 60.0) -> dict[str, Any]:
        """The result, once the process stops of its own accord (say, its until-file)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.role} still runs after {timeout} s: {self.progress()}") from None
        if code != 0:
            raise RuntimeError(f"{self.role} exited with {code}:\n{self.log()}")
        return json.loads(self.out.read_text())

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """SIGTERM: the process winds up, writes its result and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: no result is written."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


Handle = TypeVar("Handle", bound=ProcessHandle)


def launch(handle_type: type[Handle], module: str, arguments: list[str], out_dir: Path | str) -> Handle:
    """Start `python -m MODULE ARGUMENTS --out OUT --progress PROGRESS` with its files in `out_dir` (one directory
    per process): results.json, progress.json and its stderr in MODULE's last name + .log."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out, progress = out_dir / "results.json", out_dir / "progress.json"
    log_path = out_dir / f"{module.rsplit('.', 1)[-1]}.log"
    for stale in (out, progress):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", module, *arguments, "--out", str(out), "--progress", str(progress)]
    with open(log_path, "wb") as stderr:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=stderr)
    return handle_type(process, out, progress, log_path)


class PublisherHandle(ProcessHandle):
    """A publisher process started by start_publisher(); its progress holds confirmed, last_confirm_at,
    ids_published, losses and node. stop() waits for its last confirms (up to 5 s) before it writes its result."""

    role = "the publisher"

    @property
    def confirmed(self) -> int:
        return self.progress().get("confirmed", 0)

    def wait_confirmed(self, n: int, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until `n` ids in all are confirmed (for n more: handle.confirmed + n); returns the progress."""
        return self.wait_for(lambda progress: progress["confirmed"] >= n, timeout)


def start_publisher(nodes: Sequence[Any], queue: str, body_size: int, window: int, out_dir: Path | str, *,
                    count: int | None = None, until_file: Path | None = None,
                    stall_timeout: float = 0.0, rate: float = 0.0) -> PublisherHandle:
    """Start `python -m tests.cluster.publisher` with its files in `out_dir` (one directory per publisher).

    `nodes` are 'host:port' strings or objects with .host and .port. Without `count` or `until_file` it publishes
    until handle.stop()."""
    arguments = ["--nodes", ",".join(map(node_address, nodes)), "--queue", queue, "--body-size", str(body_size),
                 "--window", str(window), "--stall-timeout", str(stall_timeout), "--rate", str(rate)]
    if count is not None:
        arguments += ["--count", str(count)]
    if until_file is not None:
        arguments += ["--until-file", str(until_file)]
    return launch(PublisherHandle, "tests.cluster.publisher", arguments, out_dir)


if __name__ == "__main__":
    main()
