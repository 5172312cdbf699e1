"""What one process holds of a transaction whose publishes went to queues of several processes, until it is decided:
a share. Committed on every process or on none (docs/workers.md#transactions-across-workers): each holds its share
aside, its persistent messages written under held keys of its store (storage.records.held_key) and none enqueued;
once every share is safe, the coordinator (the process of the channel) records its decision, and each then adopts
its share: one ADOPTED record per queue makes the messages the queue's, and they join it. Where one process holds
the whole transaction, it adopts it at once: that record is the commit. A share of a transaction that was not
committed is dropped. A share read back at a start waits for its coordinator's decision
(broker.crossing.transactions), or is decided at once where this process coordinated it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.model.durability import StoredToMessage
from broker.model.remote import RemoteQueue
from storage.records import HELD_PREFIX, held_key, held_parts

if TYPE_CHECKING:
    from broker.model.message import Message
    from broker.model.node import Node
    from broker.model.queue import Queue
    from broker.model.vhost import VirtualHost
    from storage.recovered_messages import RecoveredMessages
    from storage.recovery import Recovered

log = logging.getLogger(__name__)


class Share:
    __slots__ = ("name", "entries", "held", "recovered", "owners", "links", "failed", "recorded", "origin")

    def __init__(self, name: str, origin: object = None) -> None:
        self.name = name  # the transaction's: "<coordinator's group>.<its start>.<count>" (no "|": see held_key)
        # each publish held here: its vhost, the queues of this process it went to, the message, whether it was written
        self.entries: list[tuple[VirtualHost, list[Queue], Message, bool]] = []
        self.held: dict[str, list[int]] = {}  # held key -> the ids written under it
        self.recovered: dict[str, RecoveredMessages] = {}  # held key -> its messages read back at start
        self.owners: dict[int, int] = {}  # (the coordinator's) other processes sent a share -> the frame before it
        # (the coordinator's) each of those -> the link its share is held on (its number: broker.crossing.home)
        self.links: dict[int, int] = {}
        self.failed = False  # a part could not be sent, or held here: the transaction is not to be committed
        self.recorded = False  # (the coordinator's) its decision to commit was recorded: it is committed whatever comes
        self.origin = origin  # the link a participant's share is held for (None: read back at start, or its own)

    def take(self, vhost: VirtualHost, queues: list[Queue], message: Message) -> bool:
        """Hold a routed message: for this process's queues, written where publish_to would write it, under their
        held keys; for queues of other processes, sent to be held there. Whether it was written here."""
        here = []
        for queue in queues:
            if queue.owner is None:
                here.append(queue)
            else:
                crossing = vhost.crossing
                assert crossing is not None and isinstance(queue, RemoteQueue), "owners are reached across"
                self.failed = not crossing.publish_held(queue, message, self) or self.failed
        if not here:
            return False
        keys = vhost.persist(message, here, self.name) if vhost.store is not None else ()
        for key in keys:
            self.held.setdefault(key, []).append(message.msg_id)
        self.entries.append((vhost, here, message, bool(keys)))
        return bool(keys)

    def adopt(self, node: Node) -> bool:
        """Committed: what this process holds joins its queues (those deleted meanwhile drop theirs), in the order
        it was published. Whether the store was given something to write."""
        store = node.store
        gone = {held_key(self.name, queue.store_key) for _, queues, _, _ in self.entries for queue in queues
                if queue.deleted}
        for key, ids in self.held.items():
            if key in gone:
                store.append_removed(key, ids)
            else:
                store.adopt(key, held_parts(key)[1], ids)  # type: ignore[index]
        for vhost, queues, message, persisted in self.entries:
            live = [queue for queue in queues if not queue.deleted]
            if live:
                vhost.enqueue_routed(live, message, persisted)
        if self.recovered:
            by_key = {queue.store_key: queue for vhost in node.vhosts.values() for queue in vhost.queues.values()}
            as_message = StoredToMessage()
            for key, stored in self.recovered.items():
                queue = by_key.get(held_parts(key)[1])  # type: ignore[index]
                if queue is None or queue.deleted:
                    store.drop_messages(key)
                    continue
                store.adopt(key, queue.store_key, stored.ids)
                queue.restore(stored, as_message)
                if queue.consumers:
                    queue.vhost.dispatcher.mark(queue)
        written = bool(self.held or self.recovered)
        self.entries, self.held, self.recovered = [], {}, {}
        return written

    def drop(self, node: Node) -> None:
        """Not committed: what this process holds goes."""
        store = node.store
        for key, ids in self.held.items():
            store.append_removed(key, ids)
        for key in self.recovered:
            store.drop_messages(key)
        self.entries, self.held, self.recovered = [], {}, {}


def restore_shares(node: Node, recovered: Recovered) -> None:
    """At start, once the queues are restored: the shares the store read back (its held keys' messages). Those of
    transactions this process coordinated are decided now: adopted where the decision to commit was recorded (the
    stop came before every share was adopted), else dropped (it came before the decision). The others wait for their
    coordinators' decisions (broker.crossing.transactions); without other processes they are dropped."""
    shares: dict[str, Share] = {}
    messages = recovered.messages
    for key in [key for key in messages if key.startswith(HELD_PREFIX)]:
        parts = held_parts(key)
        stored = messages.pop(key)
        if parts is not None:
            shares.setdefault(parts[0], Share(parts[0])).recovered[key] = stored
    decided = {str(decision.get("name")) for decision in recovered.transactions}
    crossing = node.crossing
    own = crossing.recovered(recovered.transactions, shares) if crossing is not None else shares
    for share in own.values():
        if share.name in decided:
            share.adopt(node)
        else:
            share.drop(node)
    if own:
        log.info("%d transactions that the stop interrupted decided: %d committed, %d not", len(own),
                 sum(name in decided for name in own), sum(name not in decided for name in own))
