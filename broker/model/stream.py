"""A stream queue (x-queue-type=stream): an append-only log read by offset. Every consumer reads on its own from the
offset it asked for, reading never removes a message, and acks only give prefetch credit back; retention by size
or age drops the oldest segments (storage.streams keeps the log).

RabbitMQ's stream queues over AMQP 0-9-1 are the reference (3.10, with 3.13's settling of nack and reject)."""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Final

from broker.model.arguments.common import is_longstr, text_of
from broker.model.arguments.queue import age_ms, queue_resource
from broker.model.features.length_limit import APPENDED
from broker.model.message import Address, Header, Message, QueueEntry
from broker.model.queue import DISPATCH_BATCH, Queue
from protocol import errors
from protocol.erlang_terms import amqp_type_name, erlang_term
from protocol.properties import with_long_header

if TYPE_CHECKING:
    from broker.model.interfaces import QueueOwner, Subscriber
    from broker.model.vhost import VirtualHost

OFFSET_HEADER: Final = b"x-stream-offset"  # the header every delivery carries: the message's offset (a long)
DEFAULT_SEGMENT_BYTES: Final = 500_000_000  # RabbitMQ's default x-stream-max-segment-size-bytes
# basic.consume arguments of other queue types, which a stream refuses (RabbitMQ: "... of queue type
# rabbit_stream_queue") rather than ignore
OTHER_QUEUE_TYPES_CONSUME_ARGUMENTS = ("x-priority", "x-consumer-timeout", "x-delayed-retry-type", "x-delayed-retry-min",
                                       "x-delayed-retry-max", "x-cancel-on-ha-failover")
ADDRESSES_KEPT: Final = 1024  # (exchange, routing key) pairs whose Address a stream reuses for its deliveries


def _resource_of(queue: Queue) -> str:
    return queue_resource(queue.name, queue.vhost.name)


def get_refused(queue: Queue) -> errors.AMQPError:
    """RabbitMQ's answer to a basic.get of a stream (here, or owned by another process: broker.model.remote)."""
    return errors.not_implemented(f"basic.get not supported by stream queues {_resource_of(queue)}")


def purge_refused(queue: Queue) -> errors.AMQPError:
    return errors.not_implemented(f"queue.purge not supported by stream queues {_resource_of(queue)}")


def check_consume_arguments(queue: Queue, arguments: dict) -> None:
    """A stream takes x-stream-offset only among the consume arguments (RabbitMQ's text)."""
    for name in arguments:
        if name in OTHER_QUEUE_TYPES_CONSUME_ARGUMENTS:
            raise errors.precondition_failed(f"invalid arg '{name}' for {_resource_of(queue)} of queue type "
                                             "rabbit_stream_queue")


def offset_refused(queue: Queue, spec) -> errors.AMQPError:
    """RabbitMQ's text for an x-stream-offset it cannot read (3.10 crashes the channel with 541 on values of other
    types and on strings without a leading digit: Warren answers those alike)."""
    return errors.precondition_failed(f"invalid arg 'x-stream-offset' for {_resource_of(queue)}: "
                                      f"{{invalid_stream_offset_arg,{{{amqp_type_name(spec)},{erlang_term(spec)}}}}}")


def check_offset(queue: Queue, spec) -> None:
    """406 for an x-stream-offset that is none of those Stream._start_offset reads (a stream's owner reads it)."""
    readable = (text_of(spec) in ("first", "last", "next") or age_ms(text_of(spec)) is not None if is_longstr(spec)
                else isinstance(spec, (int, datetime.datetime)) and not isinstance(spec, bool))
    if not readable:
        raise offset_refused(queue, spec)


def check_consume(queue: Queue, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict) -> None:
    """RabbitMQ's order: the consume arguments (a stream takes x-stream-offset only, checked by its owner), the
    prefetch count, manual acks, no channel-wide prefetch."""
    check_consume_arguments(queue, arguments)
    resource = _resource_of(queue)
    if not prefetch:
        raise errors.precondition_failed(f"consumer prefetch count is not set for '{resource}'")
    if no_ack:
        raise errors.not_implemented(f"automatic acknowledgement not supported by stream queues {resource}")
    if global_prefetch:
        raise errors.not_implemented(f"{resource} does not support global qos")


