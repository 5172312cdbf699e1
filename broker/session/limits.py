"""What every channel of a broker shares: its settings (ChannelLimits), the resource alarm that blocks publishers,
and the message bodies being assembled broker-wide.

Bodies in assembly are the memory a client makes the broker hold by announcing large bodies and sending them in
part (slowly, or never). They may take at most a budget (a share of the memory limit, never less than one message
of the largest size allowed). Over it, a connection sending a part of any body but the oldest one in assembly is
blocked (connection.blocked "low on memory", its socket no longer read) until the total is back within the budget:
memory stays bounded, and the oldest body can always complete, so a single legitimate message never stalls and
publishers of large messages take turns. Bodies that fit in one frame are never counted: the common publish costs
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Iterable

if TYPE_CHECKING:
    from broker.model.node import Node
    from broker.session.interfaces import ChannelHost

ASSEMBLY_SHARE = 0.5  # share of the memory limit that bodies in assembly may take


def assembly_budget(memory_limit: int, max_message_size: int) -> int:
    return max(int(memory_limit * ASSEMBLY_SHARE), max_message_size)


class BodiesInAssembly:
    def __init__(self, budget: int) -> None:
        self.budget = budget  # bytes of bodies in assembly above which connections sending parts are blocked
        self.total = 0  # body bytes received in part, over every connection
        # Bodies in assembly (the channels' pending publishes), oldest first -> [its channel's host, bytes counted]
        self.pending: dict[Hashable, list] = {}
        self.over_budget = False  # some connection was blocked for going over the budget, and not yet released

    def grew(self, pending: Hashable, connection: "ChannelHost", size: int) -> bool:
        """size more bytes of pending's body arrived (not its last part); True when its connection must be
        blocked: the total is over the budget and pending is not the oldest body in assembly."""
        entry = self.pending.get(pending)
        if entry is None:
            entry = self.pending[pending] = [connection, 0]
        entry[1] += size
        self.total += size
        if self.total <= self.budget or next(iter(self.pending)) is pending:
            return False
        self.over_budget = True
        return True

    def finished(self, pending: Hashable) -> Iterable["ChannelHost"]:
        """pending's body completed or was dropped; returns the connections that may send again."""
        entry = self.pending.pop(pending, None)
        if entry is None:
            return ()
        self.total -= entry[1]
        if not self.over_budget:
            return ()
        if self.total <= self.budget:
            self.over_budget = False
            return {connection for connection, _ in self.pending.values()}
        return (next(iter(self.pending.values()))[0],) if self.pending else ()  # the oldest may complete


class ChannelLimits:
    """The settings channels work within and the state they share, one object per broker: a channel reads these
    here, never through its connection's server."""

    def __init__(self, node: "Node", max_message_size: int, default_consumer_prefetch: int, consumer_timeout: int,
                 memory_limit: int) -> None:
        self.node = node  # the users and permissions channels check
        self.max_message_size = max_message_size  # largest body accepted (RabbitMQ's max_message_size)
        self.default_consumer_prefetch = default_consumer_prefetch  # a channel's consumer prefetch until basic.qos
        self.consumer_timeout = consumer_timeout  # ms a delivery may wait for its ack, unless its queue sets one
        # bodies received in part, on every connection, within their budget
        self.assembly = BodiesInAssembly(assembly_budget(memory_limit, max_message_size))
        # Why publishing connections are blocked now (connection.blocked's reason, e.g. "low on memory"), set by the
        # broker's resource alarms; None = they are not
        self.alarm: str | None = None
