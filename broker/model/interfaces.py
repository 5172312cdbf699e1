"""What the model asks of the layers above it, declared here so that the model never imports them: queues hand
deliveries to subscribers and pause publishers; the session layer (channels, consumers) and the connection layer
implement these. They are typing only: calls stay direct method calls on the hot path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from typing import Callable

    from broker.model.message import Message, QueueEntry
    from broker.model.queue import Queue
    from broker.model.remote import Counted, RemoteQueue, Verdict
    from broker.model.transactions import Share
    from broker.model.vhost import VirtualHost


class DeliveryTarget(Protocol):
    """Where a subscriber's deliveries go (a channel)."""

    def deliver(self, subscriber: "Subscriber", queue: "Queue", entry: "QueueEntry") -> None:
        """Send entry to subscriber; the target tracks it until it is settled."""

    def consumer_cancelled_by_server(self, subscriber: "Subscriber") -> None:
        """The subscriber's queue went away."""


class Subscriber(Protocol):
    """A subscription to a queue with credit (a consumer)."""

    priority: int  # higher-priority subscribers are served first
    exclusive: bool  # no other subscriber may join the queue
    no_ack: bool  # its deliveries are settled as they are sent
    unacked: int  # deliveries sent to it and not yet settled
    arguments: dict  # those of its basic.consume
    # Its channel closed: it stays, without credit, until the channel's deliveries are back in the queue (whoever
    # sees it gone sees them back, as RabbitMQ's queue drops a channel's consumers and requeues its deliveries in
    # one step), and holds no exclusive use meanwhile (RabbitMQ's queue answers a consume after that step)
    leaving: bool

    @property
    def channel(self) -> DeliveryTarget:
        """Where its deliveries go (read only, so that a subscriber may name a narrower kind of target)."""

    def credit(self) -> int:
        """How many more messages it may be sent right now."""


class Publisher(Protocol):
    """A source of publishes that a queue can pause while its backlog is too long (a connection)."""

    def throttle(self, queue: "Queue") -> None:
        """Stop taking publishes until every queue that throttled it released it."""

    def unthrottle(self, queue: "Queue") -> None:
        """queue no longer holds the publisher back."""


class QueueOwner(Protocol):
    """What exclusive queues belong to (a connection); they are deleted with it."""

    exclusive_queues: set["Queue"]  # its exclusive queues


class ReplyReceiver(Protocol):
    """Where direct reply-to replies go (a channel consuming amq.rabbitmq.reply-to)."""

    open: bool  # replies to a closed receiver are dropped

    def deliver_reply(self, message: "Message") -> None:
        """Send a reply to the receiver's reply consumer."""


class ParameterComponent(Protocol):
    """What runs a component's runtime parameters (the shovels, broker.shovel): it checks each value before it is
    kept, and is told of each change."""

    def check(self, vhost: str, name: str, value: object, user: str | None) -> None:
        """Raise ValueError, saying why, for a value the component cannot run, or that user (the one setting it;
        None for a definitions import) may not set."""
        ...

    def changed(self, vhost: str, name: str, value: object) -> None:
        """The parameter was set to value, or cleared (None)."""
        ...


class TopologyWatcher(Protocol):
    """What is told when a vhost's queues and exchanges may have changed in a way federation acts on
    (broker.federation): one made or deleted, its policies applied again, an exchange's bindings changed, a queue's
    consumer added. Told synchronously, in the middle of the change: it notes the name and looks later."""

    def topology_changed(self, vhost: "VirtualHost", kind: str, name: str) -> None:
        """kind: "queues" or "exchanges" (as a policy's apply-to names them)."""
        ...


