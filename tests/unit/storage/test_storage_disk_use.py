"""Disk use stays bounded by what is queued plus a few segments while publishers keep the writer busy without a
pause: spent segments are deleted, and compactions keep up, however fast messages are appended and removed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from storage import compaction
from storage.segments import messages_directory
from storage.store import MessageStore

SEGMENT = 1 << 20
SLICE = SEGMENT // 16  # compaction slices in the same proportion to segments as with the defaults (16 MiB, 1 MiB)
BODY = b"x" * (4 << 10)
WINDOW = 32  # publishes awaiting their callback: each batch holds an eighth of a segment, as in a busy broker
MAX_QUEUED = 32  # the consumer is this many messages behind the publisher
COUNT = 16 * SEGMENT // len(BODY)  # sixteen segments' worth
SLICE_SECONDS = 0.003  # a rewrite's slice takes longer than the loop needs to hand over the next batch


@pytest.fixture
def slow_rewrites(monkeypatch):
    monkeypatch.setattr(compaction, "SLICE_BYTES", SLICE)
    steps = compaction.Compaction.steps

    def slow_steps(job):
        for handled in steps(job):
            time.sleep(SLICE_SECONDS)
            yield handled

    monkeypatch.setattr(compaction.Compaction, "steps", slow_steps)


def disk_bytes(data_dir: Path) -> int:
    """What the message files hold, rewrites in progress included."""
    total = 0
    with os.scandir(messages_directory(data_dir)) as entries:
        for entry in entries:
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # deleted, or renamed over, while listed
                pass
    return total


async def steady_run(store: MessageStore, data_dir: Path, park_every: int) -> tuple[list[int], int]:
    """Publish COUNT messages to "steady", topping the window up as soon as callbacks come back; deliver each at
    once and remove each once MAX_QUEUED newer ones were published. With park_every, one in that many also goes to
    "parked", which nobody consumes. Return the disk use sampled once per batch, and the number parked."""
    room = asyncio.Event()
    unconfirmed = 0

    def confirmed(ok: bool) -> None:
        nonlocal unconfirmed
        assert ok
        unconfirmed -= 1
        room.set()

    queued: list[int] = []
    samples = []
    msg_id = parked = 0
    for number in range(COUNT):
        if unconfirmed >= WINDOW:
            samples.append(disk_bytes(data_dir))
            room.clear()
            await room.wait()
        if park_every and number % park_every == 0:
            store.append_message(msg_id, ("parked",), "", "parked", b"h", BODY)
            msg_id += 1
            parked += 1
        store.append_message(msg_id, ("steady",), "", "steady", b"h", BODY)
        store.append_delivered("steady", [msg_id])
        store.when_durable(confirmed)
        unconfirmed += 1
        queued.append(msg_id)
        msg_id += 1
        if len(queued) > MAX_QUEUED:
            store.append_removed("steady", queued[:-MAX_QUEUED])
            del queued[:-MAX_QUEUED]
    store.append_removed("steady", queued)
    return samples, parked


@pytest.mark.parametrize("park_every", [0, 64], ids=["all-consumed", "some-parked-in-every-segment"])
def test_disk_use_stays_bounded_while_publishers_keep_the_writer_busy(tmp_path, slow_rewrites, park_every):
    async def main() -> tuple[list[int], int, dict]:
        store = MessageStore(tmp_path, segment_bytes=SEGMENT, min_compact_bytes=SLICE)
        store.recover()
        samples, parked = await steady_run(store, tmp_path, park_every)
        done = asyncio.get_running_loop().create_future()
        store.when_durable(done.set_result)
        assert await done
        stats = store.stats()
        store.close()
        return samples, parked, stats

    samples, parked, stats = asyncio.run(main())
    record = len(BODY) + 64  # a publish record, framing and metadata included
    queued_at_most = (MAX_QUEUED + WINDOW + parked) * record
    assert stats["live_messages"] == parked
    # what is queued, the head segment, the one being consumed and a compaction's copy; not what was published
    assert max(samples) <= queued_at_most + 3 * SEGMENT, [round(sample / SEGMENT, 1) for sample in samples]
