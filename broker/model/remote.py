"""A queue owned by another process of the node (a group of its own, broker.crossing), as the process that serves
its vhost sees it: a stand-in that routes, counts and consumes like any queue, its messages, dispatch, TTLs, limits
and acks being the owner's. It keeps no message: what a queue is asked here goes to the owner over a link (the
vhost's crossing), and what the owner sends back (deliveries, counts, the queue's end) comes in through it.

A delivery's entry here carries the owner's delivery id as its seq (NO_ACK_ID for a delivery the owner forgot when it
sent it), so that settling it names it at the owner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final, Iterable

from broker.model import stream
from broker.model.arguments.queue import queue_type_of
from broker.model.features.length_limit import ENQUEUED, ENQUEUED_OVER_FLOW_LIMIT, REFUSED
from broker.model.message import Message, QueueEntry
from broker.model.policy import effective_settings, merged_definition
from broker.model.queue import FLOW_HIGH, FLOW_LOW, Queue
from protocol import errors

if TYPE_CHECKING:
    from broker.model.features.redelivery import DelayedRetry
    from broker.model.interfaces import QueueCrossing, Subscriber
    from broker.model.policy import Policy
    from broker.model.vhost import VirtualHost

NO_ACK_ID: Final = -1  # the id of a delivery that needs no settling (the owner forgot it as it sent it)
# A consume's answer from the queue's owner: None (consuming), or the reply code and text it was refused with
Verdict = Callable[["tuple[int, str] | None"], None]


def leader_locator(vhost: "VirtualHost", name: str, arguments: dict) -> str | None:
    """How a new queue asks to be placed: x-queue-leader-locator, else the queue-leader-locator policy key, else
    their 3.x names (x-queue-master-locator, queue-master-locator); None: as the node's config says."""
    settings = effective_settings(arguments, merged_definition(*vhost.policies_for("queues", name)), "queues")
    locator = settings.get("queue-leader-locator", settings.get("queue-master-locator"))
    return str(locator) if locator is not None else None


class Counted:
    """A count a queue's owner answers with (what a purge or a delete dropped, what a declare finds): the stand-in's
    estimate until the answer comes, which comes before the ack the method's reply waits for."""

    __slots__ = ("value", "consumers", "queue")

    def __init__(self, value: int, queue: "RemoteQueue | None" = None):
        self.value = value
        self.consumers = 0  # the queue's consumers, wherever they are (a count's answer says)
        self.queue = queue  # the stand-in whose counts the answer renews (a count's), or None

    def answered(self, value: int, consumers: int) -> None:
        self.value, self.consumers = value, consumers
        queue = self.queue
        if queue is not None:
            queue.ready_at_owner, queue.consumers_at_owner = value, consumers


