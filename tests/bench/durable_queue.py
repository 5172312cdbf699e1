"""One large durable queue on a Warren: publish rate, memory and disk per message, recovery time, drain rate.

    python -m tests.bench.durable_queue [--messages 1000000] [--size 1024] [--window 1000] [--timeout 3600]
                                        [--in-memory N] [--baseline-messages M] [--no-restarts]

Starts a Warren on a temporary data dir, fills one durable queue with persistent messages under publisher confirms,
reads the broker's RSS before and after, restarts it after a SIGTERM and again after a SIGKILL (timing each
recovery and checking that every message is back), drains the queue with a manual-ack consumer, and prints a table.
--in-memory sets the broker's queue_messages_in_memory (past which a queue pages); --baseline-messages then also
fills and drains M messages on a second Warren that keeps them all in memory, for the drain rate to compare with.
Traffic goes to 127.0.0.1 only; the temporary directory is removed at the end, also on failure or timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import uvloop
from pamqp import commands, frame

from tests.bench.brokers import REPO_ROOT, BrokerUnavailable, RunningBroker, _wait_until_ready
from tests.bench.scenarios import _publish_confirmed
from tests.conftest import free_port
from warrenperf.client import BenchConnection, BrokerURL, ConfirmTracker, DeliveryCounter, message_frames
from warrenperf.process_memory import resident_kib

QUEUE = "bench-durable-queue"
CONFIG_FILE = "warren.toml"  # written beside the data dir when --in-memory is given
PREFETCH = 1000  # basic.qos prefetch_count of the draining consumer
ACK_EVERY = 100  # the consumer sends one multiple ack per this many deliveries
PORT_POLL_SECONDS = 0.01  # a starting process gives no event to await: its port is polled this often
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"  # asctime in the broker's log format

# Start-up lines of the broker's log (it runs at --log-level info so that they are written).
_LINE_START = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO "
STORE_RECOVERED = re.compile(_LINE_START + r"storage\.store: recovered (\d+) messages, (\d+) records, (\d+) bytes "
                                           r"in ([\d.]+) s", re.MULTILINE)
VHOST_RESTORED = re.compile(_LINE_START + r"broker\.model\.durability: vhost '/': .* (\d+) messages restored", re.MULTILINE)
LISTENING = re.compile(_LINE_START + r"broker\.connection\.server: Warren .* listening on", re.MULTILINE)


class BenchFailed(Exception):
    """The broker misbehaved (lost messages, did not start...): the message says how."""


@dataclass
class Restart:
    """How one start on an existing data dir went."""

    port_seconds: float  # from Popen to the port accepting a TCP connection
    boot_seconds: float  # from Popen to the store starting to read (interpreter start and imports)
    store_seconds: float  # the store's own figure for reading the log back
    restore_seconds: float  # from the store's log line to the vhost's (rebuilding the queues)
    listen_seconds: float  # from the vhost's log line to the listening one
    store_messages: int  # messages the store says it recovered
    restored_messages: int  # messages the vhost says it put back in queues
    queued: int  # message count of a passive queue.declare afterwards
    rss_kib: int  # broker RSS once it accepts connections


# --- the broker process ---------------------------------------------------------------------------------------


def start_warren(data_dir: Path, log: Path, seconds: float) -> tuple[RunningBroker, float]:
    """Start a Warren on `data_dir` (with the config file beside it, if any); returns it and the seconds from process
    start to its port accepting."""
    port = free_port()
    started = time.monotonic()
    config = data_dir.parent / CONFIG_FILE
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
             "--log-level", "info", "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0",
             *(["--config", str(config)] if config.exists() else [])],
            cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = started + seconds
    while not _accepts(port):
        if process.poll() is not None or time.monotonic() > deadline:
            RunningBroker("Warren", port, process, process.pid).stop()
            raise BrokerUnavailable(f"Warren did not listen within {seconds:.0f} s (exit code {process.returncode}): "
                                    f"{log.read_text(errors='replace')[-500:]}")
        time.sleep(PORT_POLL_SECONDS)
    accepting = time.monotonic() - started
    return _wait_until_ready("Warren", process, port, log, max(deadline - time.monotonic(), 1.0)), accepting


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def stop_gracefully(broker: RunningBroker) -> tuple[float, int]:
    """SIGTERM (SIGKILL after a grace period); returns the seconds it took and the exit code (-9: it was killed)."""
    started = time.monotonic()
    broker.stop()
    return time.monotonic() - started, broker.process.returncode


def kill(broker: RunningBroker) -> None:
    broker.process.kill()
    broker.process.wait()


def start_timeline(log: Path, popen_wall_time: float, port_seconds: float) -> dict[str, float | int]:
    """The recovery figures the broker logs, as seconds measured from its process start."""
    text = log.read_text(errors="replace")
    recovered, restored, listening = (pattern.search(text) for pattern in (STORE_RECOVERED, VHOST_RESTORED, LISTENING))
    if not (recovered and restored and listening):
        raise BenchFailed(f"start-up lines missing from {log}: {text[-500:]}")
    recovered_at, restored_at, listening_at = (datetime.strptime(match[1], LOG_TIME).timestamp()
                                               for match in (recovered, restored, listening))
    store_seconds = float(recovered[5])
    return {"port_seconds": port_seconds, "boot_seconds": recovered_at - store_seconds - popen_wall_time,
            "store_seconds": store_seconds, "restore_seconds": restored_at - recovered_at,
            "listen_seconds": listening_at - restored_at, "store_messages": int(recovered[2]),
            "restored_messages": int(restored[2])}


def restart(data_dir: Path, log: Path, seconds: float) -> tuple[RunningBroker, Restart]:
    popen_wall_time = time.time()
    broker, port_seconds = start_warren(data_dir, log, seconds)
    timeline = start_timeline(log, popen_wall_time, port_seconds)
    rss = resident_kib(broker.pid)
    queued = run(queue_length(BrokerURL.parse(broker.url)), seconds)
    return broker, Restart(**timeline, queued=queued, rss_kib=rss)


def disk_bytes(directory: Path) -> int:
    """Bytes allocated on disk to the files under `directory`."""
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


# --- AMQP phases ----------------------------------------------------------------------------------------------


def run(phase, seconds: float):
    """Run one async phase on a fresh uvloop loop, bounded by `seconds`."""
    return uvloop.run(asyncio.wait_for(phase, timeout=max(seconds, 1.0)))


async def fill(url: BrokerURL, broker_pid: int, messages: int, size: int, window: int,
               deadline: float) -> dict[str, float | int]:
    """Declare the durable queue and publish `messages` persistent messages with `window` unconfirmed at most."""
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    await connection.declare_queue(channel, QUEUE, durable=True)
    tracker = ConfirmTracker(window=window, record_latency=False)
    await connection.select_confirms(channel, tracker)
    message = message_frames(channel, "", QUEUE, b"x" * size, persistent=True)
    rss_before = resident_kib(broker_pid)
    start = time.perf_counter()
    await _publish_confirmed(connection, channel, message, tracker, deadline=deadline, count=messages)
    elapsed = time.perf_counter() - start
    rss_after = resident_kib(broker_pid)
    queued = await connection.declare_queue(channel, QUEUE, passive=True)
    await connection.close()
    if tracker.confirmed != messages or tracker.nacked:
        raise BenchFailed(f"{tracker.confirmed:,} of {messages:,} publishes confirmed, {tracker.nacked:,} nacked")
    return {"seconds": elapsed, "rss_before_kib": rss_before, "rss_after_kib": rss_after, "queued": queued}


async def queue_length(url: BrokerURL) -> int:
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    queued = await connection.declare_queue(channel, QUEUE, passive=True)
    await connection.close()
    return queued


async def drain(url: BrokerURL, messages: int) -> float:
    """Consume `messages` with manual multiple acks; returns the seconds it took. The queue must end up empty."""
    connection = await BenchConnection.open(url)
    channel = await connection.open_channel()
    await connection.qos(channel, PREFETCH)
    counter = DeliveryCounter(channel, ack_every=ACK_EVERY, target=messages)
    start = time.perf_counter()
    await connection.consume(channel, QUEUE, counter, no_ack=False)
    await counter.reached
    elapsed = time.perf_counter() - start
    if messages % ACK_EVERY:  # the deliveries after the last multiple ack (tags run 1..messages on this channel)
        await connection.send(frame.marshal(commands.Basic.Ack(delivery_tag=messages, multiple=True), channel))
    await connection.close()  # a delivery left unacked would go back to the queue here
    left = await queue_length(url)
    if left:
        raise BenchFailed(f"{left:,} messages left in the queue after draining {messages:,}")
    return elapsed


# --- the run --------------------------------------------------------------------------------------------------


def write_config(workdir: Path, in_memory: int | None) -> None:
    if in_memory is not None:
        (workdir / CONFIG_FILE).write_text(f"[server]\nqueue_messages_in_memory = {in_memory}\n")


def measure(workdir: Path, messages: int, size: int, window: int, timeout: float, in_memory: int | None = None,
            baseline_messages: int = 0, restarts: bool = True) -> list[tuple[str, str]]:
    """Every phase in turn; returns the table's rows."""
    deadline = time.monotonic() + timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the run took longer than --timeout {timeout:.0f} s")
        return left

    data_dir = workdir / "data"
    write_config(workdir, in_memory)
    rows: list[tuple[str, str]] = []
    broker, _ = start_warren(data_dir, workdir / "warren-fill.log", remaining())
    try:
        url = BrokerURL.parse(broker.url)
        filled = run(fill(url, broker.pid, messages, size, window,
                          deadline=time.perf_counter() + remaining()), remaining())
        if filled["queued"] != messages:
            raise BenchFailed(f"{filled['queued']:,} of {messages:,} confirmed messages in the queue")
        growth = (filled["rss_after_kib"] - filled["rss_before_kib"]) * 1024
        on_disk = disk_bytes(data_dir)
        paged = disk_bytes(data_dir / "pages") if (data_dir / "pages").exists() else 0
        rows += [
            ("publish, confirmed",
             f"{messages / filled['seconds']:,.0f} msg/s ({filled['seconds']:,.1f} s)"),
            ("broker RSS before / after",
             f"{filled['rss_before_kib'] / 1024:,.1f} / {filled['rss_after_kib'] / 1024:,.1f} MiB"),
            ("RSS growth per queued message", f"{growth / messages:,.0f} B (payload {size:,} B)"),
            ("data dir on disk", f"{on_disk / 2**20:,.1f} MiB ({on_disk / messages:,.0f} B/message)"),
            ("  of which page files", f"{paged / 2**20:,.1f} MiB"),
        ]

        if restarts:
            stop_seconds, code = stop_gracefully(broker)
            rows.append(("SIGTERM stop", f"{stop_seconds:,.2f} s (exit code {code})"))
            broker, after_term = restart(data_dir, workdir / "warren-after-sigterm.log", remaining())
            rows += _restart_rows("after SIGTERM", after_term, messages, filled["rss_before_kib"])

            kill(broker)
            broker, after_kill = restart(data_dir, workdir / "warren-after-sigkill.log", remaining())
            rows += _restart_rows("after SIGKILL", after_kill, messages, filled["rss_before_kib"])

        drained = run(drain(BrokerURL.parse(broker.url), messages), remaining())
        rows.append((f"drain (prefetch {PREFETCH}, multiple ack per {ACK_EVERY})",
                     f"{messages / drained:,.0f} msg/s ({drained:,.1f} s)"))
        rows.append(("data dir on disk, drained", f"{disk_bytes(data_dir) / 2**20:,.1f} MiB"))
    finally:
        broker.stop()
    if baseline_messages:
        rate = in_memory_drain_rate(workdir / "baseline", baseline_messages, size, window, remaining)
        rows.append((f"baseline: {baseline_messages:,} messages kept in memory, drain",
                     f"{rate:,.0f} msg/s; the drain above is {messages / drained / rate:.2f}x that"))
    return rows


