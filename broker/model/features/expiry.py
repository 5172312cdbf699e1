"""Message TTL (x-message-ttl, the expiration property) and queue TTL (x-expires), in whole milliseconds; and the
ready list of a queue whose messages expire where they are (not only at the head, as RabbitMQ's classic queues)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from broker.model.message import Message, QueueEntry
from protocol import errors

if TYPE_CHECKING:
    from broker.model.features.ready import ReadyList

MAX_EXPIRY_MS = 315360000000  # RabbitMQ's upper bound for TTLs: ten years in milliseconds


def parse_expiration(text: str) -> int:
    """A message's expiration property as milliseconds, with RabbitMQ's errors for what is not one."""
    try:
        value = int(text, 10)
    except ValueError:
        raise errors.precondition_failed(f"invalid expiration '{text}': no_integer") from None
    if value < 0:
        raise errors.precondition_failed(f"invalid expiration '{text}': {{value_negative,{value}}}")
    if value > MAX_EXPIRY_MS:
        raise errors.precondition_failed(f"invalid expiration '{text}': {{value_too_large,{value}}}")
    return value


def message_ttl(queue_ttl: int | None, message: Message) -> int | None:
    """The TTL that applies to message in a queue: the shorter of the queue's and the message's own."""
    expiration = message.header.scan.expiration
    if expiration is None:
        return queue_ttl
    own = parse_expiration(expiration)
    return own if queue_ttl is None else min(own, queue_ttl)


# Where an entry with a TTL is, for its expiry (QueueEntry.place): only an entry still waiting in the ready list
# expires in place.
READY = 0  # waiting in its queue's ready list
TAKEN = 1  # out of the ready list: delivered, waiting for a retry, or gone
BURIED = 2  # expired while in the ready list: dead-lettered already, skipped when the list reaches it


class ExpiringEntries:
    """The ready list of a queue that has held messages with a TTL: the queue's own structure (FIFO or by priority)
    with expired entries left in place as tombstones (no scan to remove them), skipped and let go when they reach
    the head. Only such queues pay for it: a queue switches to it on its first message with a TTL."""

    __slots__ = ("inner", "buried")

    def __init__(self, inner):
        self.inner = inner  # the FifoEntries or PriorityEntries holding live entries and tombstones
        self.buried = 0  # tombstones in inner

    def __len__(self) -> int:
        return len(self.inner) - self.buried

    def __bool__(self) -> bool:
        return len(self.inner) > self.buried

    def __iter__(self) -> Iterator[QueueEntry]:
        return (entry for entry in self.inner if entry.place != BURIED)

    def append(self, entry: QueueEntry) -> None:
        self.inner.append(entry)

    def popleft(self) -> QueueEntry:
        inner = self.inner
        while True:
            entry = inner.popleft()
            if entry.place != BURIED:
                entry.place = TAKEN
                return entry
            self.buried -= 1

    def put_back(self, requeued: list[QueueEntry]) -> None:
        for entry in requeued:
            entry.place = READY
        self.inner.put_back(requeued)

    def take_all(self) -> tuple[ExpiringEntries, ReadyList]:
        """Everything at once (see features.ready). The entries are not marked: the queue drops their expiry times
        with them (Queue.purge), so that no timer acts on one (marking millions held the event loop)."""
        self.inner, taken = self.inner.take_all()
        self.buried = 0
        return self, taken

    def bury(self, entry: QueueEntry) -> None:
        """entry expired in place: it stays in the list, without its message, until the head reaches it (at once if
        it is the head, as in a queue whose messages all have one TTL and so expire from the head)."""
        entry.place = BURIED
        entry.message = None
        self.buried += 1
        inner = self.inner
        while inner and inner[0].place == BURIED:
            inner.popleft()
            self.buried -= 1