class RemoteQueue(Queue):
    def __init__(self, vhost: "VirtualHost", name: str, durable: bool, auto_delete: bool, arguments: dict,
                 owner: int, crossing: "QueueCrossing"):
        super().__init__(vhost, name, durable, None, auto_delete, arguments)
        self.owner = owner
        self.names = (vhost.name.encode(), name.encode())  # its vhost's name and its own, as a link's records hold them
        self.crossing = crossing  # how the owner is reached
        self.stored = self.stores_all = False  # (this process's store keeps none of its messages: the owner's does)
        self.ready_at_owner = 0  # ready messages, as the owner last said (ready_bytes: their body bytes)
        self.sent_since_counted = 0  # messages sent to it since (its backlog, for flow control)
        self.retrying_at_owner = 0  # returned messages waiting out a retry delay there, as it last said
        self.consumers_at_owner = 0  # its consumers there (those of every process), as it last said
        self.waiting_at_owner = False  # whether one of them waits for a message (has_waiting_consumer), as it last said
        if queue_type_of(arguments) == "stream":
            self.queue_type = "stream"  # (a stream stand-in refuses what a stream refuses: see check_consume)

    def check_reachable(self) -> None:
        """RabbitMQ's 404 for a durable queue whose node is down, while its owner cannot be reached (its link is made
        again within a tenth of a second of its end; meanwhile the owner may be starting again)."""
        owner = self.owner
        assert owner is not None, "a stand-in names its owner"
        if not self.crossing.reaches(owner):
            raise errors.not_found(f"home node '{self.crossing.name_of(owner)}' of durable queue '{self.name}' in "
                                   f"vhost '{self.vhost.name}' is down or inaccessible")

    def apply_policies(self, policy: "Policy | None", operator_policy: "Policy | None") -> None:
        """Here (its settings, for what the channel asks of it), and at the owner, which the vhost's home tells (a
        copy of the vhost applies the same policies in the same order: broker.crossing.copies)."""
        super().apply_policies(policy, operator_policy)
        if self.owner is not None and not self.vhost.copy:  # (owner: made)
            self.crossing.apply_policies(self)

    def touch(self) -> None:
        """Used (declared, consumed): the owner, which times an unused queue's expiry, starts counting again."""
        if self.owner is not None and self.unused_ttl is not None and not self.deleted:  # (owner: made)
            self.crossing.touch(self)

    def count_ready(self) -> int:
        return self.ready_at_owner

    def has_consumers(self) -> bool:
        return super().has_consumers() or self.consumers_at_owner > 0

    def has_waiting_consumer(self) -> bool:
        return self.waiting_at_owner or super().has_waiting_consumer()

    def check_consume(self, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict) -> None:
        """As its owner checks a consume (a stream's offset it checks there, cancelling a consumer that named a bad
        one)."""
        if self.queue_type == "stream":
            if "x-stream-offset" in arguments:
                stream.check_consume_arguments(self, arguments)
                stream.check_offset(self, arguments["x-stream-offset"])
            stream.check_consume(self, no_ack, prefetch, global_prefetch, arguments)
        else:
            super().check_consume(no_ack, prefetch, global_prefetch, arguments)

    def ready_as_held(self) -> int:
        return self.ready_at_owner

    def has_ready(self) -> bool:
        return self.ready_at_owner > 0

    # --- messages -----------------------------------------------------------------------------------------
    def enqueue(self, message: Message) -> int:
        """Sent to the owner with the link's next batch (a confirm waits for the owner's ack of it: the channel
        asks for it); refused while the owner cannot be reached. Over FLOW_HIGH ready there with consumers, its
        publishers wait until the owner counts fewer than FLOW_LOW, as for a queue here."""
        if not self.crossing.publish(self, message):
            return REFUSED
        self.sent_since_counted += 1
        if self.consumers and self.ready_at_owner + self.sent_since_counted > FLOW_HIGH:
            return ENQUEUED_OVER_FLOW_LIMIT
        return ENQUEUED

    def count_retrying(self) -> int:
        return self.retrying_at_owner

    def counted(self, ready: int, ready_bytes: int, retrying: int, consumers: int, waiting: bool) -> None:
        """The owner counted the queue's messages and consumers: publishers held back go on once the messages are
        few, and a consumer there that now waits for a message is news to the vhost's watcher (a federation link
        fetches for it)."""
        self.ready_at_owner, self.ready_bytes, self.sent_since_counted = ready, ready_bytes, 0
        self.retrying_at_owner, self.consumers_at_owner = retrying, consumers
        if waiting and not self.waiting_at_owner:
            self.vhost.changed("queues", self.name)
        self.waiting_at_owner = waiting
        if self.throttled and ready < FLOW_LOW:
            self.release_publishers()

    def settle(self, entries: list[QueueEntry], requeue: bool | None, failed: bool = False,
               retry: "DelayedRetry | None" = None) -> None:
        """At the owner (which follows the delayed retry of the consumer that had them, as it was told). Where that
        may dead-letter them, the channel's next method waits for the owner's ack, by which what it dead-lettered
        is routed, as a queue here routes it before the method."""
        self.crossing.settle(self, entries, requeue, failed)
        may_dead_letter = requeue is False or (requeue and self.delivery_limit is not None)
        if may_dead_letter and self.dead_letter_exchange is not None:
            self._hold_replies()

    def forget(self, entries: Iterable[QueueEntry]) -> bool:
        """Acked here: the owner lets them go (a no-ack delivery's it forgot as it sent it)."""
        acked = [entry for entry in entries if entry.seq != NO_ACK_ID]
        if acked:
            self.crossing.settle(self, acked, None, False)
        return False

    def mark_delivered(self, entries: Iterable[QueueEntry]) -> None:
        pass  # (the owner marks what it sends)

    def purge(self) -> int:
        """The owner purges it; purge-ok waits for its ack, and says the count it answers."""
        if self.queue_type == "stream":
            raise stream.purge_refused(self)
        return self._emptied_there(self.crossing.purge)

    def drop_all(self) -> int:
        """Deleted here: the owner deletes it too; delete-ok waits for its ack, and says the count it answers."""
        return self._emptied_there(self.crossing.delete)

    def _emptied_there(self, tell: "Callable[[RemoteQueue, Counted], None]") -> int:
        counted = Counted(self.ready_at_owner + self.retrying_at_owner)
        tell(self, counted)
        self.ready_at_owner = self.ready_bytes = self.retrying_at_owner = 0
        self._asked_owner(counted)
        return counted.value

    def count_there(self) -> Counted:
        """The ready messages the owner counts (a declare-ok waits for its answer)."""
        counted = Counted(self.ready_at_owner, self)
        self.crossing.count(self, counted)
        self._asked_owner(counted)
        return counted

    def _asked_owner(self, counted: Counted) -> None:
        """The method at hand's reply waits for the owner's ack, and says the count it answers."""
        self._hold_replies()
        self.vhost.counted_there = counted

    def _hold_replies(self) -> None:
        """The method at hand's reply (and the channel's next frames) wait for the owner's ack."""
        owner = self.owner
        assert owner is not None, "a stand-in names its owner"
        self.vhost.note_owner(self.vhost.changed_owners, owner)

    def take_there(self, no_ack: bool, answer: "Callable[[QueueEntry | None], None]") -> None:
        """A basic.get: the owner takes the head, and answer(entry) is called with it (None: there was none, or the
        owner could not be asked), counted here as a get."""
        if self.queue_type == "stream":
            raise stream.get_refused(self)
        self.crossing.get(self, no_ack, lambda entry: self._got(entry, no_ack, answer))

    def _got(self, entry: QueueEntry | None, no_ack: bool, answer: "Callable[[QueueEntry | None], None]") -> None:
        if entry is None:
            self.get_empty += 1
        else:
            self.redelivered += entry.redelivered
            if no_ack:
                self.delivered_get_auto_ack += 1
            else:
                self.delivered_get_manual_ack += 1
        answer(entry)

    # --- consumers ----------------------------------------------------------------------------------------
    def add_consumer(self, consumer: "Subscriber") -> None:
        self.subscribe_there(consumer, None)

    def subscribe_there(self, consumer: "Subscriber", verdict: Verdict | None) -> None:
        """A consumer of the queue, subscribed at its owner: verdict(None) once the owner took it, or verdict with
        the error it refused it with (an exclusive consumer of another process's there: RabbitMQ's 403)."""
        self._place_last_of_its_priority(consumer)
        self.crossing.subscribe(self, consumer, verdict)
        self.vhost.changed("queues", self.name)  # (as Queue.add_consumer)

    def credit_offered(self) -> None:
        if self.consumers:
            self.crossing.offer_credit(self)

    def consumers_leave(self, leaving: "list[Subscriber]") -> None:
        """The owner sends them nothing more, ahead of their deliveries' requeue (which it would send them again)."""
        if not self.deleted:
            self.crossing.leave(self, leaving)

    def remove_consumers(self, leaving: "list[Subscriber]") -> None:
        gone = set(leaving)
        self.consumers[:] = [consumer for consumer in self.consumers if consumer not in gone]
        if not self.consumers:
            self.release_publishers()
        if not self.deleted:
            self.crossing.unsubscribe(self, leaving)

    def dispatch(self) -> None:
        pass  # (the owner dispatches)