def in_memory_drain_rate(workdir: Path, messages: int, size: int, window: int, remaining) -> float:
    """Fill and drain a queue on a Warren that keeps every message in memory; the drain's msg/s."""
    workdir.mkdir()
    write_config(workdir, messages + 1)
    broker, _ = start_warren(workdir / "data", workdir / "warren.log", remaining())
    try:
        url = BrokerURL.parse(broker.url)
        run(fill(url, broker.pid, messages, size, window, deadline=time.perf_counter() + remaining()), remaining())
        return messages / run(drain(url, messages), remaining())
    finally:
        broker.stop()


def _restart_rows(label: str, figures: Restart, messages: int, empty_rss_kib: int) -> list[tuple[str, str]]:
    if figures.queued != messages or figures.restored_messages != messages:
        raise BenchFailed(f"{label}: {figures.restored_messages:,} messages restored, {figures.queued:,} queued; "
                          f"{messages:,} expected")
    return [
        (f"restart {label}: port accepting", f"{figures.port_seconds:,.2f} s from process start"),
        ("  interpreter start, imports", f"{figures.boot_seconds:,.2f} s"),
        ("  store recovery (its log)", f"{figures.store_seconds:,.2f} s for {figures.store_messages:,} messages"),
        ("  queues rebuilt (log times)", f"{figures.restore_seconds:,.2f} s, {figures.restored_messages:,} messages"),
        ("  then listening (log times)", f"{figures.listen_seconds:,.2f} s"),
        ("  RSS after recovery", (f"{figures.rss_kib / 1024:,.1f} MiB, "
                                  f"{(figures.rss_kib - empty_rss_kib) * 1024 / messages:,.0f} B/message over the "
                                  "empty broker's")),
        ("  passive queue.declare", f"{figures.queued:,} messages"),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.durable_queue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="persistent messages to queue")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per message")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed publishes allowed at once")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole run may take")
    parser.add_argument("--in-memory", type=int, help="the broker's queue_messages_in_memory (default: its own)")
    parser.add_argument("--no-restarts", dest="restarts", action="store_false",
                        help="drain without restarting the broker first")
    parser.add_argument("--baseline-messages", type=int, default=0,
                        help="also drain this many messages kept in memory, to compare (0 = no)")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.size < 0 or args.window < 1:
        parser.error("--messages and --window must be positive, --size not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="warren-durable-queue-"))
    try:
        rows = measure(workdir, args.messages, args.size, args.window, args.timeout, args.in_memory,
                       args.baseline_messages, args.restarts)
    except (BenchFailed, BrokerUnavailable, TimeoutError) as error:
        print(f"durable_queue: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Warren, one durable queue: {args.messages:,} persistent messages of {args.size:,} B "
          f"with confirms, window {args.window:,}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
