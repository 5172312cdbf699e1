"""One AMQP channel: the state machine for publish, consume, acks, prefetch, confirms and transactions."""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Callable, Final

from pamqp import base, commands as spec

from broker.model.access import ChannelAccess, internal_exchange_refusal, user_id_refusal
from broker.model.features.delayed_messages import delay_of
from broker.model.features.expiry import parse_expiration
from broker.model.features.redelivery import DelayedRetry
from broker.model.join import Join
from broker.model.message import Address, Header, Message, QueueEntry, carbon_copy_keys
from broker.model.queue import PIECE, Queue
from broker.model.turns import next_turn
from broker.session import direct_reply
from broker.session.ack_timeout import AckTimer, log_timeout, timeout_of
from broker.session.confirms import ConfirmTracker
from broker.session.consumer import Consumer
from broker.session.handlers import HANDLERS
from broker.session.settlement import (
    SETTLE_SLICE, Commit, CommitAcross, Get, Rollback, Settlement, Slices, TakenIntoTransaction,
)
from broker.session.transaction import Transaction
from broker.session.unacked import Unacked, UnackedStore
from protocol import errors
from protocol.assembler import Content, content_body, content_header, out_of_order
from protocol.codec import decode_method, encode_content, encode_method
from protocol.constants import (
    BASIC_ACK, BASIC_NACK, BASIC_PUBLISH, BASIC_REJECT, FRAME_BODY, FRAME_HEADER, FRAME_METHOD, INTERNAL_ERROR, NO_ROUTE,
)
from protocol.errors import AMQPError
from protocol.fastpath import (
    decode_ack, decode_nack, decode_publish, decode_reject, encode_ack, encode_delivery, encode_nack,
)
from protocol.properties import EXPIRATION, REPLY_TO, USER_ID, property_flags

if TYPE_CHECKING:
    from broker.model.counters import NodeCounters
    from broker.model.transactions import Share
    from broker.model.vhost import VirtualHost
    from broker.session.interfaces import ChannelHost
    from broker.session.limits import ChannelLimits

_METHOD_ID: Final = struct.Struct(">I")
# Frames a channel holds while a reply waits for the disk before its connection stops being read (RabbitMQ's credit
# flow lets a reader run about as far ahead of a busy channel).
BACKLOG_LIMIT: Final = 400


