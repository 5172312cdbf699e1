"""A channel's unacked deliveries (LavinMQ's unacked_store): delivery tags in order, the deliveries an ack, nack or
reject names (one tag, or every tag up to one with `multiple`), and the prefetch counts they hold: per consumer
(on the consumer, which its credit reads) and channel-wide (basic.qos global)."""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Final, Iterable, Iterator

from broker import collector
from protocol import errors

CHUNK: Final = 65_536  # deliveries a chunk of a channel's unacked ones holds at most

if TYPE_CHECKING:
    from broker.model.message import QueueEntry
    from broker.model.queue import Queue
    from broker.session.consumer import Consumer


class Unacked:
    """A delivery awaiting ack: where it came from and who got it. (A class of its own: a named tuple is made by a
    generated Python function, half a microsecond a delivery.)"""

    __slots__ = ("tag", "entry", "queue", "consumer")

    def __init__(self, tag: int, entry: QueueEntry, queue: Queue, consumer: Consumer | None) -> None:
        self.tag = tag
        self.entry = entry
        self.queue = queue
        self.consumer = consumer  # None for basic.get


class UnackedStore:
    """The deliveries in tag order, in chunks of at most CHUNK: one hash table of millions grows by copying itself
    whole (118 ms on the event loop at 2.8 million here, and half a second in a busy broker), a chunk's at most
    a few milliseconds."""

    __slots__ = ("chunks", "count", "consumer_count", "global_prefetch", "reopened")

    def __init__(self) -> None:
        self.chunks: deque[OrderedDict[int, Unacked]] = deque()  # delivery tag -> unacked delivery, tag order
        self.count = 0  # deliveries in every chunk
        self.consumer_count = 0  # unacked deliveries made to consumers (what the global limit counts)
        self.global_prefetch = 0  # channel-wide limit of unacked consumer deliveries (basic.qos global), 0 = none
        # consumer deliveries were settled while the channel-wide limit was reached: every queue the channel consumes
        # from may deliver again (else only those of the settled deliveries)
        self.reopened = False

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[int]:
        """The delivery tags, in order."""
        for chunk in self.chunks:
            yield from chunk

    def items_from(self, tag: int) -> Iterator[tuple[int, Unacked]]:
        """(tag, delivery) in tag order from ``tag`` on (the chunks before it skipped whole; a rollback's fresh
        chunk may be empty)."""
        for chunk in self.chunks:
            if chunk and next(reversed(chunk)) >= tag:
                for item in chunk.items():
                    if item[0] >= tag:
                        yield item

    def first_tag(self) -> int:
        """The oldest unacked delivery's tag (there is one)."""
        return next(iter(self.chunks[0]))

    def push(self, delivery: Unacked) -> None:
        """A delivery was sent (with a tag above every other); a consumer's takes one of its prefetch slots and one
        of the channel's."""
        chunks = self.chunks
        if not chunks or len(chunks[-1]) >= CHUNK:
            chunks.append(OrderedDict())
        chunks[-1][delivery.tag] = delivery
        self.count += 1
        counted(delivery, 1)
        consumer = delivery.consumer
        if consumer is not None:
            consumer.unacked += 1
            self.consumer_count += 1

    def _chunk_of(self, tag: int) -> OrderedDict[int, Unacked] | None:
        for chunk in self.chunks:
            if tag in chunk:
                return chunk
        return None

    def _remove(self, chunk: OrderedDict[int, Unacked], tag: int) -> Unacked:
        delivery = chunk.pop(tag)
        self.count -= 1
        if not chunk:
            chunks = self.chunks
            for index in range(len(chunks)):
                if chunks[index] is chunk:
                    del chunks[index]
                    break
        counted(delivery, -1)
        return delivery

    def pop(self, tag: int) -> Unacked:
        """Remove the delivery a single ack names, releasing its prefetch slots (the common case, in one step)."""
        chunk = self._chunk_of(tag)
        if chunk is None:
            raise errors.precondition_failed(f"unknown delivery tag {tag}")
        delivery = self._remove(chunk, tag)
        consumer = delivery.consumer
        if consumer is not None:
            self.reopened = self.reopened or 0 < self.global_prefetch <= self.consumer_count
            consumer.unacked -= 1
            self.consumer_count -= 1
        return delivery

    def take(self, tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the deliveries an ack/nack/reject names (RabbitMQ's collect_acks); their prefetch
        slots stay taken until release()."""
        if multiple and tag == 0:
            return self.take_up_to(next(reversed(self.chunks[-1])), self.count) if self.count else []
        chunk = self._chunk_of(tag)
        if chunk is None:
            raise errors.precondition_failed(f"unknown delivery tag {tag}")
        if not multiple:
            return [self._remove(chunk, tag)]
        return self.take_up_to(tag, self.count)

    def holds(self, tag: int) -> bool:
        return self._chunk_of(tag) is not None

    def holds_up_to(self, tag: int) -> bool:
        """Whether a delivery with a tag up to ``tag`` is still unacked."""
        return self.count > 0 and self.first_tag() <= tag

    def take_up_to(self, tag: int, most: int) -> list[Unacked]:
        """Remove and return the first deliveries with tags up to ``tag``, at most ``most`` of them (a multiple ack
        of millions is taken a slice at a time); their prefetch slots stay taken until release()."""
        chunks = self.chunks
        taken: list[Unacked] = []
        while chunks and len(taken) < most:
            chunk = chunks[0]
            if next(iter(chunk)) > tag:
                break
            delivery = chunk.popitem(last=False)[1]
            if not chunk:
                chunks.popleft()
            counted(delivery, -1)
            taken.append(delivery)
        self.count -= len(taken)
        return taken

    def release(self, taken: list[Unacked]) -> None:
        """Taken deliveries are settled: their consumers' prefetch windows open up again."""
        self.reopened = self.reopened or 0 < self.global_prefetch <= self.consumer_count
        for delivery in taken:
            consumer = delivery.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.consumer_count -= 1

    def put_back(self, taken: Iterable[list[Unacked]], most: int) -> Iterator[None]:
        """Taken deliveries are unacked again (a rollback undid their acks), in tag order among the others, in steps
        of about ``most`` deliveries (the generator yields after each): the taken ones are sorted a slice at a time,
        then merged with the chunks they fall among; a chunk with none among its tags is kept as it is. Deliveries
        made meanwhile go after them (the store's last chunk is left alone, a fresh one takes them); none is acked
        meanwhile (the channel holds its client's frames)."""
        runs: list[list[Unacked]] = []  # the taken deliveries, sorted a slice at a time
        run: list[Unacked] = []
        count = 0  # taken deliveries
        for deliveries in taken:
            run += deliveries
            if len(run) >= most:
                count += _sorted_run(run, runs)
                run = []
                yield
        count += _sorted_run(run, runs)
        restored: Iterator[Unacked] = iter(runs[0]) if len(runs) == 1 else heapq.merge(*runs, key=_tag_of)
        waiting = next(restored, None)  # the next taken delivery to put back
        chunks = self.chunks
        before = list(chunks)  # the chunks the taken deliveries go among; new deliveries go after them
        chunks.append(OrderedDict())
        built: list[OrderedDict[int, Unacked]] = []  # what replaces `before`
        filling: OrderedDict[int, Unacked] | None = None  # the chunk of `built` being filled
        moved = 0  # deliveries placed in `built`
        for chunk in before:
            if waiting is None or waiting.tag > next(reversed(chunk)):
                built.append(chunk)  # none of them among its tags
                filling = None
                continue
            for tag, delivery in chunk.items():
                while waiting is not None and waiting.tag < tag:
                    filling = _placed(waiting, filling, built)
                    waiting = next(restored, None)
                    moved += 1
                    if not moved % most:
                        yield
                filling = _placed(delivery, filling, built)
                moved += 1
                if not moved % most:
                    yield
        while waiting is not None:  # tags after every chunk's
            filling = _placed(waiting, filling, built)
            waiting = next(restored, None)
            moved += 1
            if not moved % most:
                yield
        made = [chunk for index, chunk in enumerate(chunks) if index >= len(before) and chunk]
        self.chunks = deque([*built, *made])
        self.count += count
        if moved >= CHUNK:
            # the chunks just built are young and full: the next young and middle collections would walk every
            # delivery in them (64 and 105 ms after a rollback of 4 million; chunks filled a delivery at a time grow
            # old while small)
            collector.freeze()


def _sorted_run(run: list[Unacked], runs: list[list[Unacked]]) -> int:
    """A slice of taken deliveries, counted by their queues again, joins runs sorted; how many."""
    for delivery in run:
        counted(delivery, 1)
    runs.append(sorted(run, key=_tag_of))
    return len(run)


def _placed(delivery: Unacked, filling: OrderedDict[int, Unacked] | None,
            built: list[OrderedDict[int, Unacked]]) -> OrderedDict[int, Unacked]:
    """delivery added to the chunk being filled, or to a new one at the end of built once that is full (or none
    is); the chunk it went to."""
    if filling is None or len(filling) >= CHUNK:
        filling = OrderedDict()
        built.append(filling)
    filling[delivery.tag] = delivery
    return filling


def _tag_of(delivery: Unacked) -> int:
    return delivery.tag


def counted(delivery: Unacked, sign: int) -> None:
    """The delivery's queue counts it among its unacked deliveries (sign 1), or no longer (-1)."""
    queue = delivery.queue
    queue.unacked_count += sign
    message = delivery.entry.message
    if message is not None:  # (it is: only an entry that expired in the ready list has none)
        queue.unacked_bytes += sign * len(message.body)
