"""A queue: messages in order, its consumers served round-robin, requeues back to their original position."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from itertools import chain, count
from typing import TYPE_CHECKING, Callable, Final, Iterable, Iterator

from broker.model.arguments.common import text_of
from broker.model.arguments.queue import (
    QUEUE_TYPE_MODULES, queue_resource, queue_type_of, validate_consume_arguments,
)
from broker.model.durability import StoredToMessage
from broker.model.features.dead_letter import DELIVERY_LIMIT, EXPIRED, MAXLEN, REJECTED, dead_letter
from broker.model.features.deadlines import Deadlines, now_ms
from broker.model.features.expiry import READY, ExpiringEntries, message_ttl
from broker.model.features.length_limit import DROPPED, ENQUEUED, ENQUEUED_OVER_FLOW_LIMIT, LengthLimit, body_bytes
from broker.model.features.paging import PAGE_BYTES, PAGE_ENTRIES, PagedEntries, StoreBacking
from broker.model.features.ready import FifoEntries, ReadyList, let_go, ready_entries
from broker.model.features.redelivery import DelayedRetry, count_return, delayed_retry, delivery_limit
from broker.model.keys import queue_key
from broker.model.message import Address, Header, Message, QueueEntry
from broker.model.policy import effective_settings, merged_definition
from broker.model.turns import next_turn
from protocol import errors

if TYPE_CHECKING:
    from broker.model.exchange import Binding
    from broker.model.policy import Policy
    from broker.model.vhost import VirtualHost
    from broker.model.interfaces import Publisher, QueueOwner, Subscriber
    from storage.records import Metadata
    from storage.recovered_messages import RecoveredMessages, StoredRun

# Publisher flow control: while a queue with consumers holds more than FLOW_HIGH ready messages, the connections
# publishing to it are not read; they are read again once deliveries bring it under FLOW_LOW. Consumers that
# cannot keep up thus slow their publishers down instead of letting the backlog (and memory) grow without end.
FLOW_HIGH: Final = 2000
FLOW_LOW: Final = 1000
# Deliveries handed to consumers per dispatch round, so one busy queue cannot starve the event loop or flood a
# socket before the transport can signal back-pressure; the rest goes in the next loop turn.
DISPATCH_BATCH: Final = 512
# Work on many messages done a slice a loop turn (a lower limit's drops, a channel's settlement) goes in pieces
# (PIECE between two looks at the clock) and stops for the turn after SLICE_SECONDS: a dead-lettered message costs
# ten times an acked one, and 4,096 at once held other clients 0.25 s
PIECE: Final = 64
SLICE_SECONDS: Final = 0.005
# Messages a lower length limit drops (and dead-letters) a loop turn at most, on a queue it leaves over the limit; and
# expired ones a get skips at the head
TRIM_SLICE: Final = 4096
# Expiry times of entries that left the ready list tolerated beyond twice the ready ones before they are let go
# (checked once every so many expiry times added).
STALE_EXPIRIES: Final = 1024


def in_pieces(piece: Callable[[], bool], most: int) -> bool:
    """A loop turn's share of work on many messages (a lower limit's drops, a channel's settlement, a get's skip of
    expired ones): piece() handles PIECE of them and says whether that was the last; it goes on until then, for
    `most` messages or SLICE_SECONDS at most. Whether the work is done."""
    ends = time.perf_counter() + SLICE_SECONDS
    for _ in range(most // PIECE):
        if piece():
            return True
        if time.perf_counter() >= ends:
            break
    return False


class Queue:
    def __init__(self, vhost: "VirtualHost", name: str, durable: bool, exclusive_owner: "QueueOwner | None",
                 auto_delete: bool, arguments: dict):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner  # the connection of an exclusive queue, else None
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.quorum = queue_type_of(arguments) == "quorum"  # a quorum queue (one node: a durable classic one that
        # keeps every message on disk, counts returns and has a delivery limit of 20 unless told otherwise)
        self.queue_type = "quorum" if self.quorum else "classic"  # as the management API and the metrics name it
        # ready messages in delivery order (by priority with x-max-priority)
        self.entries: ReadyList = ready_entries(arguments)
        self.ready_bytes = 0  # body bytes of the ready messages, in memory and paged
        self.trimming = False  # a lower length limit's drops continue next loop turn
        # ready messages kept in memory before later ones are paged (features.paging); None: never paged
        self.page_after = (vhost.paging.messages_in_memory
                           if vhost.paging is not None and isinstance(self.entries, FifoEntries) else None)
        self.paging: PagedEntries | None = None  # the ready list's paged part, made when the queue first pages
        self.next_seq = 0  # seq of the next enqueued entry
        # what the queue counted of its messages since it was made: see model.counters.QUEUE_COUNTERS
        self.published = self.delivered_consume_manual_ack = self.delivered_consume_auto_ack = 0
        self.delivered_get_manual_ack = self.delivered_get_auto_ack = self.get_empty = 0
        self.redelivered = self.acknowledged = 0
        # deliveries of its messages awaiting an ack on any channel, and their body bytes (broker.session.unacked
        # keeps them, for the management API and the metrics)
        self.unacked_count = self.unacked_bytes = 0
        self.consumers: list[Subscriber] = []  # highest priority first; within a priority, next to serve first
        # consumers at the head of the list found without credit, which cannot have got any since (credit_offered()
        # and a change of the list start the count again): the next look for one with credit starts after them
        self.passed_over = 0
        # x-single-active-consumer: only active_consumer is served; the others wait in self.consumers, which is then
        # never rotated, so that it stays in priority, then registration, order
        self.single_active = arguments.get("x-single-active-consumer") is True
        self.active_consumer: Subscriber | None = None
        # The active consumer that went while it still had unacked deliveries: its successor waits until they are
        # settled, so that the requeued ones are delivered first
        self.leaving: Subscriber | None = None
        self.bindings: set[Binding] = set()  # bindings that route to this queue, removed with it
        self.deleted = False  # set once deleted; late acks and requeues for it are ignored
        self.throttled: set[Publisher] = set()  # publishers (connections) paused until the backlog shrinks
        # Whether the queue's definition is in the store: durable, not exclusive, and a store to go to.
        self.recorded = durable and exclusive_owner is None and vhost.store is not None
        self.stored = self.recorded  # whether its persistent messages go to the message store
        self.stores_all = self.stored and self.quorum  # transient messages go to disk too
        self.owner: int | None = None  # the process (group) that owns it when another one does (model.remote)
        self.store_key = queue_key(vhost.name, name)  # the queue's name in the store
        self.policy, self.operator_policy = vhost.policies_for("queues", name)  # those that apply, or None
        # The settings below come from the arguments and the policies (policy.effective_settings); they are
        # worked out again whenever a policy that applies changes.
        self.limit: LengthLimit | None = None  # max-length(-bytes) and overflow, None when unlimited
        self.message_ttl: int | None = None  # ms a message may wait here; None = for ever
        self.unused_ttl: int | None = None  # ms unused before the queue deletes itself (expires)
        self.dead_letter_exchange: str | None = None  # where messages that leave unconsumed are republished
        self.dead_letter_routing_key: str | None = None  # the key they are republished with, else their own
        self.consumer_timeout: int | None = None  # ms its deliveries may wait for an ack (0: none; None: the broker's)
        self.delivery_limit: int | None = None  # failed returns past which a message is dead-lettered; None = never
        self.delayed_retry: DelayedRetry | None = None  # how long returned messages wait before they are ready again
        self.counts_returns = False  # returned messages show x-acquired-count / x-delivery-count headers
        # returned entries waiting out their retry delay (not ready meanwhile); made on first use
        self.retrying: Deadlines[QueueEntry] | None = None
        # entries with a TTL by expiry time, made with the first one (then the ready list in memory is
        # ExpiringEntries: self.entries, or the part in memory of a queue that pages)
        self.expiries: Deadlines[QueueEntry] | None = None
        self.unused_timer: asyncio.TimerHandle | None = None  # deletes the queue once unused for unused_ttl
        self._configure(self._settings())
        self.touch()

    def definition(self) -> dict:
        """What declared the queue, in RabbitMQ's keys (stored, exported, compared with a redeclaration)."""
        return {"name": self.name, "durable": self.durable, "auto_delete": self.auto_delete,
                "arguments": self.arguments}

    # --- policies ---------------------------------------------------------------------------------------
    def effective_policy_definition(self) -> dict:
        """The keys of the policy and operator policy together, as RabbitMQ's API shows them."""
        return merged_definition(self.policy, self.operator_policy)

    def _settings(self) -> dict:
        return effective_settings(self.arguments, self.effective_policy_definition(), "queues")

    def _configure(self, settings: dict) -> None:
        self.limit = LengthLimit.from_settings(settings)
        self.message_ttl = settings.get("message-ttl")
        self.unused_ttl = settings.get("expires")
        exchange, routing_key = settings.get("dead-letter-exchange"), settings.get("dead-letter-routing-key")
        self.dead_letter_exchange = text_of(exchange) if exchange is not None else None
        self.dead_letter_routing_key = text_of(routing_key) if routing_key is not None else None
        self.consumer_timeout = settings.get("consumer-timeout")
        self.delivery_limit = delivery_limit(settings, self.quorum)
        self.delayed_retry = delayed_retry(settings)
        self.counts_returns = self.quorum or self.delivery_limit is not None or self.delayed_retry is not None

    def apply_policies(self, policy: "Policy | None", operator_policy: "Policy | None") -> None:
        """Other policies apply from now on, as RabbitMQ applies them to a live queue: a lower length limit drops
        (and dead-letters) the oldest messages (a slice a loop turn), the expires lease starts again, a new message
        TTL applies to messages enqueued from now on."""
        self.policy, self.operator_policy = policy, operator_policy
        self._configure(self._settings())
        self._trim()
        if self.unused_timer is not None:
            self.unused_timer.cancel()
            self.unused_timer = None
        self.touch()

    def count_ready(self) -> int:
        """Ready messages, once the expired ones have left (and been dead-lettered)."""
        self.expire_due()
        return len(self.entries)

    def ready_as_held(self) -> int:
        """Ready messages as the queue holds them now, those expired that their timer has not taken yet included:
        no work, for totals over every queue (count_ready() first lets the expired ones go, up to FIRE_SLICE)."""
        return len(self.entries)

    def has_ready(self) -> bool:
        """Whether a message waits to be delivered (expired ones may still count until they leave)."""
        return bool(self.entries)

    def has_consumers(self) -> bool:
        """Whether a consumer consumes from it (queue.delete's if-unused, an exclusive consume), one whose channel
        closed aside."""
        return any(not consumer.leaving for consumer in self.consumers)

    def has_waiting_consumer(self) -> bool:
        """Whether a consumer of priority 0 or more has credit: one waits for a message (a federation link fetches
        for it, as RabbitMQ's active_unfederated)."""
        return any(consumer.priority >= 0 and consumer.credit() > 0 for consumer in self.consumers)

    def count_retrying(self) -> int:
        """Returned messages waiting out a retry delay."""
        return len(self.retrying) if self.retrying is not None else 0

    # --- expiry -----------------------------------------------------------------------------------------
    def _will_expire(self, entry: QueueEntry, ttl: int, now: int) -> None:
        """entry, about to join the ready list, expires ttl ms from now wherever it then is in the queue (once
        _watch_expiry is told, unless it is paged)."""
        entry.expires_at = now + ttl
        if self.expiries is None:
            if self.paging is not None:
                self.paging.inner = ExpiringEntries(self.paging.inner)
            else:
                self.entries = ExpiringEntries(self.entries)
            self.expiries = Deadlines(self._expire)

    def _watch_expiry(self, entry: QueueEntry) -> None:
        expiries = self.expiries
        assert expiries is not None, "made by _will_expire"
        if not expiries.arrivals % STALE_EXPIRIES and len(expiries) > 2 * len(self.entries) + STALE_EXPIRIES:
            # most are of entries that left (delivered, acked): let them go rather than keep them until their time
            expiries.prune(lambda waiting: waiting.place == READY)
        expiries.add(entry.expires_at, entry)

    def expire_due(self) -> None:
        """Messages whose TTL has passed leave now, though their timer may not have fired yet (FIRE_SLICE of them:
        the timer takes the rest over the loop turns that follow, dispatch and take skip them meanwhile)."""
        expiries = self.expiries
        if expiries is not None:
            due = expiries.next_due()
            if due is not None and due < (now := now_ms()):
                self._expire(expiries.take_due(now - 1))

    def _expire(self, due: list[QueueEntry]) -> None:
        """Entries whose TTL passed: those still in the ready list are dead-lettered as 'expired' and left there as
        tombstones (unlike RabbitMQ's classic queues, where a message expires only once it reaches the head)."""
        expired = [entry for entry in due if entry.place == READY]
        if not expired or self.deleted:
            return
        self.ready_bytes -= body_bytes(expired)
        self.forget(expired)
        dead_letter(self, expired, EXPIRED)
        entries = self.entries
        assert isinstance(entries, (ExpiringEntries, PagedEntries)), "made so by _will_expire"
        for entry in expired:
            entries.bury(entry)
        if self.paging is not None:
            self.paging.top_up()

    def touch(self) -> None:
        """The queue is used (declared, read, consumed): an x-expires queue starts counting again."""
        if self.unused_ttl is None or self.deleted:
            return
        if self.unused_timer is not None:
            self.unused_timer.cancel()
        self.unused_timer = asyncio.get_running_loop().call_later(self.unused_ttl / 1000, self._expire_if_unused)

    def _expire_if_unused(self) -> None:
        self.unused_timer = None
        if not self.consumers and not self.deleted:
            self.vhost.delete_queue(self)

    def stop_timers(self) -> None:
        if self.unused_timer is not None:
            self.unused_timer.cancel()
        self._drop_deadlines()

    def _drop_deadlines(self) -> None:
        """Expiry times and retry delays go with what they timed, freed over the loop turns that follow (no timer
        then acts on an entry that left: features.expiry)."""
        for deadlines in (self.expiries, self.retrying):
            if deadlines is not None:
                let_go(deadlines.take_all())

    # --- messages ---------------------------------------------------------------------------------------
    def enqueue(self, message: Message) -> int:
        """Take a message: straight to an idle consumer when nothing waits before it (as RabbitMQ does, so that
        neither a length limit nor a TTL of 0 stands in its way), else at the tail. Says whether it was kept (see
        broker.model.features.length_limit)."""
        entry = QueueEntry(self.next_seq, message)
        self.next_seq += 1
        if not self.entries and self.consumers:
            consumer = self._next_consumer_with_credit()
            if consumer is not None:
                consumer.channel.deliver(consumer, self, entry)
                return ENQUEUED
        if self.limit is not None:
            status, dropped = self.limit.admit(self.entries, self.ready_bytes, message)
            if dropped:
                self.ready_bytes -= body_bytes(dropped)
                self.forget(dropped)
                dead_letter(self, dropped, MAXLEN)
            if status != ENQUEUED:
                if status == DROPPED or self.limit.dead_letter_refused:
                    dead_letter(self, [entry], MAXLEN)
                return status
        if self.message_ttl is not None or message.header.scan.expiration is not None:
            ttl = message_ttl(self.message_ttl, message)
            if ttl is not None:
                self._will_expire(entry, ttl, now_ms())
        self._add_ready(entry)
        entries = self.entries
        if self.consumers:
            self.vhost.dispatcher.mark(self)
            if len(entries) > FLOW_HIGH:
                return ENQUEUED_OVER_FLOW_LIMIT
        return ENQUEUED

    def _add_ready(self, entry: QueueEntry) -> None:
        """entry joins the tail of the ready list: in memory, or paged once enough wait there."""
        message = entry.message
        assert message is not None, "a live entry"
        self.ready_bytes += len(message.body)
        if self.paging is None and self.page_after is not None and len(self.entries) >= self.page_after:
            self._start_paging()
        if not self.entries.append(entry) and entry.expires_at:  # append says True when it paged the entry
            self._watch_expiry(entry)

    def _start_paging(self) -> PagedEntries:
        """The queue is deep: later arrivals go to its page file (features.paging), or stay in the message store if
        it holds them for this queue anyway."""
        paging, in_memory, entries = self.vhost.paging, self.page_after, self.entries
        assert paging is not None and in_memory is not None and isinstance(entries, (FifoEntries, ExpiringEntries)), \
            "only a FIFO queue of a vhost that pages has page_after set"
        backing = None
        if self.stored:
            as_message = StoredToMessage()
            backing = StoreBacking(self.vhost.store, self.store_key, self.stores_all,
                                   lambda first_seq: partial(self._restored_entries, first_seq, now_ms(), as_message))
        self.entries = self.paging = PagedEntries(entries, paging.store.open(), in_memory, self._paged_in, backing)
        return self.paging

    def _paged_in(self, entries: list[QueueEntry]) -> None:
        """Paged entries are back in memory: those with a TTL are watched again (an expired one leaves as soon as
        the timer fires), and consumers are served."""
        if self.expiries is not None:
            for entry in entries:
                if entry.expires_at:
                    self._watch_expiry(entry)
        if self.consumers:
            self.vhost.dispatcher.mark(self)

    def restore(self, stored: "RecoveredMessages", as_message: "StoredToMessage") -> None:
        """Messages recovered from disk, in order; TTLs count again from now. A deep queue reads only what it keeps
        in memory now: the rest waits in the store's segments and is paged in from there in runs (features.paging),
        so a restart neither builds an object per queued message nor copies their bodies to page files."""
        now = now_ms()
        in_memory = len(stored) if self.page_after is None else min(len(stored), self.page_after)
        for item in stored.read(0, in_memory):
            self._add_ready(self._restored_entry(self.next_seq, as_message(item), item.redelivered, now))
            self.next_seq += 1
        if in_memory < len(stored):
            paging = self.paging if self.paging is not None else self._start_paging()
            paged_bytes = paging.paged_bytes
            for run in stored.runs(in_memory, PAGE_BYTES, max_messages=PAGE_ENTRIES):
                paging.add_stored(run, partial(self._restored_entries, self.next_seq, now, as_message))
                self.next_seq += len(run)
            self.ready_bytes += paging.paged_bytes - paged_bytes

    def _restored_entry(self, seq: int, message: Message, redelivered: bool, restored_at: int) -> QueueEntry:
        entry = QueueEntry(seq, message, redelivered)
        ttl = message_ttl(self.message_ttl, message)
        if ttl is not None:
            self._will_expire(entry, ttl, restored_at)
        return entry

    def _restored_entries(self, first_seq: int, restored_at: int, as_message: "StoredToMessage", run: "StoredRun",
                          data: bytes) -> list[QueueEntry]:
        """Entries for a run of recovered messages paged in from the store, from the bytes it read (their places
        in the queue were kept from first_seq on at restore, their TTLs count from then)."""
        next_seq = count(first_seq).__next__
        last: "Metadata | None" = None  # the metadata of the message before, and what was made of it
        shared: tuple[Address, Header] | None = None

        def new_entry(msg_id: int, metadata: "Metadata", body: bytes, redelivered: bool) -> QueueEntry:
            nonlocal last, shared
            if metadata is not last or shared is None:
                _, exchange, routing_key, header_payload = last = metadata
                shared = as_message.shared(exchange, routing_key, header_payload)
            address, header = shared
            return self._restored_entry(next_seq(), Message(address, header, body, msg_id), redelivered, restored_at)

        return run.messages(data, new_entry)

    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict) -> None:
        """Whether a basic.consume with these settings may subscribe (its arguments checked with RabbitMQ's texts,
        a quorum queue refusing a channel-wide prefetch limit)."""
        validate_consume_arguments(self.name, self.vhost.name, arguments)
        resource = queue_resource(self.name, self.vhost.name)
        if "x-stream-offset" in arguments:  # a stream's argument: refused rather than ignored, as RabbitMQ does
            raise errors.precondition_failed(
                f"invalid arg 'x-stream-offset' for {resource} of queue type {QUEUE_TYPE_MODULES[self.queue_type]}")
        if self.quorum and global_prefetch:
            raise errors.not_implemented(f"{resource} does not support global qos")

    def drop_all(self) -> int:
        """The queue is deleted: its ready messages go, freed over the loop turns that follow. Returns how many
        (what delete-ok counts)."""
        count = len(self.entries)
        if count:  # (an empty one makes nothing new: 100,000 deleted queues' new lists kept the collector busy)
            self.entries, taken = self.entries.take_all()
            let_go(taken)
        return count

    def throttle(self, publisher: "Publisher") -> None:
        if publisher not in self.throttled:
            self.throttled.add(publisher)
            publisher.throttle(self)

    def release_publishers(self) -> None:
        if not self.throttled:
            return
        throttled, self.throttled = self.throttled, set()
        for publisher in throttled:
            publisher.unthrottle(self)

    def requeue(self, requeued: list[QueueEntry], failed: bool = False, retry: DelayedRetry | None = None) -> None:
        """Delivered entries come back, flagged redelivered and counted (failed: the return counts towards the
        delivery limit): dead-lettered past the limit, else back at their original positions, at once or once their
        retry delay (retry, else the queue's) has passed."""
        if self.deleted or not requeued:
            return
        limit, annotate, retry = self.delivery_limit, self.counts_returns, retry or self.delayed_retry
        back, over_limit = [], []
        for entry in requeued:
            count_return(entry, failed, annotate)
            if limit is not None and entry.delivery_count > limit:
                over_limit.append(entry)
            elif retry is not None and (delay := retry.delay_ms(entry, failed)):
                self._retry_later(entry, delay)
            else:
                back.append(entry)
        if over_limit:
            self.forget(over_limit)
            dead_letter(self, over_limit, DELIVERY_LIMIT)
        if back:
            self._put_back(back)

    def _retry_later(self, entry: QueueEntry, delay_ms: int) -> None:
        if self.retrying is None:
            self.retrying = Deadlines(self._retry_due)
        self.retrying.add(now_ms() + delay_ms, entry)

    def _retry_due(self, entries: list[QueueEntry]) -> None:
        if not self.deleted:
            self._put_back(entries)

    def _put_back(self, requeued: list[QueueEntry]) -> None:
        """Returned entries are ready again, at their original positions; those whose TTL passed meanwhile leave
        (dead-lettered as 'expired')."""
        if self.expiries is not None:
            now = now_ms()
            expired = [entry for entry in requeued if 0 < entry.expires_at < now]
            if expired:
                self.forget(expired)
                dead_letter(self, expired, EXPIRED)
                requeued = [entry for entry in requeued if not 0 < entry.expires_at < now]
                if not requeued:
                    return
            for entry in requeued:
                if entry.expires_at:
                    self._watch_expiry(entry)  # its earlier expiry time may have been pruned
        requeued.sort(key=lambda entry: entry.seq)
        self.entries.put_back(requeued)
        self.ready_bytes += body_bytes(requeued)
        self._trim()
        if self.consumers:
            self.vhost.dispatcher.mark(self)

    def _trim(self) -> None:
        """A drop-head queue over its length limit (a requeue, or a lower limit, took it there) drops and
        dead-letters its oldest messages until it is within it, a slice a loop turn (TRIM_SLICE or SLICE_SECONDS)."""
        limit = self.limit
        if limit is None or self.deleted or self.trimming or not limit.over(self.entries, self.ready_bytes):
            return
        if not in_pieces(self._trim_piece, TRIM_SLICE):
            self.trimming = True
            next_turn(self._trim_again)

    def _trim_piece(self) -> bool:
        """PIECE of the oldest messages over the limit dropped; whether the queue is within it now."""
        limit = self.limit
        assert limit is not None, "a queue over its limit has one"
        dropped = limit.trim(self.entries, self.ready_bytes, PIECE)
        self.ready_bytes -= body_bytes(dropped)
        self.forget(dropped)
        dead_letter(self, dropped, MAXLEN)
        return not limit.over(self.entries, self.ready_bytes)

    def _trim_again(self) -> None:
        self.trimming = False
        self._trim()

    def take(self, no_ack: bool) -> QueueEntry | None:
        """Remove and return the head entry for a basic.get (a client's, or one the broker makes for the API or the
        aliveness test, counted as RabbitMQ's API counts its gets on a channel): counted as a delivery with or
        without ack, a redelivery, or an empty get. None also when expired messages at the head took this turn's
        share (they leave, dead-lettered, TRIM_SLICE a turn at most): has_ready() then says to ask again."""
        self.touch()
        self.expire_due()
        found: list[QueueEntry] = []
        if not in_pieces(lambda: self._pop_live(found), TRIM_SLICE):
            return None
        if not found:
            self.get_empty += 1
            return None
        entry = found[0]
        if entry.redelivered:
            self.redelivered += 1
        if no_ack:
            self.delivered_get_auto_ack += 1
        else:
            self.delivered_get_manual_ack += 1
        return entry

    def take_again(self) -> bool:
        """After take() gave None: whether expired messages ahead of the head took its turn's share, so that asking
        again in a later turn may find one (rather than the queue being empty, or deleted)."""
        return not self.deleted and self.has_ready()

    def _pop_live(self, found: list[QueueEntry]) -> bool:
        """The head popped into found, once PIECE at most of the expired ones ahead of it left (dead-lettered beyond
        what expire_due took); whether that ended the search (found, or the queue is empty)."""
        entries = self.entries
        expired: list[QueueEntry] = []
        while entries and len(expired) < PIECE:
            head = entries.popleft()
            self.ready_bytes -= body_bytes((head,))
            if not 0 < head.expires_at < now_ms():
                found.append(head)
                break
            expired.append(head)
        if expired:
            self.forget(expired)
            dead_letter(self, expired, EXPIRED)
        return bool(found) or not entries

    def purge(self) -> int:
        """Drop the ready messages, and those waiting out a retry delay (as RabbitMQ 4.3). Durable storage lets
        them go over the loop turns that follow (purge-ok waits for it: the store's when_durable)."""
        waiting = list(self.retrying) if self.retrying is not None else []
        count = len(self.entries) + len(waiting)
        paged = self._forget_paged()  # (before take_all drops the pages)
        self.entries, taken = self.entries.take_all()
        if self._forget_all(taken, waiting) | paged:
            self.vhost.durable_changes += 1  # purge-ok waits for the removals to be on disk
        else:
            let_go(taken)
        self._drop_deadlines()
        self.ready_bytes = 0
        return count

    def settle(self, entries: list[QueueEntry], requeue: bool | None, failed: bool = False,
               retry: DelayedRetry | None = None) -> None:
        """Delivered entries are done with: requeued (True; see requeue), acked (None), or rejected and
        dead-lettered (False)."""
        if requeue:
            self.requeue(entries, failed, retry)
            return
        self.forget(entries)
        if requeue is False:
            dead_letter(self, entries, REJECTED)

    def mark_delivered(self, entries: Iterable[QueueEntry]) -> None:
        """Entries handed out and not settled yet: durable storage notes it, so that they come back redelivered
        after a restart."""
        if self.stored:
            ids = tuple(message.msg_id for entry in entries
                        if (message := entry.message) is not None and message.msg_id)
            if ids:
                self.vhost.store.append_delivered(self.store_key, ids)

    def _forget_paged(self) -> bool:
        """The paged messages are dropped: durable storage lets them go over the loop turns that follow. True if it
        was told."""
        if self.stored and self.paging is not None:
            ids = self.paging.stored_ids()
            first = next(ids, None)
            if first is not None:
                self.vhost.store.append_removed(self.store_key, chain((first,), ids))
                return True
        return False

    def _forget_all(self, taken: ReadyList, waiting: list[QueueEntry]) -> bool:
        """Entries dropped at once, any number of them (a purge's ready list and those waiting out a retry delay):
        durable storage reads their ids as it marks them, a slice a loop turn, letting each entry go once its id is
        read. True if it was told (else the caller lets them go)."""
        if self.stored and (len(taken) or waiting):
            self.vhost.store.append_removed(self.store_key, _stored_ids(taken, waiting))
            return True
        return False

    def forget(self, entries: Iterable[QueueEntry]) -> bool:
        """Entries are done with (acked, dropped, purged): durable storage may let them go. True if it was told."""
        if self.stored:
            ids = [message.msg_id for entry in entries if (message := entry.message) is not None and message.msg_id]
            if ids:
                self.vhost.store.append_removed(self.store_key, ids)
                return True
        return False

    # --- consumers --------------------------------------------------------------------------------------
    def add_consumer(self, consumer: "Subscriber") -> None:
        self.touch()
        self._place_last_of_its_priority(consumer)
        self.passed_over = 0
        self.vhost.dispatcher.mark(self)
        self.vhost.changed("queues", self.name)  # (a federated queue's link consumes upstream while one waits)

    def credit_offered(self) -> None:
        """A consumer may have got credit back (an ack, a qos, a channel's flow, a socket writable again): every
        consumer may be asked again, and ready messages go out at the end of this loop turn."""
        self.passed_over = 0
        if self.consumers and self.has_ready():
            self.vhost.dispatcher.mark(self)

    def _place_last_of_its_priority(self, consumer: "Subscriber") -> None:
        consumers = self.consumers
        index = len(consumers)
        while index and consumers[index - 1].priority < consumer.priority:
            index -= 1
        consumers.insert(index, consumer)

    def consumers_leave(self, leaving: "list[Subscriber]") -> None:
        """These consumers' channel closed: they take nothing more (their leaving flag says so here), and go once
        its deliveries are back (remove_consumers)."""

    def remove_consumers(self, leaving: "list[Subscriber]") -> None:
        """Drop consumers (one cancelled, or a closing channel's), the list walked once (10,000 of one channel on one
        queue, each removed on its own, took 0.2 s); an auto-delete queue goes away with its last one."""
        gone = set(leaving)
        self.consumers[:] = [consumer for consumer in self.consumers if consumer not in gone]
        self.passed_over = 0
        active = self.active_consumer
        if active is not None and active in gone:
            self.active_consumer = None
            self.leaving = active if active.unacked else None
            self.vhost.dispatcher.mark(self)
        if not self.consumers:
            self.touch()
            self.release_publishers()
            if self.auto_delete and not self.deleted:
                self.vhost.delete_queue(self)

    def has_exclusive_consumer(self) -> bool:
        return any(consumer.exclusive and not consumer.leaving for consumer in self.consumers)

    def dispatch(self) -> None:
        """Hand ready messages to consumers with credit, round-robin, at most DISPATCH_BATCH this round; messages
        found expired on the way leave instead."""
        self.expire_due()
        entries = self.entries
        consumers = self.consumers
        expired = []
        budget = DISPATCH_BATCH
        taken_bytes = 0
        while entries and budget:
            if len(consumers) == 1 or self.single_active:
                consumer = self.current_active_consumer() if self.single_active else consumers[0]
                credit = min(consumer.credit(), budget) if consumer is not None else 0
            else:
                consumer = self._next_consumer_with_credit()
                credit = 1
            if consumer is None or not credit:
                break
            deliver = consumer.channel.deliver
            while credit and entries:
                entry = entries.popleft()
                message = entry.message
                assert message is not None, "a live entry"
                taken_bytes += len(message.body)
                if entry.expires_at and entry.expires_at < now_ms():
                    expired.append(entry)
                    budget -= 1  # (millions due at once leave a round at a time)
                    if not budget:
                        break
                    continue
                deliver(consumer, self, entry)
                credit -= 1
                budget -= 1
        self.ready_bytes -= taken_bytes
        if expired:
            self.forget(expired)
            dead_letter(self, expired, EXPIRED)
        if entries and not budget:
            self.vhost.dispatcher.mark(self)
        if self.throttled and len(entries) < FLOW_LOW:
            self.release_publishers()

    def current_active_consumer(self) -> "Subscriber | None":
        """The single active consumer: once the last one's unacked deliveries are settled, the next in line (the
        highest priority, then the earliest registered)."""
        if self.active_consumer is None:
            leaving = self.leaving
            if leaving is not None and leaving.unacked:
                return None
            self.leaving = None
            self.active_consumer = self.consumers[0] if self.consumers else None
        return self.active_consumer

    def _next_consumer_with_credit(self) -> "Subscriber | None":
        """The first consumer able to take a message, after those passed over; it then moves behind the others of
        its priority (with a single active consumer: that one, if it can). 10,000 consumers without credit, each
        asked again before every delivery, held the loop 168 ms a dispatch round."""
        if self.single_active:
            active = self.current_active_consumer()
            return active if active is not None and active.credit() > 0 else None
        consumers = self.consumers
        for index in range(self.passed_over, len(consumers)):
            consumer = consumers[index]
            if consumer.credit() > 0:
                self.passed_over = index  # (the move leaves those before it where they are)
                del consumers[index]
                self._place_last_of_its_priority(consumer)
                return consumer
        self.passed_over = len(consumers)
        return None


def _stored_ids(taken: ReadyList, waiting: list[QueueEntry]) -> Iterator[int]:
    """The ids of the stored messages of dropped entries, each entry let go as its id is read."""
    while waiting:
        message = waiting.pop().message
        if message is not None and message.msg_id:
            yield message.msg_id
    while len(taken):
        message = taken.popleft().message
        if message is not None and message.msg_id:
            yield message.msg_id
