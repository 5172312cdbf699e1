"""What a channel asks of the connection it runs on, declared here so that the session never imports the
connection layer (as model/interfaces.py declares what the model asks of the layers above it). A channel knows its
connection only as this host, and the broker only as its ChannelLimits (session.limits); the unit tests drive
channels with a host of their own and no socket. Typing only: calls stay plain method calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost
    from broker.session.channel import Channel
    from broker.session.limits import ChannelLimits
    from protocol.errors import AMQPError


class ChannelHost(Protocol):
    """The connection a channel runs on: where its frames go, who logged in, and its reading, which a channel may
    hold up (back-pressure) or hand frames back to."""

    exclusive_queues: set["Queue"]  # the exclusive queues it owns (model.interfaces.QueueOwner)

    @property
    def vhost(self) -> "VirtualHost | None":
        """The vhost connection.open chose (set before any channel opens)."""

    @property
    def user(self) -> str:
        """Who logged in."""

    @property
    def frame_max(self) -> int:
        """The negotiated frame size, which bodies are cut to."""

    @property
    def write_paused(self) -> bool:
        """The client reads too slowly: no deliveries until it catches up."""

    @property
    def client_capabilities(self) -> dict:
        """connection.start-ok's capabilities (consumer_cancel_notify ...)."""

    @property
    def limits(self) -> "ChannelLimits":
        """The broker's settings and the state its channels share."""

    def write(self, data: bytes) -> None:
        """Send frames (at the end of this loop turn, with the others)."""

    def block(self, reason: str) -> None:
        """Stop reading: a publish arrived during a resource alarm (connection.blocked with reason)."""

    def unblock(self) -> None:
        """Read again: the alarm is over (connection.unblocked)."""

    def throttle(self, queue: "Queue") -> None:
        """A queue over its flow-control limit holds this publisher back (model.interfaces.Publisher)."""

    def unthrottle(self, queue: "Queue") -> None:
        """queue no longer holds this publisher back."""

    def hold_reading_for(self, channel: "Channel") -> None:
        """channel holds many frames while a reply of its waits for the disk: read nothing more until replay."""

    def replay(self, channel: "Channel", frames: list) -> None:
        """Process the frames channel held (frame type, channel number, payload), then read again."""

    def failed(self, error: "AMQPError", channel: "Channel | None") -> None:
        """Close what error closes: channel (a soft error), or the whole connection."""

    def close_channel(self, number: int, send_close_ok: bool) -> None:
        """Forget channel number (shut down), answering channel.close-ok when asked."""
