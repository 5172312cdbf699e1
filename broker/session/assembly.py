"""Message bodies being assembled, broker-wide: the memory a client makes the broker hold by announcing large
bodies and sending them in part (slowly, or never).

Bodies in assembly may take at most a budget (a share of the memory limit, never less than one message of the
largest size allowed). Over it, a connection sending a part of any body but the oldest one in assembly is blocked
(connection.blocked "low on memory", its socket no longer read) until the total is back within the budget: memory
stays bounded, and the oldest body can always complete, so a single legitimate message never stalls and publishers
of large messages take turns. Bodies that fit in one frame are never counted: the common publish costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Iterable

if TYPE_CHECKING:
    from broker.connection.connection import Connection

ASSEMBLY_SHARE = 0.5  # share of the memory limit that bodies in assembly may take


def assembly_budget(memory_limit: int, max_message_size: int) -> int:
    return max(int(memory_limit * ASSEMBLY_SHARE), max_message_size)


class BodiesInAssembly:
    def __init__(self) -> None:
        self.total = 0  # body bytes received in part, over every connection
        # Bodies in assembly (the channels' pending publishes), oldest first -> [connection, bytes counted]
        self.pending: dict[Hashable, list] = {}
        self.over_budget = False  # some connection was blocked for going over the budget, and not yet released

    def grew(self, pending: Hashable, connection: "Connection", size: int, budget: int) -> bool:
        """size more bytes of pending's body arrived (not its last part); True when its connection must be
        blocked: the total is over the budget and pending is not the oldest body in assembly."""
        entry = self.pending.get(pending)
        if entry is None:
            entry = self.pending[pending] = [connection, 0]
        entry[1] += size
        self.total += size
        if self.total <= budget or next(iter(self.pending)) is pending:
            return False
        self.over_budget = True
        return True

    def finished(self, pending: Hashable, budget: int) -> Iterable["Connection"]:
        """pending's body completed or was dropped; returns the connections that may send again."""
        entry = self.pending.pop(pending, None)
        if entry is None:
            return ()
        self.total -= entry[1]
        if not self.over_budget:
            return ()
        if self.total <= budget:
            self.over_budget = False
            return {connection for connection, _ in self.pending.values()}
        return (next(iter(self.pending.values()))[0],) if self.pending else ()  # the oldest may complete