class QueueCrossing(Protocol):
    """How the stand-ins of queues owned by other processes of the node (broker.model.remote) reach their owners
    (broker.crossing): each call is sent with the link's next batch, at the end of the loop turn, and answered
    later (an ack of the batch, deliveries to the subscribers)."""

    def runs(self, owner: int) -> bool:
        """Whether owner is a process of this node."""
        ...

    def reaches(self, owner: int) -> bool:
        """Whether owner can be reached now (its link is made)."""
        ...

    def name_of(self, owner: int) -> str:
        """Its node name, as the management API shows it."""
        ...

    def place(self, vhost: "VirtualHost", locator: str | None) -> int | None:
        """The process that is to own a new queue of vhost with this leader locator; None: this one."""
        ...

    def declare(self, queue: "RemoteQueue") -> None:
        """Make the queue at its owner."""

    def defined(self, vhost: "VirtualHost", kind: str, subject: Any, present: bool) -> None:
        """A definition of vhost (kind: exchange, queue, binding, policy or operator_policy; subject: the object)
        was made (present) or is gone: where this process is the vhost's home and other processes keep copies of
        it, they are told, and the method at hand's reply waits for their acks."""

    def run_at_home(self, vhost: "VirtualHost", operation: dict, answer: "Callable[[dict], None]") -> None:
        """A change of a vhost this process keeps a copy of, asked by a client here: its home runs it, and
        answer(result) follows once the copies applied it (result["error"]: [reply code, reply text] if refused)."""

    def apply_policies(self, queue: "RemoteQueue") -> None:
        """Other policies apply to it: its owner applies them too."""

    def delete(self, queue: "RemoteQueue", counted: "Counted") -> None:
        """Delete it there, with its messages (counted: what it dropped, once the owner answers)."""

    def purge(self, queue: "RemoteQueue", counted: "Counted") -> None:
        """Drop its ready messages there (counted: how many, once the owner answers)."""

    def count(self, queue: "RemoteQueue", counted: "Counted") -> None:
        """Count its ready messages there (counted: how many, once the owner answers)."""

    def touch(self, queue: "RemoteQueue") -> None:
        """It was used: its x-expires lease starts again there."""

    def publish(self, queue: "RemoteQueue", message: "Message") -> bool:
        """Send a message to the queue; False if its owner cannot be reached now."""
        ...

    def get(self, queue: "RemoteQueue", no_ack: bool, answer: "Callable[[QueueEntry | None], None]") -> None:
        """A basic.get of the queue's head: answer(entry) once the owner took it (None: none, or no owner)."""

    def subscribe(self, queue: "RemoteQueue", subscriber: "Subscriber", verdict: "Verdict | None" = None) -> None:
        """Start consuming from the queue, with the subscriber's credit (verdict: told the owner's answer)."""

    def leave(self, queue: "RemoteQueue", subscribers: "list[Subscriber]") -> None:
        """Those subscribers' channel closed: the owner sends them nothing more until they are unsubscribed."""

    def unsubscribe(self, queue: "RemoteQueue", subscribers: "list[Subscriber]") -> None:
        """Stop those subscribers (their deliveries not yet received go back to the queue at the owner)."""

    def offer_credit(self, queue: "RemoteQueue") -> None:
        """Its subscribers may take more: tell the owner what they took since."""

    def settle(self, queue: "RemoteQueue", entries: "list[QueueEntry]", requeue: bool | None, failed: bool) -> None:
        """Deliveries of the queue acked (requeue None), requeued or rejected."""

    def frame(self, owner: int) -> int:
        """The number of the frame to that owner that what is sent now goes in (0: it cannot be reached)."""
        ...

    def when_acked(self, owners: dict[int, int], callback: "Callable[[bool], None]") -> None:
        """callback(ok) once each of these owners acked what it was sent so far; ok False if one could not, or
        failed one of the frames after the one each names (where the waiting caller's first went)."""

    # transactions across processes (broker.model.transactions, broker.crossing.transactions)
    def begin_transaction(self) -> "Share":
        """A new transaction's share of this process, named for it (this process coordinates it)."""
        ...

    def publish_held(self, queue: "RemoteQueue", message: "Message", share: "Share") -> bool:
        """Send a message of the transaction to be held by the queue's owner (noted in share.owners); False if the
        owner cannot be reached now."""
        ...

    def decide(self, share: "Share", callback: "Callable[[bool], None]") -> None:
        """Every share is safe: the decision to commit, recorded where more than one process holds a share;
        callback(ok) once on disk."""

    def commit(self, share: "Share", callback: "Callable[[bool], None]") -> None:
        """Decided: this process adopts its share and every owner is told to adopt its own; callback(ok) once they
        did (on their disks and on this one's)."""

    def abort(self, share: "Share") -> None:
        """Not committed: this process's share and every owner's are dropped."""

    def recovered(self, decisions: list[dict], shares: "dict[str, Share]") -> "dict[str, Share]":
        """At start: the decisions the store kept and the shares it read back; returns the shares of this process's
        own transactions (for the caller to decide), and keeps the others until their coordinators decide."""
        ...


class VhostHome(Protocol):
    """The process that serves a vhost, as one that owns some of its queues sees it (broker.crossing): it holds
    the vhost's exchanges, and counts what its clients do."""

    group: int | None  # its process (its group), once its link said

    def dead_letter(self, vhost: str, exchange: str, keys: list[str], message: "Message", no_cycles: bool) -> None:
        """Route a message a queue here dead-lettered from its dead-letter exchange (no_cycles: not back to a queue
        its x-death history went round)."""

    def queue_deleted(self, queue: "Queue") -> None:
        """A queue here went (it expired, or auto-deleted with its last consumer)."""
