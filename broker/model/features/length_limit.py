"""Queue length limits: x-max-length and x-max-length-bytes over a queue's ready messages, with x-overflow
drop-head (the head makes room: the oldest, or in a priority queue the next to be delivered, as RabbitMQ 3.10) or reject-publish (the new one is refused), as RabbitMQ applies them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Iterable

from broker.model.message import Message, QueueEntry

if TYPE_CHECKING:
    from broker.model.features.ready import ReadyList

# What Queue.enqueue reports.
ENQUEUED: Final = 0
ENQUEUED_OVER_FLOW_LIMIT: Final = 1  # kept; the queue's backlog asks its publishers to wait (flow control)
REFUSED: Final = 2  # reject-publish: not kept, the publisher gets a nack
DROPPED: Final = 3  # drop-head with no room even for this message alone: not kept, yet the publish is confirmed
APPENDED: Final = 4  # a stream's log took it (no limit applies there); its confirm waits for the log's write


class LengthLimit:
    def __init__(self, max_length: int | None, max_bytes: int | None, overflow: str):
        self.max_length = max_length  # most ready messages kept, None = no limit
        self.max_bytes = max_bytes  # most body bytes of ready messages kept, None = no limit
        self.drop_head = overflow == "drop-head"  # else reject-publish (and reject-publish-dlx)
        self.dead_letter_refused = overflow == "reject-publish-dlx"  # refused messages are also dead-lettered
        self.ready_bytes = 0  # body bytes of the queue's ready messages

    @classmethod
    def from_settings(cls, settings: dict) -> "LengthLimit | None":
        """From a queue's settings (policy keys: max-length, max-length-bytes, overflow)."""
        max_length = settings.get("max-length")
        max_bytes = settings.get("max-length-bytes")
        if max_length is None and max_bytes is None:
            return None
        return cls(max_length, max_bytes, settings.get("overflow", "drop-head"))

    @classmethod
    def from_arguments(cls, arguments: dict) -> "LengthLimit | None":
        """From a queue's x-arguments alone."""
        return cls.from_settings({name[2:]: value for name, value in arguments.items() if name.startswith("x-")})

    def _over(self, count: int, size: int) -> bool:
        return ((self.max_length is not None and count > self.max_length)
                or (self.max_bytes is not None and size > self.max_bytes))

    def admit(self, entries: "ReadyList", message: Message) -> tuple[int, list[QueueEntry]]:
        """Whether message may join entries, and the head entries dropped to make room for it."""
        size = len(message.body)
        if not self._over(len(entries) + 1, self.ready_bytes + size):
            self.ready_bytes += size
            return ENQUEUED, []
        if not self.drop_head:
            return REFUSED, []
        if self._over(1, size):
            return DROPPED, []
        dropped = []
        while entries and self._over(len(entries) + 1, self.ready_bytes + size):
            dropped.append(self.removed(entries.popleft()))
        self.ready_bytes += size
        return ENQUEUED, dropped

    def removed(self, entry: QueueEntry) -> QueueEntry:
        self.ready_bytes -= len(entry.message.body)
        return entry

    def returned(self, entries: Iterable[QueueEntry]) -> None:
        """Requeued entries count again."""
        self.ready_bytes += sum(len(entry.message.body) for entry in entries)

    def trim(self, entries: "ReadyList") -> list[QueueEntry]:
        """After a requeue: drop-head queues drop their oldest messages until they are within the limit again."""
        dropped = []
        if self.drop_head:
            while entries and self._over(len(entries), self.ready_bytes):
                dropped.append(self.removed(entries.popleft()))
        return dropped

    def cleared(self) -> None:
        self.ready_bytes = 0
