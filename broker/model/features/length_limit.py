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
    """The limit a queue's settings set; the queue counts its ready messages' bytes (Queue.ready_bytes) and passes
    them in."""

    def __init__(self, max_length: int | None, max_bytes: int | None, overflow: str):
        self.max_length = max_length  # most ready messages kept, None = no limit
        self.max_bytes = max_bytes  # most body bytes of ready messages kept, None = no limit
        self.drop_head = overflow == "drop-head"  # else reject-publish (and reject-publish-dlx)
        self.dead_letter_refused = overflow == "reject-publish-dlx"  # refused messages are also dead-lettered

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

    def admit(self, entries: "ReadyList", ready_bytes: int, message: Message) -> tuple[int, list[QueueEntry]]:
        """Whether message may join entries (holding ready_bytes of bodies), and the head entries dropped to make
        room for it."""
        size = len(message.body)
        if not self._over(len(entries) + 1, ready_bytes + size):
            return ENQUEUED, []
        if not self.drop_head:
            return REFUSED, []
        if self._over(1, size):
            return DROPPED, []
        return ENQUEUED, self._drop_head(entries, ready_bytes, 1, size, len(entries))

    def over(self, entries: "ReadyList", ready_bytes: int) -> bool:
        """Whether a drop-head queue holds more than its limit (a requeue, or a lower limit, took it there)."""
        return self.drop_head and self._over(len(entries), ready_bytes)

    def trim(self, entries: "ReadyList", ready_bytes: int, most: int) -> list[QueueEntry]:
        """The oldest messages of a drop-head queue over its limit, dropped until it is within it again: `most` at a
        time (a lower limit on a queue of millions drops them over loop turns)."""
        return self._drop_head(entries, ready_bytes, 0, 0, most) if self.drop_head else []

    def _drop_head(self, entries: "ReadyList", ready_bytes: int, more: int, more_bytes: int,
                   most: int) -> list[QueueEntry]:
        """The head entries dropped (`most` at most) until entries, holding ready_bytes, and `more` messages of
        `more_bytes` besides are within the limit."""
        dropped: list[QueueEntry] = []
        while len(dropped) < most and entries and self._over(len(entries) + more, ready_bytes + more_bytes):
            entry = entries.popleft()
            ready_bytes -= body_bytes((entry,))
            dropped.append(entry)
        return dropped


def body_bytes(entries: Iterable[QueueEntry]) -> int:
    """The body bytes of entries' messages (an expired entry has none left)."""
    return sum(len(entry.message.body) for entry in entries if entry.message is not None)
