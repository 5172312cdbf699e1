"""Transactions across the processes of a node, at both ends of their links (broker.model.transactions has what a
process holds of one): the decisions of the transactions this process coordinates, kept in its store until every
owner has taken its share, and the shares it holds of other processes' transactions until they are decided.

An owner holds what a coordinator's link carries between a "hold" of a transaction and the next "hold" (of another,
or of none). "commit" or "abort" decides its share; where the owner holds the whole transaction, "commit" follows
the share at once, and a share that could not all be held (a queue gone) is then dropped, its frame failed. A coordinator tells each owner as it links, first after "hello",
which of its transactions that owner holds a share of were committed ("decided"): the owner adopts those shares, and
drops every other share of that coordinator's that came on an earlier link or was read back at start, as the
coordinator decided to commit none of those (it records a decision before any owner hears of it, and gives up a
transaction whose owner's link closes before it is decided)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from broker.crossing.frames import CONTROL
from broker.model.join import Join
from broker.model.transactions import Share
from storage.definitions_log import encode_data

if TYPE_CHECKING:
    from broker.crossing.home import Crossing, OwnerLink
    from broker.model.node import Node

log = logging.getLogger(__name__)


def coordinator_of(name: str) -> int:
    """The process that coordinates a transaction, by its name (-1 for a name this version did not make)."""
    head = name.partition(".")[0]
    return int(head) if head.isdigit() else -1


class Transactions:
    def __init__(self, crossing: Crossing) -> None:
        self.crossing = crossing
        self.started = time.time_ns()  # tells this start's transactions from an earlier start's
        self.count = 0  # transactions begun since
        self.decided: dict[str, set[int]] = {}  # committed here -> the owners that have not taken their share yet
        self.held: dict[str, Share] = {}  # shares of other processes' transactions, until they are decided

    def _node(self) -> Node:
        node = self.crossing.node
        assert node is not None, "transactions are a running broker's"
        return node

    # --- the coordinator's end ------------------------------------------------------------------------------
    def begin(self) -> Share:
        self.count += 1
        return Share(f"{self.crossing.number}.{self.started}.{self.count}")

    def decide(self, share: Share, callback: Callable[[bool], None]) -> None:
        self.decided[share.name] = set(share.owners)
        store = self._node().store
        store.append_definition("transaction", share.name, {"name": share.name, "owners": sorted(share.owners)})
        store.when_durable(lambda ok: self._recorded(share, ok, callback))

    def _recorded(self, share: Share, ok: bool, callback: Callable[[bool], None]) -> None:
        share.recorded = ok
        callback(ok)

    def commit(self, share: Share, callback: Callable[[bool], None]) -> None:
        node = self._node()
        join = Join(callback)
        if share.adopt(node):
            node.store.when_durable(join.part())
        for group in share.owners:
            self._tell(group, {"op": "commit", "transaction": share.name}, [share.name], join.part())
        join.seal()

    def abort(self, share: Share) -> None:
        """(Where the decision could not be written, it is taken back.)"""
        node = self._node()
        share.drop(node)
        if self.decided.pop(share.name, None) is not None:
            node.store.append_definition("transaction", share.name, None)
        for group in share.owners:
            self.crossing.owners[group].control({"op": "abort", "transaction": share.name})

    def linked(self, owner: OwnerLink) -> None:
        """owner's link was just made: it is told which of this process's transactions it holds a share of were
        committed."""
        names = [name for name, owners in self.decided.items() if owner.group in owners]
        self._tell(owner.group, {"op": "decided", "transactions": names}, names, None)

    def _tell(self, group: int, operation: dict, names: list[str], callback: Callable[[bool], None] | None) -> None:
        """Send a decision to owner group; once it acked it, it has taken its shares of these transactions."""
        owner = self.crossing.owners[group]
        link = owner.link
        if link is None:
            if callback is not None:
                callback(False)
            return
        link.send(CONTROL, encode_data(operation))
        owner.when_acked(link.sent - 1, lambda ok: self._told(group, names, ok, callback))

    def _told(self, group: int, names: list[str], ok: bool, callback: Callable[[bool], None] | None) -> None:
        if ok:
            for name in names:
                owners = self.decided.get(name)
                if owners is None:
                    continue
                owners.discard(group)
                if not owners:  # every share adopted: the decision is no longer needed
                    del self.decided[name]
                    self._node().store.append_definition("transaction", name, None)
        if callback is not None:
            callback(ok)

    # --- an owner's end -------------------------------------------------------------------------------------
    def hold(self, name: str, origin: object) -> Share:
        """The share of a transaction that what comes next on the link origin is for."""
        share = self.held.get(name)
        if share is None:
            share = self.held[name] = Share(name, origin)
        return share

    def settle(self, name: str, committed: bool) -> bool | None:
        """The coordinator decided: the share is adopted or dropped. Whether the store was given something to
        write; None where it was to be adopted but some of it could not be held (a queue gone): then it is dropped
        (where this process holds the whole transaction, its coordinator asks for the adoption at once, so the
        transaction is then committed nowhere)."""
        share = self.held.pop(name, None)
        if share is None:
            return False
        if committed and not share.failed:
            return share.adopt(self._node())
        share.drop(self._node())
        return None if committed else False

    def resolve(self, coordinator: int, committed: list[str], origin: object) -> bool:
        """Coordinator linked again (origin: its new link) and named its committed transactions: its other shares
        held here were not committed. Whether the store was given something to write."""
        wrote = False
        chosen = set(committed)
        for name, share in list(self.held.items()):
            if share.origin is origin or coordinator_of(name) != coordinator:
                continue
            wrote = bool(self.settle(name, name in chosen)) or wrote
        return wrote

    def recovered(self, decisions: list[dict], shares: dict[str, Share]) -> dict[str, Share]:
        for decision in decisions:
            owners = decision.get("owners")
            self.decided[str(decision.get("name"))] = {group for group in owners if isinstance(group, int)} \
                if isinstance(owners, list) else set()
        own = {}
        for name, share in shares.items():
            if coordinator_of(name) == self.crossing.number:
                own[name] = share
            else:
                self.held[name] = share
        if self.held:
            log.info("%d shares of transactions of other workers read back: held until those workers say how each "
                     "was decided", len(self.held))
        return own
