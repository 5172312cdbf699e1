"""A damaged data dir: a byte flipped at the head, middle or tail of a closed segment, the last segment and the
definitions log. Only the damaged record is lost; every other message and definition comes back with its body; the
damaged bytes are kept in ``quarantine/``; the next start meets no damage again. A torn tail is still cut."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
from pathlib import Path

import pika
import pytest

from storage import records
from storage.segments import messages_directory, segment_numbers, segment_path
from storage.store import MessageStore
from tests.integration.helpers import connect, enqueue, get_all, segment_written_last

MESSAGES = 60
QUEUES = 12
SEGMENT_BYTES = 4000  # about 15 messages of BODY_SIZE per segment: several segments


def body_of(msg_id: int) -> bytes:
    return b"%05d" % msg_id + bytes([65 + msg_id % 26]) * 200


def populate(data_dir: Path) -> None:
    async def main() -> None:
        store = MessageStore(data_dir, segment_bytes=SEGMENT_BYTES)
        store.recover()
        for number in range(QUEUES):
            store.append_definition("queue", f"/|q{number}", {"name": f"q{number}", "arguments": {"n": number}})
        for msg_id in range(1, MESSAGES + 1):
            store.append_message(msg_id, (f"/|q{msg_id % 2}",), "", f"q{msg_id % 2}", b"header", body_of(msg_id))
        store.close()

    asyncio.run(main())


def reopen(data_dir: Path):
    store = MessageStore(data_dir, segment_bytes=SEGMENT_BYTES)
    recovered = store.recover()
    store.close()
    return recovered


def stored(recovered) -> dict[int, bytes]:
    return {message.msg_id: message.body for queue in recovered.messages.values() for message in queue}


def target_file(data_dir: Path, kind: str) -> Path:
    if kind == "definitions.log":
        return data_dir / "definitions.log"
    directory = messages_directory(data_dir)
    numbers = segment_numbers(directory)
    assert len(numbers) >= 3
    return segment_path(directory, numbers[0] if kind == "closed segment" else numbers[-1])


def record_around(data: bytes, offset: int) -> tuple[int, int, memoryview]:
    return next((start, end, payload) for start, end, payload in records.scan(data) if start <= offset < end)


POSITIONS = {"head": lambda size: 1, "middle": lambda size: size // 2, "tail": lambda size: size - 2}


@pytest.mark.parametrize("position", list(POSITIONS))
@pytest.mark.parametrize("kind", ["closed segment", "last segment", "definitions.log"])
def test_a_flipped_byte_loses_only_its_record(tmp_path, caplog, kind, position):
    populate(tmp_path)
    path = target_file(tmp_path, kind)
    data = bytearray(path.read_bytes())
    offset = POSITIONS[position](len(data))
    start, end, payload = record_around(bytes(data), offset)
    if kind == "definitions.log":
        lost_queue = records.decode_definition(payload)[1]
    else:
        lost_id = records.decode_publish(payload).msg_id
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        recovered = reopen(tmp_path)

    all_queues = [f"/|q{number}" for number in range(QUEUES)]
    if kind == "definitions.log":
        assert [f"/|{queue['name']}" for queue in recovered.queues] == [q for q in all_queues if q != lost_queue]
        assert stored(recovered) == {msg_id: body_of(msg_id) for msg_id in range(1, MESSAGES + 1)}
    else:
        assert len(recovered.queues) == QUEUES
        assert stored(recovered) == {msg_id: body_of(msg_id) for msg_id in range(1, MESSAGES + 1) if msg_id != lost_id}
    assert (tmp_path / "quarantine" / f"{path.name}@{start}").read_bytes() == bytes(data[start:end])
    assert recovered.report["quarantined_bytes"] == end - start
    torn = position == "tail" and kind != "closed segment"
    if torn:  # the damage ends at the end of a file still being written: a torn tail
        assert recovered.report["torn_tail_bytes"] == end - start and recovered.report["corrupt_ranges"] == 0
        assert "torn tail" in caplog.text
    else:
        assert recovered.report["corrupt_ranges"] == 1 and recovered.report["torn_tail_bytes"] == 0
        [error] = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
        assert str(path) in error and f"offset {start}" in error and f"{end - start} bytes" in error

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        again = reopen(tmp_path)
    assert stored(again) == stored(recovered) and again.queues == recovered.queues
    assert again.report["quarantined_bytes"] == 0 and not caplog.records


def test_a_record_cut_short_at_the_end_is_still_cut_and_kept(tmp_path, caplog):
    populate(tmp_path)
    path = target_file(tmp_path, "last segment")
    data = path.read_bytes()
    start, end, payload = record_around(data, len(data) - 1)
    path.write_bytes(data[:end - 50])
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        recovered = reopen(tmp_path)
    assert recovered.report["torn_tail_bytes"] == end - 50 - start
    assert path.stat().st_size == start
    assert (tmp_path / "quarantine" / f"{path.name}@{start}").read_bytes() == data[start:end - 50]
    assert len(stored(recovered)) == MESSAGES - 1
    assert "truncating" in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_megabyte_of_random_bytes_inside_the_last_segment_costs_nothing_around_it(tmp_path):
    populate(tmp_path)
    path = target_file(tmp_path, "last segment")
    data = path.read_bytes()
    start, _, _ = record_around(data, len(data) // 2)
    noise = random.Random(7).randbytes(1 << 20)
    path.write_bytes(data[:start] + noise + data[start:])
    recovered = reopen(tmp_path)
    assert stored(recovered) == {msg_id: body_of(msg_id) for msg_id in range(1, MESSAGES + 1)}
    assert recovered.report["quarantined_bytes"] == len(noise) and recovered.report["corrupt_ranges"] == 1


@pytest.mark.parametrize("where", ["closed", "last"])
def test_a_segment_of_16_mib_of_random_bytes_is_read_past_quickly(tmp_path, where):
    """Finding the next record must not cost a CRC over megabytes at every offset."""
    populate(tmp_path)
    directory = messages_directory(tmp_path)
    numbers = segment_numbers(directory)
    noise = random.Random(16).randbytes(16 << 20)
    if where == "closed":  # the random segment sits between intact ones
        shutil.move(segment_path(directory, numbers[-1]), segment_path(directory, numbers[-1] + 1))
        segment_path(directory, numbers[-1]).write_bytes(noise)
    else:
        segment_path(directory, numbers[-1] + 1).write_bytes(noise)
    recovered = reopen(tmp_path)
    assert stored(recovered) == {msg_id: body_of(msg_id) for msg_id in range(1, MESSAGES + 1)}
    assert recovered.report["quarantined_bytes"] == len(noise)
    assert recovered.report["seconds"] < 5  # typically a few tenths: a loose bound for a loaded machine


# --- through a real broker ---------------------------------------------------------------------------------------
def test_the_broker_starts_and_serves_after_a_flipped_byte_in_its_last_segment(own_broker):
    broker = own_broker()
    bodies = [b"%04d" % number + b"." * 300 for number in range(300)]
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare("kept", durable=True)
        enqueue(conn, "kept", bodies, properties=pika.BasicProperties(delivery_mode=2))
    broker.stop()

    path = segment_written_last(broker.data_dir)  # (in the store of the worker that owns the queue)
    data = bytearray(path.read_bytes())
    start, end, payload = record_around(bytes(data), len(data) // 2)
    lost = records.decode_publish(payload).body
    data[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    broker.start()
    with connect(broker) as conn:
        assert get_all(conn.channel(), "kept") == [body for body in bodies if body != lost]
    assert f"corrupt record at offset {start}" in broker.log()
    assert (path.parent.parent / "quarantine" / f"{path.name}@{start}").exists()  # (that store's own)


def test_damaged_bytes_that_cannot_be_quarantined_stay_where_they_are(tmp_path, caplog):
    populate(tmp_path)
    path = target_file(tmp_path, "closed segment")
    data = bytearray(path.read_bytes())
    start, end, payload = record_around(bytes(data), len(data) // 2)
    lost_id = records.decode_publish(payload).msg_id
    data[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    (tmp_path / "quarantine").write_text("a file where the directory belongs")
    for _ in range(2):  # the damage is read past at every start, and nothing else is lost
        with caplog.at_level(logging.ERROR, logger="storage"):
            recovered = reopen(tmp_path)
        assert stored(recovered) == {msg_id: body_of(msg_id) for msg_id in range(1, MESSAGES + 1) if msg_id != lost_id}
        assert path.read_bytes() == bytes(data)
        assert "cannot keep" in caplog.text
