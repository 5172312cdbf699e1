"""Message ids that do not increase (two stores once wrote one data dir) never stop a start: every message stays
readable, the ones out of order get fresh ids, and the next start finds the same state."""

from __future__ import annotations

import asyncio
import logging

from storage import records
from storage.segments import messages_directory, segment_path
from storage.store import MessageStore
from tests.unit.storage.storage_support import reopen


def publish(msg_id: int, queues: tuple[str, ...], body: bytes) -> bytes:
    return records.publish_head(msg_id, queues, "", "q", b"h", body) + b"h" + body


def test_two_stores_on_one_data_dir_leave_every_message_readable(tmp_path, caplog):
    """The segment two brokers appended to at once: both numbered their messages from 0."""
    first = [publish(msg_id, ("q",), b"first-%d" % msg_id) for msg_id in range(5)]
    second = [publish(msg_id, ("q", "r"), b"second-%d" % msg_id) for msg_id in range(3)]
    segment = segment_path(messages_directory(tmp_path), 0)
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"".join(first[:3] + second[:1] + first[3:] + [records.id_list(records.REMOVED, "q", [0])]
                                 + second[1:]))
    with caplog.at_level(logging.ERROR, logger="storage.recovery"):
        recovered = reopen(tmp_path)
    assert "ids that do not increase" in caplog.text
    queue_q = [(message.msg_id, message.body) for message in recovered.messages["q"]]
    assert queue_q == [(1, b"first-1"), (2, b"first-2"), (3, b"first-3"), (4, b"first-4"),
                       (5, b"second-0"), (6, b"second-1"), (7, b"second-2")]
    assert [message.body for message in recovered.messages["r"]] == [b"second-0", b"second-1", b"second-2"]
    assert recovered.report["rehomed_messages"] == 3
    assert recovered.next_msg_id == 8

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.recovery"):
        again = reopen(tmp_path)
    assert [(m.msg_id, m.body) for m in again.messages["q"]] == queue_q
    assert again.report["rehomed_messages"] == 0 and not caplog.records

    async def go_on() -> None:  # the store works normally from there: acks of the new ids stick
        store = MessageStore(tmp_path)
        store.recover()
        store.append_removed("q", [6])
        store.append_message(8, ("q",), "", "q", b"h", b"later")
        store.close()

    asyncio.run(go_on())
    assert [m.body for m in reopen(tmp_path).messages["q"]][-3:] == [b"second-0", b"second-2", b"later"]