class Channel:
    def __init__(self, connection: "ChannelHost", number: int):
        self.connection: ChannelHost = connection  # the connection, as the little a channel needs of it
        self.number: int = number
        # The connection's write (frames go out at once, where write() holds a method's replies) and its frame size
        # (negotiated before any channel opens), looked up once rather than through the interface per message
        self.write_now: Callable[[bytes], None] = connection.write
        self.frame_max: int = connection.frame_max
        vhost = connection.vhost
        assert vhost is not None, "a channel opens on a connection that chose its vhost"
        self.vhost: VirtualHost = vhost
        self.counters: NodeCounters = self.vhost.counters  # the node's (model.counters)
        self.counters.channels_opened += 1
        self.publish_count: int = 0  # messages published on the channel (it counts as a publisher once it has one)
        self.ack_count: int = 0  # deliveries acknowledged on the channel (its deliveries are counted by next_tag)
        limits = connection.limits
        self.limits: ChannelLimits = limits  # the broker's settings, alarm and bodies in assembly
        # the user's permission checks
        self.access: ChannelAccess = ChannelAccess(limits.node, connection.user, self.vhost.name)
        self.max_message_size: int = limits.max_message_size  # largest body accepted (RabbitMQ's max_message_size)
        self.open: bool = True  # False once closing: every frame but close/close-ok is then ignored
        self.pending: Content | None = None  # publish being assembled from its content frames
        self.next_tag: int = 1  # delivery tag of the next delivery on this channel
        self.unacked: UnackedStore = UnackedStore()  # deliveries awaiting ack, and the prefetch counts they hold
        self.consumers: dict[str, Consumer] = {}  # consumer tag -> consumer
        self.consumer_prefetch: int = limits.default_consumer_prefetch  # for consumers started next
        self.default_ack_timeout: int = limits.consumer_timeout  # ms, where neither consumer nor queue sets one
        self.ack_timer: AckTimer = AckTimer(self)  # closes the channel when a delivery waits for its ack too long
        self.confirms: ConfirmTracker | None = None  # set by confirm.select
        # Confirm seqs of this read's persistent publishes, waiting for the disk under one store callback;
        # None until the read's first persistent publish.
        self.awaiting_disk: list[int] | None = None
        # Where its vhost has queues other processes own (broker.crossing): the owners this read's publishes went to,
        # and what their acks and the disk join in before it confirms them
        self.awaiting_owners: dict[int, int] | None = None
        self.awaiting_join: Join | None = None
        self.awaiting_store = False  # (whether the join has the store's part yet)
        self.late_reply: Callable[[], base.Frame] | None = None  # the method at hand's reply, made as it is sent
        self.tx: Transaction | None = None  # set by tx.select: publishes and acks held until commit
        self.last_queue: str = ""  # name of the last queue declared, for methods that name the queue ""
        self.reply_consumer: direct_reply.ReplyConsumer | None = None  # consumer of amq.rabbitmq.reply-to
        self.last_address: Address = Address("", "")  # of the last publish, shared by the next ones that repeat it
        self.last_header: Header = Header(b"")  # content header of the last publish, shared likewise
        # Frames the method being handled sends (its reply), written once it is done: at once, or after the disk
        # has its durable changes. None between methods.
        self.replies: list[bytes] | None = None
        self.notices: list[bytes] = []  # server-sent basic.cancel for our consumers meanwhile, sent after the replies
        self.notices_held = False  # a change the vhost's home runs for the channel holds them too (its reply first)
        # open, and not waiting for the disk before a reply (deliveries would overtake it)
        self.deliverable: bool = True
        # Frames received while a reply waits for the disk, handled once it is sent (as RabbitMQ's channel process,
        # blocked in the call, leaves them in its mailbox); None when not waiting.
        self.backlog: list[tuple[int, int, bytes]] | None = None
        self.undo: Callable[[], None] | None = None  # takes back the change of a method whose records were not written
        self.settling: deque[Slices] = deque()  # work on deliveries under way a slice a turn, first first
        self.held_for_settling: bool = False  # the backlog holds the frames that follow that work
        # What waits for that work to end once the channel is closed: its consumers' leaving, its close-ok
        self.after_settling: list[Callable[[], None]] = []
        # The processes that own queues (broker.crossing) a closed channel's deliveries went back to, or that its
        # consumers took from, each with the frame from which, until they ack them: its close-ok waits (when_back)
        self.requeued_at: dict[int, int] = {}

    # --- frames in -----------------------------------------------------------------------------------------
    def handle_frame(self, frame_type: int, payload: bytes) -> None:
        backlog = self.backlog
        if backlog is not None:  # a reply waits for the disk: so does every frame after it
            self._hold_frame(backlog, frame_type, payload)
            return
        pending: Content | None = self.pending
        if frame_type == FRAME_METHOD:
            if pending is not None:
                raise out_of_order(pending)
            method_id = _METHOD_ID.unpack_from(payload)[0]
            if method_id == BASIC_PUBLISH:
                exchange, routing_key, mandatory, immediate = decode_publish(payload)
                if immediate:
                    raise errors.not_implemented("immediate=true")
                self.pending = Content(exchange, routing_key, mandatory)
            elif method_id == BASIC_ACK:
                self.ack(*decode_ack(payload))
            elif method_id == BASIC_NACK:
                tag, multiple, requeue = decode_nack(payload)
                self.reject(tag, multiple, requeue)
            elif method_id == BASIC_REJECT:
                tag, requeue = decode_reject(payload)
                self.reject(tag, False, requeue, failed=True)
            else:
                self.handle_method(decode_method(payload))
        elif pending is None:
            raise out_of_order(pending)
        elif frame_type == FRAME_HEADER:
            if not content_header(pending, payload, self.max_message_size):
                self.pending = None
                self.publish(pending.exchange, pending.routing_key, pending.mandatory, payload, b"")
        elif frame_type == FRAME_BODY:
            body = content_body(pending, payload)
            if body is None:
                self._assembling(pending, len(payload))
                return
            if pending.parts:
                self._assembled(pending)
            self.pending = None
            self.publish(pending.exchange, pending.routing_key, pending.mandatory, pending.header, body)

    def _assembling(self, pending: Content, size: int) -> None:
        """A part of a body arrived: block the connection while memory runs short (the alarm, or bodies in
        assembly over their budget)."""
        limits = self.limits
        over_budget = limits.assembly.grew(pending, self.connection, size)
        alarm = limits.alarm
        if alarm is not None or over_budget:
            self.connection.block(alarm or "low on memory")

    def _assembled(self, pending: Content) -> None:
        """A body in assembly completed or was dropped: connections blocked for the budget may go on."""
        limits = self.limits
        released = limits.assembly.finished(pending)
        if released and limits.alarm is None:
            for connection in released:
                connection.unblock()

    def handle_method(self, method) -> None:
        """Run a method's handler. Its reply follows the fsync of the durable changes it made (definitions,
        purges), as confirms follow their messages; until then the channel handles no further frame and delivers
        nothing, so no later reply or delivery overtakes it."""
        handler = HANDLERS.get(type(method))
        if handler is None:
            raise errors.command_invalid("unimplemented method")
        vhost = self.vhost
        changes = vhost.durable_changes
        if vhost.changed_owners:  # (those of changes made outside any method, which nobody waits for)
            vhost.changed_owners = {}
        self.replies = []
        self.undo = None
        try:
            handler(self, method)
        except Exception:
            self._send_replies()
            raise
        written = vhost.durable_changes != changes
        if (written or vhost.changed_owners) and self.open:
            self._wait_for_disk(method, written)
        else:
            self._send_replies()

    def _hold_for_owners(self) -> None:
        """A nack or reject had queues other processes own dead-letter (broker.model.remote): the channel's next
        frames wait for their acks, by which what they dead-lettered is routed here, as a queue here routes it before
        the next frame. (What an owner that ended dead-lettered is lost, as dead-lettering is at most once.)"""
        owners = self.vhost.take_changed_owners()
        if owners is None or not self.open:
            return
        self.deliverable = False
        self.backlog = []
        self.replies = []
        self.vhost.when_acked(owners, lambda ok: self._written(None, True))

    def _wait_for_disk(self, method, written: bool) -> None:
        """Reply once the method's durable changes are on disk (written) and the processes that own queues it
        changed acked them."""
        self.deliverable = False
        if self.backlog is None:  # (sliced work the method started may hold the frames already)
            self.backlog = []
        vhost = self.vhost
        owners = vhost.take_changed_owners()
        if written or owners is None:
            vhost.when_durable(lambda ok: self._written(method, ok), owners)
        else:
            vhost.when_acked(owners, lambda ok: self._written(method, ok))

    def _hold_frame(self, backlog: list[tuple[int, int, bytes]], frame_type: int, payload: bytes) -> None:
        backlog.append((frame_type, self.number, payload))
        if len(backlog) == BACKLOG_LIMIT:
            self.connection.hold_reading_for(self)

    def _written(self, method, ok: bool) -> None:
        """The durable changes of a method are on disk (or failed to get there): reply, then handle what waited."""
        if not self.open:
            return
        self.deliverable = True
        if self.held_for_settling:  # (the sliced work the method started holds the frames that follow, and hands
            backlog: list[tuple[int, int, bytes]] = []  # them on once done)
        else:
            backlog, self.backlog = self.backlog or [], None
        if ok:
            self._send_replies()
        else:
            self.replies = None
            self.late_reply = None
            if self.undo is not None:
                self.undo()
            self.connection.failed(AMQPError(
                INTERNAL_ERROR, f"{method.name.lower()} could not be written to disk", *divmod(method.index, 65536)), self)
        self.undo = None
        self.offer_credit({consumer.queue for consumer in self.consumers.values()})
        self.connection.replay(self, backlog)  # the connection's own path: state checks and error handling

    def _send_replies(self) -> None:
        replies, self.replies = self.replies, None
        notices, self.notices = self.notices, []
        write = self.write_now
        for data in replies or ():
            write(data)
        late, self.late_reply = self.late_reply, None
        if late is not None:
            write(encode_method(self.number, late()))
        for data in notices:
            write(data)

    def release_notices(self) -> None:
        """The reply the notices waited for is sent: they follow it."""
        self.notices_held = False
        notices, self.notices = self.notices, []
        for data in notices:
            self.write_now(data)

    def send_method_later(self, make: Callable[[], base.Frame]) -> None:
        """The reply of the method at hand, made once it is sent: its counts are a queue owner's answer, which comes
        with the ack its reply waits for (broker.model.remote.Counted)."""
        self.late_reply = make

    def write(self, data: bytes) -> None:
        """Frames of the method being handled wait with its reply; the rest go out at once."""
        if self.replies is not None:
            self.replies.append(data)
        else:
            self.write_now(data)

    def send_method(self, method) -> None:
        self.write(encode_method(self.number, method))

    # --- publishing ----------------------------------------------------------------------------------------
    def publish(self, exchange_name: str, routing_key: str, mandatory: bool, header: bytes, body: bytes) -> None:
        counters = self.counters
        counters.received += 1
        if self.confirms is not None:
            counters.received_confirm += 1
        self.publish_count += 1
        alarm = self.limits.alarm
        if alarm is not None:
            self.connection.block(alarm)  # this publish goes through; the connection is not read again until it clears
        access = self.access
        if exchange_name not in access.writable or access.version != access.node.permissions_version:
            access.check_publish(exchange_name)  # before the exchange is looked up, as in RabbitMQ
        vhost = self.vhost
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise errors.not_found(f"no exchange '{exchange_name}' in vhost '{vhost.name}'")
        if exchange.internal:
            raise internal_exchange_refusal(exchange_name, vhost.name)
        address = self.last_address
        if address.routing_key != routing_key or address.exchange != exchange_name:
            address = self.last_address = Address(exchange_name, routing_key)
        shared_header = self.last_header
        if shared_header.payload != header:
            shared_header = self.last_header = Header(header)
        message = Message(address, shared_header, body)
        flags = property_flags(header)
        if flags & EXPIRATION:
            parse_expiration(shared_header.scan.expiration or "")
        if flags & USER_ID:
            user_id = message.properties.user_id or ""
            if user_id != self.connection.user and not access.may_impersonate():
                raise user_id_refusal(user_id, self.connection.user)
        if flags & REPLY_TO and (properties := message.properties).reply_to == direct_reply.PSEUDO_QUEUE:
            properties.reply_to = direct_reply.reply_address(self)
            message = message.with_properties(properties)
        if not exchange_name and routing_key.startswith(direct_reply.REPLY_PREFIX):
            if not direct_reply.deliver_reply(vhost.reply_channels, routing_key, message) and mandatory:
                self._return_unroutable(message)
            if (confirms := self.confirms) is not None:
                confirms.settle(confirms.next_seq())
            return
        routing_keys = [routing_key]
        if message.scan.has_headers:
            message, routing_keys = _sender_selected(message, routing_key)
        if access.topics is not None:  # (the user has topic permissions in the vhost: rarely)
            access.check_published_keys(exchange, routing_keys)
        if (tx := self.tx) is not None:
            tx.publishes.append(lambda held=None: self._route(exchange, routing_keys, mandatory, message, None, held))
            return
        seq = self.confirms.next_seq() if self.confirms is not None else None
        self._route(exchange, routing_keys, mandatory, message, seq)

    def _route(self, exchange, routing_keys, mandatory, message: Message, seq: int | None,
               held: Share | None = None) -> bool:
        """Route and enqueue a message (or hold it in a delayed exchange); True when it went to durable storage or
        to queues other processes own (its confirm waits for the disk, or for their acks). A message of a commit
        across processes is held for it (held: this process's share, broker.model.transactions), which waits for
        every share itself."""
        persisted = refused = crossed = False
        if exchange.holds_delayed and (delay := delay_of(message)):
            # held, never returned: the plugin returns a mandatory one at once, though it is routed later
            persisted = exchange.delayed.hold(message, routing_keys, delay)
            self.counters.routed += 1
        elif not (queues := self.vhost.route(exchange, routing_keys, message)):
            if mandatory:
                self.counters.unroutable_returned += 1
                self._return_unroutable(message)
            else:
                self.counters.unroutable_dropped += 1
        else:
            vhost = self.vhost
            persisted, refused = vhost.publish_to(queues, message, self.connection, held)
            self.counters.routed += 1
            if held is not None:
                return persisted
            if vhost.remote_queues:
                if self.awaiting_owners is None:
                    self.awaiting_owners = {}
                crossed = vhost.note_owners(self.awaiting_owners, queues)
        if seq is not None:
            confirms = self.confirms
            assert confirms is not None, "seq is its next number"
            if refused:
                confirms.settle(seq, ack=False)  # reject-publish: the publisher is told with a nack
                seq = None
            elif not persisted and not crossed:
                confirms.settle(seq)
        if persisted or crossed:
            self._await_disk(seq, persisted)
        return persisted or crossed

    def _await_disk(self, seq: int | None, stored: bool = True) -> None:
        """Confirm seq (None without confirms) once this read's persistent publishes are on disk (stored: this one
        is) and the owners of the queues elsewhere that they went to acked them. The store callback is asked for
        right after the read's first write, so that it belongs to the same batch; the owners' acks once the read is
        processed (read_processed)."""
        awaiting = self.awaiting_disk
        vhost = self.vhost
        if awaiting is None:
            awaiting = self.awaiting_disk = []
            if not vhost.remote_queues:  # (every queue is here: the store alone, as one process has it)
                vhost.store.when_durable(lambda ok: self._on_disk(awaiting, ok))  # closed by read_processed
            else:
                self.awaiting_join = Join(lambda ok: self._on_disk(awaiting, ok))
        join = self.awaiting_join
        if join is not None and stored and not self.awaiting_store:
            self.awaiting_store = True
            vhost.store.when_durable(join.part())
        if seq is not None:
            awaiting.append(seq)

    def _return_unroutable(self, message: Message) -> None:
        self.send_method(spec.Basic.Return(NO_ROUTE, "NO_ROUTE", message.exchange, message.routing_key))
        self.write(encode_content(self.number, message.header_payload, message.body, self.frame_max))

    def read_processed(self) -> None:
        """The connection has processed a read that had frames for this channel: close the read's disk wait and
        send the confirms settled so far (rabbit_channel's next_state -> send_confirms_and_nacks)."""
        self.awaiting_disk = None
        join = self.awaiting_join
        if join is not None:
            owners = self.awaiting_owners
            self.awaiting_join, self.awaiting_owners, self.awaiting_store = None, None, False
            if owners and self.confirms is not None:  # (without confirms, nothing waits for them)
                self.vhost.when_acked(owners, join.part())
            join.seal()
        if self.confirms is not None:
            self.send_confirms()

    def send_confirms(self) -> None:
        """Write the confirms settled so far, coalesced into multiple acks."""
        write = self.write_now
        confirms = self.confirms
        assert confirms is not None, "confirm.select came first"
        for tag, multiple, is_ack in confirms.drain():
            write(encode_ack(self.number, tag, multiple) if is_ack else encode_nack(self.number, tag, multiple))

    def _on_disk(self, seqs: list[int], ok: bool) -> None:
        """The store wrote (or failed to write) a turn's persistent publishes: confirm (or nack) them."""
        if not self.open:
            return
        if self.confirms is not None:
            settle = self.confirms.settle
            for seq in seqs:
                settle(seq, ok)
            self.send_confirms()
        elif not ok:
            self.disk_failed()

    def disk_failed(self) -> None:
        self.connection.failed(errors.internal_error("persistent messages could not be written to disk"), self)

    # --- delivering ----------------------------------------------------------------------------------------
    def can_deliver(self) -> bool:
        return self.deliverable and not self.connection.write_paused

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        message = entry.message
        assert message is not None, "a live entry"
        if entry.redelivered:
            queue.redelivered += 1
        if consumer.no_ack:
            queue.delivered_consume_auto_ack += 1
            queue.forget((entry,))
        else:
            queue.delivered_consume_manual_ack += 1
            self.unacked.push(Unacked(tag, entry, queue, consumer))
            if message.msg_id and queue.stored:
                self.vhost.store.append_delivered(queue.store_key, (message.msg_id,))
            if consumer.ack_timeout < self.ack_timer.shortest:
                self.ack_timer.watch(consumer.ack_timeout)
        address = message.address
        self.write_now(encode_delivery(self.number, consumer.tag_bytes, tag, entry.redelivered,
                                       address.exchange_bytes, address.routing_key_bytes,
                                       message.header_payload, message.body, self.frame_max))

    def deliver_reply(self, message: Message) -> None:
        """A direct reply-to reply: straight to this channel's reply consumer, never acked."""
        tag = self.next_tag
        self.next_tag = tag + 1
        address = message.address
        reply_consumer = self.reply_consumer
        assert reply_consumer is not None, "replies are routed to channels that consume them"
        self.write_now(encode_delivery(self.number, reply_consumer.tag_bytes, tag, False,
                                       address.exchange_bytes, address.routing_key_bytes,
                                       message.header_payload, message.body, self.frame_max))

    # --- acknowledgements ----------------------------------------------------------------------------------
    def ack(self, tag: int, multiple: bool) -> None:
        if not multiple and self.tx is None:  # the common case, without the lists and dicts of the general one
            delivery = self.unacked.pop(tag)
            queue = delivery.queue
            queue.acknowledged += 1
            self.ack_count += 1
            if (queue.stored or queue.owner is not None) and not queue.deleted:  # (its store, or its owner, lets go)
                queue.forget((delivery.entry,))
            self.offer_credit((queue,))
            return
        self.reject(tag, multiple, None)

    def reject(self, tag: int, multiple: bool, requeue: bool | None, failed: bool = False) -> None:
        """basic.reject (failed: its requeue counts towards a delivery limit) or basic.nack (requeue True or False),
        or a multiple ack (requeue None)."""
        tx = self.tx
        # (over loop turns where they may be many: a dead-lettered one costs up to 20 µs, 4,000 held the loop 80 ms)
        if multiple and len(self.unacked) > (PIECE if requeue is False else SETTLE_SLICE):
            if tag and not self.unacked.holds(tag):
                raise errors.precondition_failed(f"unknown delivery tag {tag}")
            tag = tag or self.next_tag - 1
            self.start(Settlement(tag, requeue, failed) if tx is None
                       else TakenIntoTransaction(tx, tag, requeue, failed))
            return
        taken = self.unacked.take(tag, multiple)
        if tx is not None:
            tx.settles.append((taken, requeue, failed))  # prefetch stays taken until the commit, as in RabbitMQ
        else:
            self.unacked.release(taken)
            self.settle(taken, requeue, failed)
            if self.vhost.changed_owners:  # (queues elsewhere that may have dead-lettered some)
                self._hold_for_owners()

    def settle(self, taken: list[Unacked], requeue: bool | None, failed: bool = False) -> None:
        """Finish deliveries: acked (requeue None), requeued (failed or not), or dropped; then let consumers take
        more. Deliveries from a queue deleted meanwhile just go. A requeue follows the delayed retry of the consumer
        that had the delivery, if it set its own."""
        by_queue: dict[tuple[Queue, DelayedRetry | None], list[QueueEntry]] = {}
        for delivery in taken:
            consumer = delivery.consumer
            retry = consumer.delayed_retry if requeue and consumer is not None else None
            by_queue.setdefault((delivery.queue, retry), []).append(delivery.entry)
        for (queue, retry), entries in by_queue.items():
            if requeue is None:
                queue.acknowledged += len(entries)
                self.ack_count += len(entries)
            if not queue.deleted:
                queue.settle(entries, requeue, failed, retry)
                if requeue and not self.open and queue.owner is not None:
                    self.vhost.note_owner(self.requeued_at, queue.owner)
        self.offer_credit({queue for queue, _ in by_queue})

    def start(self, work: Slices, now: bool = True) -> None:
        """Do work on deliveries (or a get's) a slice a turn, after the work under way (settlement.py), its first
        slice at once unless now is False (then in the line of sliced work, broker.model.turns); the frames that
        follow wait meanwhile, as for a reply waiting for the disk."""
        self.settling.append(work)
        if len(self.settling) == 1:
            if now:
                self._settle_slice()
            else:
                next_turn(self._settle_slice)

    def _settle_slice(self) -> None:
        try:
            ended = self.settling[0].step(self)
        except BaseException:  # (its error closes the channel or its connection: it is over, what follows goes on)
            self.settling.popleft()
            if self.settling:
                next_turn(self._settle_slice)
            raise
        if ended:
            self.settling.popleft()
        if self.settling:
            if self.backlog is None and self.open:
                self.backlog = []
                self.held_for_settling = True
            if not self.settling[0].parked():
                next_turn(self._settle_slice)
            return
        if self.after_settling:
            after, self.after_settling = self.after_settling, []
            for done in after:
                done()
        if self.held_for_settling:
            self.held_for_settling = False
            if not self.deliverable:  # (a reply waits for the disk too: once written, it hands the frames on)
                return
            backlog, self.backlog = self.backlog or [], None
            if self.open:
                self.connection.replay(self, backlog)

    def when_settled(self, done: Callable[[], None]) -> None:
        """done() once the work on deliveries under way ends, at once if none: a closed channel's consumers leave
        their queues, and its close is answered, once its deliveries are back in them (as a RabbitMQ queue requeues
        a channel's deliveries in the step that drops its consumers, and the channel's close-ok waits for that)."""
        if self.settling:
            self.after_settling.append(done)
        else:
            done()

    def when_back(self, done: Callable[[], None]) -> None:
        """done() once a closed channel's deliveries are back in their queues: the work on them here ended
        (when_settled), and the processes that own queues some went back to acked them, so that a client of another
        process that asks after the close counts them (RabbitMQ's close-ok follows its queues' requeue)."""
        self.when_settled(lambda: self._when_owners_acked(done))

    def back(self) -> bool:
        """Whether a closed channel's deliveries are all back in their queues (when_back would call at once)."""
        return not self.settling and not self.requeued_at

    def _when_owners_acked(self, done: Callable[[], None]) -> None:
        owners = self.requeued_at
        if not owners:
            done()
            return
        vhost = self.vhost

        def acked(ok: bool) -> None:  # (not ok: an owner's link went, and what it owned with it)
            self.requeued_at = {}
            done()

        # (twice: what an owner sent the channel's consumers before it heard they were leaving came ahead of its
        # first ack, and went back to it (broker.crossing.home): the second ack covers that too)
        vhost.when_acked(owners, lambda ok: vhost.when_acked(owners, acked))

    def unpark(self) -> None:
        """The work at the head of the line waited for something else, which came: it goes on in the next turn."""
        next_turn(self._settle_slice)

    def offer_credit(self, queues) -> None:
        """Prefetch room opened up on these queues (or, where the channel-wide limit was reached, on all this channel
        consumes from: each ack under that limit walked them all, 9 ms at 10,000): let them deliver at the end of
        this loop turn."""
        unacked = self.unacked
        if unacked.reopened:  # (the settled deliveries' queues too: a cancelled consumer's may have another)
            unacked.reopened = False
            queues = {*queues, *(consumer.queue for consumer in self.consumers.values())}
        for queue in queues:
            queue.credit_offered()

    def get(self, queue: Queue, no_ack: bool) -> None:
        """basic.get: the head of the queue as get-ok with its content, or get-empty; once the expired messages ahead
        of it left, over loop turns where there are many (settlement.Get)."""
        self.start(Get(queue, no_ack))

    def answer_get(self, queue: Queue, entry: QueueEntry | None, no_ack: bool) -> None:
        """The reply to a basic.get that took entry (None: none was left)."""
        if entry is None:
            self.send_method(spec.Basic.GetEmpty())
            return
        tag = self.next_tag
        self.next_tag += 1
        message = entry.message
        assert message is not None, "take() gives live entries"
        if no_ack:
            queue.forget((entry,))
        else:
            delivery = Unacked(tag, entry, queue, None)
            self.unacked.push(delivery)
            queue.mark_delivered((entry,))
            timeout = self.ack_timeout(delivery)
            if timeout < self.ack_timer.shortest:
                self.ack_timer.watch(timeout)
        self.send_method(spec.Basic.GetOk(tag, entry.redelivered, message.exchange, message.routing_key,
                                          queue.count_ready()))
        self.write(encode_content(self.number, message.header_payload, message.body, self.frame_max))

    def ack_timeout(self, delivery: Unacked) -> int | float:
        """The ms a delivery may wait for its ack (see ack_timeout)."""
        if delivery.consumer is not None:
            return delivery.consumer.ack_timeout
        return timeout_of(None, delivery.queue, self.default_ack_timeout)

    def ack_timed_out(self, delivery: Unacked, timeout: int | float) -> None:
        """delivery waited longer than timeout for its ack: its deliveries go back (a timeout is not a failed
        delivery, as in RabbitMQ 4.3) and the channel is closed with RabbitMQ's 406."""
        log_timeout(self, delivery, timeout)
        self.requeue_all(failed=False)
        self.connection.failed(errors.precondition_failed(
            f"delivery acknowledgement on channel {self.number} timed out. Timeout value used: {timeout} ms. "
            "This timeout value can be configured, see consumers doc guide to learn more"), self)

    def select_confirms(self) -> None:
        if self.tx is not None:
            raise errors.precondition_failed("cannot switch from tx to confirm mode")
        if self.confirms is None:
            self.confirms = ConfirmTracker(self.counters)

    def select_tx(self) -> None:
        if self.confirms is not None:
            raise errors.precondition_failed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()

    def commit_tx(self) -> None:
        """tx.commit: its acks and publishes applied (settlement.Commit), then committed() answers."""
        tx = self.tx
        if tx is None:
            raise errors.precondition_failed("channel is not transactional")
        self.tx = Transaction()
        crossing = self.vhost.crossing
        if self.vhost.remote_queues and crossing is not None:
            self.start(CommitAcross(tx, crossing.begin_transaction()))
        else:
            self.start(Commit(tx))

    def committed(self, persisted: bool) -> None:
        """A commit is applied: commit-ok, after the disk has its publishes where some went there."""
        if not persisted:
            if self.open:
                self.send_method(spec.Tx.CommitOk())
            return

        def on_disk(ok: bool) -> None:
            if not self.open:
                return
            if ok:  # written directly: it answers a method older than any reply held for the disk now
                self.write_now(encode_method(self.number, spec.Tx.CommitOk()))
            else:
                self.disk_failed()

        owners, self.awaiting_owners = self.awaiting_owners, None
        self.vhost.when_durable(on_disk, owners)

    def rollback_tx(self) -> None:
        """tx.rollback: the publishes dropped, the acks undone (settlement.Rollback answers)."""
        tx = self.tx
        if tx is None:
            raise errors.precondition_failed("channel is not transactional")
        self.tx = Transaction()
        self.start(Rollback(tx, self.unacked))

    def requeue_all(self, failed: bool) -> None:
        """Every unacked delivery goes back to its queue, in original order, flagged redelivered (failed: the
        returns count towards delivery limits, as when the channel goes with them); after any settlement under
        way. A closed channel's go back in the line of sliced work (broker.model.turns) from PIECE of them, its
        first slice too: 200 channels of a connection each requeuing its 4,096 at once held the loop 0.36 s."""
        if not self.open and (len(self.unacked) > PIECE or self.settling):
            self.start(Settlement(self.next_tag - 1, True, failed), now=False)
        elif len(self.unacked) > SETTLE_SLICE or self.settling:
            self.start(Settlement(self.next_tag - 1, True, failed))
        elif self.unacked:
            taken = self.unacked.take(0, True)
            self.unacked.release(taken)
            self.settle(taken, True, failed)

    # --- consumers -----------------------------------------------------------------------------------------
    def cancel_consumer(self, consumer: Consumer) -> None:
        del self.consumers[consumer.tag]
        # (a Consumer is the queue's Subscriber, though its channel takes only Consumers where a Subscriber's target
        # takes any Subscriber: the queue hands each target back its own)
        consumer.queue.remove_consumers([consumer])  # type: ignore[list-item]

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        """The consumer's queue went away: tell a client that understands basic.cancel from the server."""
        self.consumers.pop(consumer.tag, None)
        if self.open and self.connection.client_capabilities.get("consumer_cancel_notify"):
            cancel = encode_method(self.number, spec.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))
            if self.replies is not None or self.notices_held:
                self.notices.append(cancel)  # after the reply of the method at hand (RabbitMQ's delete-ok first)
            else:
                self.write_now(cancel)

    # --- closing -------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """The channel is gone (closed, or its connection): its unacked deliveries go back to their queues, then its
        consumers leave them (when_settled)."""
        self.counters.channels_closed += 1
        self.open = False
        self.deliverable = False
        self.ack_timer.stop()
        if self.pending is not None:
            self._assembled(self.pending)
            self.pending = None
        by_queue: dict[Queue, list[Consumer]] = {}
        for consumer in self.consumers.values():
            consumer.leaving = True
            by_queue.setdefault(consumer.queue, []).append(consumer)
        self.consumers.clear()
        for queue, leaving in by_queue.items():
            queue.consumers_leave(leaving)  # type: ignore[arg-type]
            if queue.owner is not None:  # (its owner may be sending them deliveries: they go back, see when_back)
                self.vhost.note_owner(self.requeued_at, queue.owner)
        direct_reply.stop(self)
        if self.tx is not None:  # its acks undone, so that their deliveries go back with the rest
            self.start(Rollback(self.tx, self.unacked))
            self.tx = None
        self.requeue_all(failed=True)
        # (until then they stay, without credit: another client never sees them gone and their deliveries not back)
        self.when_settled(lambda: _leave(by_queue))


def _leave(by_queue: dict[Queue, list[Consumer]]) -> None:
    """A closed channel's consumers leave their queues, those not deleted meanwhile."""
    for queue, leaving in by_queue.items():
        if not queue.deleted:
            queue.remove_consumers(leaving)  # type: ignore[arg-type]


def _sender_selected(message: Message, routing_key: str) -> tuple[Message, list[str]]:
    """CC and BCC headers add routing keys; BCC is removed from what consumers see."""
    properties = message.properties
    headers = properties.headers or {}
    keys = [routing_key, *carbon_copy_keys(headers, "CC"), *carbon_copy_keys(headers, "BCC")]
    if "BCC" in headers:
        properties.headers = {key: value for key, value in headers.items() if key != "BCC"}
        message = message.with_properties(properties)
    return message, keys
