"""Micro-benchmark of the message store alone: throughput with callbacks, lone-append latency, recovery time.

Run: .venv/bin/python -m tests.bench.storage_bench [--messages 1000000] [--skip-large]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import tempfile
import time
from pathlib import Path

from storage.store import MessageStore

HEADER = b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x10\x00\x02"  # a plausible content header: persistent, no props


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def windowed_appends(data_dir: Path, count: int, window: int, body: bytes) -> dict:
    """Append ``count`` messages, each with its own callback, keeping at most ``window`` unconfirmed."""
    loop = asyncio.get_running_loop()
    store = MessageStore(data_dir)
    store.recover()
    room = asyncio.Event()
    outstanding = 0
    latencies: list[float] = []
    finished = loop.create_future()
    confirmed = 0

    def confirm_at(started: float):
        def confirmed_callback(ok: bool) -> None:
            nonlocal outstanding, confirmed
            outstanding -= 1
            confirmed += 1
            latencies.append(time.perf_counter() - started)
            if outstanding < window:
                room.set()
            if confirmed == count:
                finished.set_result(None)
        return confirmed_callback

    started = time.perf_counter()
    for msg_id in range(count):
        while outstanding >= window:
            room.clear()
            await room.wait()
        store.append_message(msg_id, ("bench",), "", "bench", HEADER, body)
        store.when_durable(confirm_at(time.perf_counter()))
        outstanding += 1
        if msg_id % 256 == 255:
            await asyncio.sleep(0)
    await finished
    elapsed = time.perf_counter() - started
    stats = store.stats()
    store.close()
    latencies.sort()
    return {
        "msgs_per_s": count / elapsed,
        "fsyncs_per_s": stats["fsyncs"] / elapsed,
        "batches": stats["batches"],
        "msgs_per_batch": count / max(stats["batches"], 1),
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
    }


async def fill(data_dir: Path, count: int, body: bytes) -> dict:
    """Append ``count`` messages as fast as group commit allows; report the store's memory per queued message."""
    gc.collect()
    before = rss_bytes()
    store = MessageStore(data_dir)
    store.recover()
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    for msg_id in range(count):
        store.append_message(msg_id, ("bench",), "", "bench", HEADER, body)
        if msg_id % 5000 == 4999:
            done = loop.create_future()
            store.when_durable(done.set_result)
            await done
    done = loop.create_future()
    store.when_durable(done.set_result)
    await done
    elapsed = time.perf_counter() - started
    gc.collect()
    stats = store.stats()
    grown = rss_bytes() - before
    store.close()
    return {
        "append_msgs_per_s": count / elapsed,
        "index_bytes_per_msg": stats["index_bytes"] / count,
        "process_growth_bytes_per_msg": grown / count,
        "disk_bytes": stats["bytes_on_disk"],
        "segments": stats["segments"],
    }


def recover(data_dir: Path) -> dict:
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    store = MessageStore(data_dir)
    recovered = store.recover()
    elapsed = time.perf_counter() - started
    messages = sum(len(queue) for queue in recovered.messages.values())
    grown = rss_bytes() - before
    store.close()
    return {"seconds": elapsed, "messages": messages, "bytes_per_recovered_msg": grown / max(messages, 1),
            "report": recovered.report}


def show(title: str, figures: dict) -> None:
    parts = [f"{key}={value:,.1f}" if isinstance(value, float) else f"{key}={value}" for key, value in figures.items()]
    print(f"{title}: " + ", ".join(parts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--skip-large", action="store_true", help="skip the 1 KiB recovery run")
    parser.add_argument("--dir", default=None, help="where to put the data (default: a temporary dir)")
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="warren-store-bench-", dir=options.dir))
    try:
        for window in (1000, 1):
            count = 100_000 if window > 1 else 5_000
            data_dir = base / f"window-{window}"
            show(f"window {window}, 16 B, {count} msgs", asyncio.run(windowed_appends(data_dir, count, window, b"x" * 16)))
            shutil.rmtree(data_dir)
        sizes = [16] if options.skip_large else [16, 1024]
        for size in sizes:
            data_dir = base / f"recover-{size}"
            show(f"fill {options.messages} x {size} B", asyncio.run(fill(data_dir, options.messages, b"y" * size)))
            result = recover(data_dir)
            report = result.pop("report")
            show(f"recover {options.messages} x {size} B", result)
            show("  report", report)
            shutil.rmtree(data_dir)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
