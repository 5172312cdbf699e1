"""What the model asks of the layers above it, declared here so that the model never imports them: queues hand
deliveries to subscribers and pause publishers; the session layer (channels, consumers) and the connection layer
implement these. They are typing only: calls stay direct method calls on the hot path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.model.message import Message, QueueEntry
    from broker.model.queue import Queue
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
    unacked: int  # deliveries sent to it and not yet settled
    arguments: dict  # those of its basic.consume

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
