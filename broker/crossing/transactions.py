"""Transactions across the processes of a node, at both ends of their links (broker.model.transactions has what a
process holds of one): the decisions of the transactions this process coordinates, kept in its store until every
owner has taken its share, and the shares it holds of other processes' transactions until they are decided.

An owner holds what a coordinator's link carries between a "hold" of a transaction and the next "hold" (of another,
or of none). "commit" or "abort" decides its share; where the owner holds the whole transaction, "commit" follows
the share at once, and a share that could not all be held (a queue gone) is then dropped, its frame failed. A
coordinator tells each owner as it links, first after "hello", which of its transactions that owner holds a share
of were committed, and which it is deciding ("decided"): the owner adopts the first, keeps the second for the new
link to say how each went, and drops every other share of that coordinator's that came on an earlier link or was
read back at start, as the coordinator committed none of those: it names a transaction committed only once its
decision is on disk, and gives up one whose owner's link closed before the decision was asked for."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Callable

from broker.crossing.frames import CONTROL, FrameError
from broker.model.join import Join
from broker.model.transactions import Share
from storage.definitions_log import encode_data

if TYPE_CHECKING:
    from broker.crossing.home import Crossing, OwnerLink
    from broker.model.node import Node

log = logging.getLogger(__name__)


NAME = re.compile(r"[0-9]{1,9}\.[0-9]{1,20}\.[0-9]{1,20}")  # a transaction's, as begin() makes them


def coordinator_of(name: str) -> int:
    """The process that coordinates a transaction, by its name (-1 for a name this version did not make)."""
    return int(name.partition(".")[0]) if NAME.fullmatch(name) else -1


def checked(name: object) -> str:
    """A transaction's name as a link carries it; FrameError (the link is closed) for anything else."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise FrameError(f"a malformed transaction name {str(name)[:80]!r}")
    return name


class Transactions:
    def __init__(self, crossing: Crossing) -> None:
        self.crossing = crossing
        self.started = time.time_ns()  # tells this start's transactions from an earlier start's
        self.count = 0  # transactions begun since
        self.decided: dict[str, set[int]] = {}  # committed here -> the owners that have not taken their share yet
        self.deciding: dict[str, Share] = {}  # this process's shares whose decision is being written
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
        """Every share is safe, on the links it was sent on (an owner whose link closed since dropped it when told
        it was not committed: then it is not); an owner that links again while the decision is being written is
        told to keep its share until it hears how it went."""
        if not all(self._on_its_link(share, group) for group in share.owners):
            callback(False)
            return
        self.deciding[share.name] = share
        store = self._node().store
        store.append_definition("transaction", share.name, {"name": share.name, "owners": sorted(share.owners)})
        store.when_durable(lambda ok: self._recorded(share, ok, callback))

    def _recorded(self, share: Share, ok: bool, callback: Callable[[bool], None]) -> None:
        del self.deciding[share.name]
        share.recorded = ok
        if ok:  # (only now may a link made from here on name it committed)
            self.decided[share.name] = set(share.owners)
        else:  # (taken back, so that no later write of the definitions holds it)
            self._node().store.append_definition("transaction", share.name, None)
        callback(ok)

    def _on_its_link(self, share: Share, group: int) -> bool:
        owner = self.crossing.owners[group]
        return owner.link is not None and share.links.get(group) == owner.epoch

    def commit(self, share: Share, callback: Callable[[bool], None]) -> None:
        """(An owner that linked again since the decision was written was told so as it linked.)"""
        node = self._node()
        join = Join(callback)
        if share.adopt(node):
            node.store.when_durable(join.part())
        for group in share.owners:
            if self._on_its_link(share, group):
                self._tell(group, {"op": "commit", "transaction": share.name}, [share.name], join.part())
            elif not share.recorded:
                join.part()(False)  # (one process held it all, and its link closed: how it went is not known)
        join.seal()

    def abort(self, share: Share) -> None:
        """(Before any decision was recorded: CommitAcross.)"""
        share.drop(self._node())
        for group in share.owners:
            if self._on_its_link(share, group):
                self.crossing.owners[group].control({"op": "abort", "transaction": share.name})

    def linked(self, owner: OwnerLink) -> None:
        """owner's link was just made: it is told which of this process's transactions it holds a share of were
        committed, and which are being decided (it keeps those shares for this link, which will say)."""
        group = owner.group
        names = [name for name, owners in self.decided.items() if group in owners]
        deciding = [name for name, share in self.deciding.items() if group in share.owners]
        for name in deciding:
            self.deciding[name].links[group] = owner.epoch
        self._tell(group, {"op": "decided", "transactions": names, "deciding": deciding}, names, None)

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
        write; None where it was to be adopted but some of it could not be held (a queue gone), then dropped (where
        this process holds the whole transaction, its coordinator asks for the adoption at once: it is then
        committed nowhere), or where no share of it is held here."""
        share = self.held.pop(name, None)
        if share is None:  # (a commit names only a share held for its link: none is a fault)
            return None if committed else False
        if committed and not share.failed:
            return share.adopt(self._node())
        share.drop(self._node())
        return None if committed else False

    def resolve(self, coordinator: int, committed: list[str], deciding: list[str], origin: object) -> bool:
        """Coordinator linked again (origin: its new link) and named its committed transactions, and those it is
        deciding (held on, for the new link to say): its other shares held here were not committed. Whether the
        store was given something to write."""
        wrote = False
        chosen, waiting = set(committed), set(deciding)
        for name, share in list(self.held.items()):
            if share.origin is origin or coordinator_of(name) != coordinator:
                continue
            if name in waiting:
                share.origin = origin
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