class Stream(Queue):
    def __init__(self, vhost: "VirtualHost", name: str, durable: bool, exclusive_owner: "QueueOwner | None",
                 auto_delete: bool, arguments: dict, fresh: bool = True):
        if vhost.store is None:
            raise errors.not_implemented("stream queues need a data dir")
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments)
        self.queue_type = "stream"
        self.stored = False  # the message store keeps none of its messages: its own log does
        self.log = vhost.store.streams.open(self.store_key, self.segment_bytes, self.max_bytes, self.max_age_ms, fresh)
        self.log.on_readable = self._readable
        self.cursors: dict[Subscriber, int] = {}  # consumer -> the next offset it reads
        self._addresses: dict[tuple[str, str], Address] = {}  # reused for deliveries of the same exchange and key

    # --- settings ---------------------------------------------------------------------------------------------
    def _configure(self, settings: dict) -> None:
        arguments = self.arguments
        # retention by size: a policy's value wins over the argument for a stream (rabbit_stream_queue's
        # policy_precedence)
        self.max_bytes = self.effective_policy_definition().get("max-length-bytes",
                                                                  arguments.get("x-max-length-bytes"))
        max_age = arguments.get("x-max-age")
        self.max_age_ms = age_ms(text_of(max_age)) if max_age is not None else None  # retention by age
        self.segment_bytes = arguments.get("x-stream-max-segment-size-bytes", DEFAULT_SEGMENT_BYTES)
        log = getattr(self, "log", None)  # None while Queue.__init__ configures, before the log is opened
        if log is not None:
            log.max_bytes = self.max_bytes
            log.apply_retention()

    def count_ready(self) -> int:
        """The messages the log holds (a stream's messages stay for every consumer to read)."""
        return self.log.next_offset - self.log.first_offset

    def has_ready(self) -> bool:
        return self.count_ready() > 0

    def apply_policies(self, policy, operator_policy) -> None:
        self.policy, self.operator_policy = policy, operator_policy
        self._configure(self._settings())

    # --- publishing ---------------------------------------------------------------------------------------------
    def enqueue(self, message: Message) -> int:
        """Append to the log (whatever the message's delivery mode; a per-message TTL does not apply)."""
        self.log.append(message.exchange, message.routing_key, message.header_payload, message.body)
        return APPENDED

    def _readable(self) -> None:
        """New chunks are durable, or one was read back from disk: consumers waiting for it may read on."""
        if self.consumers and not self.deleted:
            self.vhost.dispatcher.mark(self)

    # --- what a stream refuses (RabbitMQ's texts) ---------------------------------------------------------------
    def take(self, no_ack: bool) -> QueueEntry | None:
        raise get_refused(self)

    def purge(self) -> int:
        raise purge_refused(self)

    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict) -> None:
        if "x-stream-offset" in arguments:
            check_consume_arguments(self, arguments)
            self._start_offset(arguments["x-stream-offset"])
        check_consume(self, no_ack, prefetch, global_prefetch, arguments)

    # --- consumers ------------------------------------------------------------------------------------------
    def add_consumer(self, consumer: "Subscriber") -> None:
        self.cursors[consumer] = self._start_offset(consumer.arguments.get("x-stream-offset", "next"))
        super().add_consumer(consumer)

    def remove_consumers(self, leaving: "list[Subscriber]") -> None:
        for consumer in leaving:
            self.cursors.pop(consumer, None)
        super().remove_consumers(leaving)

    def _start_offset(self, spec) -> int:
        """The offset a consumer starts at: 'first', 'last' (the newest chunk), 'next' (what comes after now), an
        offset (negative: the first; past the end: waits for it), a timestamp (seconds) or an interval back from
        now ('1h'); 406 for anything else."""
        log = self.log
        if is_longstr(spec):
            text = text_of(spec)
            if text == "first":
                return log.first_offset
            if text == "last":
                return log.last_chunk_offset()
            if text == "next":
                return log.next_offset
            interval = age_ms(text)
            if interval is not None:
                return log.offset_at_time(int(time.time() * 1000) - interval)
        elif isinstance(spec, int) and not isinstance(spec, bool):
            return max(spec, log.first_offset)
        elif isinstance(spec, datetime.datetime):
            return log.offset_at_time(int(spec.replace(tzinfo=spec.tzinfo or datetime.timezone.utc).timestamp()) * 1000)
        raise offset_refused(self, spec)

    # --- delivering -------------------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Each consumer with credit reads on from its own offset, DISPATCH_BATCH deliveries at most this round."""
        log = self.log
        budget = DISPATCH_BATCH
        cursors = self.cursors
        for consumer in self.consumers:
            cursor = cursors[consumer]
            if cursor >= log.next_offset:
                continue
            credit = consumer.credit()
            deliver = consumer.channel.deliver
            while credit > 0 and budget > 0:
                first, messages = log.read(cursor, min(credit, budget), wait=True)
                cursor = first
                if not messages:  # the end, or a chunk being read from disk (_readable marks the stream again)
                    break
                for exchange, routing_key, header, body in messages:
                    address = self._address(exchange, routing_key)
                    if OFFSET_HEADER in header:  # the publisher set one: it is replaced, as RabbitMQ does
                        message = Message(address, Header(header), body).with_headers({OFFSET_HEADER.decode(): cursor})
                    else:
                        message = Message(address, Header(with_long_header(header, OFFSET_HEADER, cursor)), body)
                    deliver(consumer, self, QueueEntry(cursor, message))
                    cursor += 1
                credit -= len(messages)
                budget -= len(messages)
            cursors[consumer] = cursor
            if not budget:
                self.vhost.dispatcher.mark(self)  # the rest in the next loop turn
                return

    def _address(self, exchange: str, routing_key: str) -> Address:
        address = self._addresses.get((exchange, routing_key))
        if address is None:
            if len(self._addresses) >= ADDRESSES_KEPT:
                self._addresses.clear()
            address = self._addresses[exchange, routing_key] = Address(exchange, routing_key)
        return address

    def settle(self, entries, requeue, failed: bool = False, retry=None) -> None:
        """Acks only give credit back (the channel did); a nack or reject settles like an ack, requeue or not
        (RabbitMQ 3.13+: 3.10 closes the channel, which kills a consumer that cancels with deliveries in flight)."""

    def requeue(self, requeued, failed: bool = False, retry=None) -> None:
        """Nothing goes back to a stream: every consumer reads it on its own."""

    def forget(self, entries) -> bool:
        return False

    def mark_delivered(self, entries) -> None:
        """Deliveries leave no trace in a stream."""

    def drop_all(self) -> int:
        """The stream is deleted: so is its log. Its delete-ok counts no message, as RabbitMQ's does."""
        self.cursors.clear()
        self.vhost.store.streams.delete(self.store_key)
        return 0

    def expire_due(self) -> None:
        """A stream's messages do not expire (retention drops them)."""
