"""The side of a process that owns queues of vhosts another process serves: it listens on its link socket, and
for each process that links to it applies what comes (messages into its queues, declares, deletes, purges,
subscribers and their settlements) with the code that applies them for its own clients, acks the frames once its
store has what they wrote, and sends the deliveries to the subscribers of that process (broker.crossing.home says
what each frame holds).

A subscriber here stands for a consumer of the other process, with the credit it was given; the deliveries it was
sent wait here for their settlements, by delivery id. When the link closes (the other process ended) its
subscribers go and those deliveries are requeued, as a closed channel's are."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Final

from broker.crossing.frames import (
    ACK, ACKED, CONTROL, DEAD_LETTER, DELIVER, GOT, NOTICE, PUBLISH, FrameError, Messages, decode_ids, decode_table,
    encode_ack, encode_dead_letter, encode_delivery, encode_got, queue_of,
)
from broker.crossing import copies, forwarded
from broker.crossing.home import Crossing
from broker.crossing.link import Link
from broker.crossing.transactions import checked
from broker.model.features.redelivery import consumer_delayed_retry
from broker.model.policy import PolicyError, make_policy
from broker.model.remote import NO_ACK_ID
from broker.model.turns import next_turn, reapply_policies
from broker.model.vhost import OPERATOR_OWNER
from protocol.constants import ACCESS_REFUSED, NOT_FOUND
from protocol.errors import AMQPError
from storage.definitions_log import encode_data

if TYPE_CHECKING:
    from broker.model.features.redelivery import DelayedRetry
    from broker.model.message import Message, QueueEntry
    from broker.model.node import Node
    from broker.model.policy import Policy
    from broker.model.transactions import Share
    from broker.model.queue import Queue

log = logging.getLogger(__name__)

PLACES_KEPT: Final = 100_000  # queues looked up by a record's bytes at most (then forgotten, and looked up again)
COUNTS_INTERVAL: Final = 1.0  # seconds between two counts of every queue a linked process uses, sent to it
EPOCH_SHIFT: Final = 40  # (broker.crossing.home.EPOCH_SHIFT)


async def serve_links(listening, serving: Callable[[], "Node | None"]) -> asyncio.AbstractServer:
    """Take the links of the other processes on the listening Unix socket."""

    def make() -> Link:
        home = HomeLink(serving)
        home.link = Link(home, "a worker")
        return home.link

    return await asyncio.get_running_loop().create_unix_server(make, sock=listening)


def apply_policies(queue: "Queue", operation: dict) -> None:
    """The policy and operator policy the process that serves the queue's vhost says apply to it."""
    queue.apply_policies(_policy(operation.get("policy"), False), _policy(operation.get("operator_policy"), True))


def _policy(exported: dict | None, operator: bool) -> "Policy | None":
    if exported is None:
        return None
    return make_policy(exported["vhost"], exported["name"], exported["pattern"], exported["definition"],
                       exported["priority"], exported["apply-to"], operator)


class RemoteSubscriber:
    """A consumer of another process, as its queue here sees it (broker.model.interfaces.Subscriber)."""

    __slots__ = ("number", "home", "queue", "priority", "exclusive", "no_ack", "arguments", "unacked", "window",
                 "on_settle", "in_flight", "delayed_retry", "leaving")

    def __init__(self, number: int, home: "HomeLink", queue: "Queue", operation: dict):
        self.number = number  # its id on the link
        self.home = home
        self.queue = queue
        self.priority = int(operation.get("priority", 0))
        self.exclusive = bool(operation.get("exclusive"))
        self.no_ack = bool(operation.get("no_ack"))
        self.arguments = operation.get("arguments") or {}
        self.unacked = 0  # deliveries sent and not settled
        self.window = int(operation["window"])  # how many it may have: unsettled ones, or on their way
        self.on_settle = bool(operation.get("on_settle"))  # its credit comes back with settlements (else: grants)
        self.in_flight = 0  # deliveries sent whose credit has not come back (on_settle False)
        self.delayed_retry = consumer_delayed_retry(self.arguments)  # its own, over its queue's; None: the queue's
        # its channel closed: it takes nothing more, and holds no exclusive use, until its process cancels it once
        # the channel's deliveries are back (as a consumer of this process's)
        self.leaving = False

    @property
    def channel(self) -> "HomeLink":
        return self.home

    def credit(self) -> int:
        if self.leaving or not self.home.link.open:
            return 0
        return self.window - (self.unacked if self.on_settle else self.in_flight)


class HomeLink:
    """The link of one process that serves vhosts whose queues are here."""

    link: Link

    def __init__(self, serving: Callable[[], "Node | None"]):
        self.serving = serving  # the node of the broker this process runs (None while it runs none)
        self.applied = 0  # the frames applied (numbered as the other process numbers them)
        self.ok = True  # whether the frame being applied went well
        self.failed: list[int] = []  # the frames applied since the last ack that did not (a message refused...)
        self.wrote = False  # whether one of them gave the store something to write
        self.ack_asked = False  # an ack is due at the end of this turn
        self.acks_waiting = 0  # acks waiting for the store to write what their frames gave it
        self.id_base = 0  # the link's epoch, in the high bits of its delivery ids
        self.group: int | None = None  # the other process's (broker.model.interfaces.VhostHome)
        self.next_id = 1
        self.subscribers: dict[int, RemoteSubscriber] = {}
        # delivery id -> its queue, its entry, and the subscriber it went to (None: a get's)
        self.outstanding: dict[int, tuple[Queue, QueueEntry, RemoteSubscriber | None]] = {}
        self.used: dict[tuple[str, str], Queue] = {}  # the queues the other process used, for their counts
        self.places: dict[bytes, Queue] = {}  # those it publishes to, by their names as a record holds them
        self.touched: set[Queue] = set()  # those whose counts changed this turn
        self.messages = Messages()
        self.counting: asyncio.TimerHandle | None = None
        self.reapplying: set[asyncio.Task] = set()  # policies being applied to a copy's queues and exchanges
        self.holding: Share | None = None  # the share of a transaction that what comes next is held for

    # --- broker.crossing.link.Handler -----------------------------------------------------------------------
    def received(self, kind: int, payload: bytes) -> None:
        node = self.serving()
        if node is None:  # (stopping, or not started yet: the other process links again, and waits meanwhile)
            log.debug("closing a link from another worker: this worker serves no broker now")
            self.link.close()
            return
        self.applied += 1
        if kind == PUBLISH:
            self._published(node, payload)
        elif kind == ACKED:
            self._settle(decode_ids(payload), None, False)
        elif kind == CONTROL:
            self._control(node, decode_table(payload))
        else:
            raise FrameError(f"a frame of kind {kind} from a worker that serves a vhost")
        if not self.ok:
            self.failed.append(self.applied)
            self.ok = True
        if not self.ack_asked:
            self.ack_asked = True
            asyncio.get_running_loop().call_soon(self._ask_ack, node)
        if self.counting is None:
            self.counting = asyncio.get_running_loop().call_later(COUNTS_INTERVAL, self._count_all)

    def flushing(self) -> None:
        touched, self.touched = self.touched, set()
        counts, gone = [], []
        for queue in touched:
            if queue.deleted:
                gone.append(queue)
            else:
                counts.append([queue.vhost.name, queue.name, queue.ready_as_held(), queue.ready_bytes,
                               queue.count_retrying(), len(queue.consumers), queue.has_waiting_consumer()])
        for queue in gone:
            self.used.pop((queue.vhost.name, queue.name), None)
            self.link.send(NOTICE, encode_data({"op": "gone", "vhost": queue.vhost.name, "queue": queue.name}))
        if counts:
            self.link.send(NOTICE, encode_data({"op": "counts", "queues": counts}))

    def lost(self) -> None:
        self.holding = None  # (its shares wait for their coordinator's decision: broker.crossing.transactions)
        if self.counting is not None:
            self.counting.cancel()
        node = self.serving()
        for vhost in node.vhosts.values() if node is not None else ():
            if vhost.home is self:
                vhost.copy_ready = False  # (its clients here go on; new ones wait for the home's definitions again)
        for subscriber in self.subscribers.values():
            # (a RemoteSubscriber is the queue's Subscriber, though its target takes only RemoteSubscribers: the
            # queue hands each target back its own)
            subscriber.queue.remove_consumers([subscriber])  # type: ignore[list-item]
        self.subscribers.clear()
        self.touched.clear()  # (no one to tell)
        outstanding, self.outstanding = self.outstanding, {}
        by_queue: dict[Queue, list[QueueEntry]] = {}
        for queue, entry, _ in outstanding.values():
            queue.unacked_count -= 1
            by_queue.setdefault(queue, []).append(entry)
        for queue, entries in by_queue.items():
            if not queue.deleted:
                queue.settle(entries, True, True)  # (as a closed channel's deliveries: back, counted as failed)

    # --- acks -----------------------------------------------------------------------------------------------
    def _ask_ack(self, node: "Node") -> None:
        """Ack what was applied this turn once the store has it (acks go in order: the store's callbacks do)."""
        self.ack_asked = False
        number, failed, wrote = self.applied, self.failed, self.wrote
        self.failed, self.wrote = [], False
        if node.store is None or not (wrote or self.acks_waiting):  # (no write of theirs waits for the disk)
            self._ack(number, failed, True)
        else:
            self.acks_waiting += 1
            # (frames that wrote nothing are not failed by the disk: they only wait for the acks before them)
            node.store.when_durable(lambda stored: self._ack(number, failed, stored or not wrote, waited=True))

    def _ack(self, number: int, failed: list[int], stored: bool, waited: bool = False) -> None:
        self.acks_waiting -= waited
        if self.link.open:
            self.link.send(ACK, encode_ack(number, stored, failed))

    # --- frames ---------------------------------------------------------------------------------------------
    def _queue(self, node: "Node", vhost_name: str, name: str) -> "Queue | None":
        queue = self.used.get((vhost_name, name))
        if queue is None or queue.deleted:
            vhost = node.vhosts.get(vhost_name)
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is None:
                return None
            self._use(queue)
        return queue

    def _use(self, queue: "Queue") -> None:
        """The other process uses the queue: it is told of its counts, and, where it serves the vhost and this one
        keeps no copy of it, routes what the queue dead-letters."""
        vhost = queue.vhost
        self.used[vhost.name, queue.name] = queue
        node = self.serving()
        if not vhost.copy and node is not None and not node.serves(vhost.name):
            vhost.home = self
        self.touched.add(queue)

    # --- broker.model.interfaces.VhostHome ------------------------------------------------------------------
    def dead_letter(self, vhost: str, exchange: str, keys: list[str], message: "Message", no_cycles: bool) -> None:
        if self.link.open:  # (else it is lost, as when its dead-letter exchange is missing)
            self.link.send(DEAD_LETTER, encode_dead_letter(vhost, exchange, keys, message, no_cycles))

    def queue_deleted(self, queue: "Queue") -> None:
        """(One the other process asked to delete has left used first: only those that went by themselves.)"""
        if self.used.get((queue.vhost.name, queue.name)) is queue and self.link.open:
            self.touched.add(queue)
            self.link.wake()

    def _published(self, node: "Node", payload: bytes) -> None:
        places = self.places
        for names, vhost_length, message in self.messages.published(payload):
            queue = places.get(names)
            if queue is None or queue.deleted:
                queue = self._queue(node, *queue_of(names, vhost_length))
                if queue is not None:
                    if len(places) >= PLACES_KEPT:
                        places.clear()
                    places[names] = queue
            if queue is None:
                self.ok = False  # (its publisher is nacked)
                if self.holding is not None:
                    self.holding.failed = True  # (a transaction's share: not to be adopted)
                continue
            if self.holding is not None:
                self.wrote = self.holding.take(queue.vhost, [queue], message) or self.wrote
                continue
            persisted, refused = queue.vhost.publish_to([queue], message)
            self.wrote = self.wrote or persisted
            if refused:
                self.ok = False
            self.touched.add(queue)

    def _control(self, node: "Node", operation: dict) -> None:
        kind = operation.get("op")
        if kind == "hello":
            self.id_base = int(operation["epoch"]) << EPOCH_SHIFT
            self.group = operation.get("group")
            return
        if kind in ("define", "definitions"):
            self._copy(node, operation)
            return
        if kind in ("hold", "commit", "abort", "decided"):
            self._transaction(node, kind, operation)
            return
        if kind == "run":
            forwarded.run(node, self, operation)
            return
        if kind == "settle":
            self._settle(operation["ids"], operation["requeue"], bool(operation.get("failed")))
            return
        if kind == "leave":
            for number in operation["ids"]:
                subscriber = self.subscribers.get(number)
                if subscriber is not None:
                    subscriber.leaving = True
            return
        if kind == "cancel":
            for number in operation["ids"]:
                subscriber = self.subscribers.pop(number, None)
                if subscriber is not None:
                    subscriber.queue.remove_consumers([subscriber])  # type: ignore[list-item]
                    self.touched.add(subscriber.queue)  # (an auto-delete queue may have gone with its last one)
            return
        if kind == "watch":  # (the other process's stand-ins of queues here, as it links)
            self._watch(node, operation["vhosts"], operation["queues"])
            return
        if kind == "credit":
            for number, count in operation["grants"]:
                subscriber = self.subscribers.get(number)
                if subscriber is not None:
                    subscriber.in_flight -= count
                    subscriber.queue.credit_offered()
            return
        vhost_name, name = str(operation.get("vhost")), str(operation.get("queue"))
        self.wrote = self.wrote or kind in ("declare", "delete", "purge")  # (these may write to the store)
        try:
            if kind == "declare":
                vhost = node.vhost(vhost_name)
                queue = vhost.declare_queue(name, OPERATOR_OWNER, False, bool(operation["durable"]), False,
                                            bool(operation["auto_delete"]), operation["arguments"], placed=True)
                apply_policies(queue, operation)
                self._use(queue)
                return
            found = self._queue(node, vhost_name, name)
            if kind == "consume":
                number = int(operation["id"])
                if found is None:
                    self._refuse(number, NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '{vhost_name}'")
                    return
                subscriber = RemoteSubscriber(number, self, found, operation)
                if found.has_exclusive_consumer() or (subscriber.exclusive and found.has_consumers()):
                    # (exclusive among every process's consumers: its own process saw none of the others)
                    self._refuse(number, ACCESS_REFUSED, f"ACCESS_REFUSED - queue '{name}' in vhost '{vhost_name}' in "
                                                         "exclusive use")
                    return
                # (before any delivery to it: its process answers consume-ok first)
                self.link.send(NOTICE, encode_data({"op": "consumed", "id": number}))
                try:
                    found.add_consumer(subscriber)  # type: ignore[arg-type]
                except AMQPError:  # (a stream's offset it cannot read: the consumer is cancelled there)
                    self.link.send(NOTICE, encode_data({"op": "cancelled", "id": number}))
                    raise
                self.subscribers[number] = subscriber
            elif kind == "get":
                self._get(found, int(operation["id"]), bool(operation["no_ack"]))
            elif kind == "delete":
                count = 0
                if found is not None:
                    self.used.pop((vhost_name, name), None)
                    count = found.vhost.delete_queue(found)
                self._counted(count)
            elif kind == "count":
                self._counted(found.count_ready() if found is not None else 0,
                              len(found.consumers) if found is not None else 0)
            elif kind == "touch":
                if found is not None:
                    found.touch()
            elif kind == "purge":
                count = 0
                if found is not None:
                    count = found.purge()
                    self.touched.add(found)
                self._counted(count)
            elif kind == "policies":
                if found is not None:
                    apply_policies(found, operation)
            else:
                raise FrameError(f"unknown operation {kind!r}")
        except (AMQPError, PolicyError) as error:  # (the home checked it first: only a queue changed meanwhile)
            log.warning("could not %s queue %.200r in vhost %.200r for the worker that serves it: %s", kind, name,
                        vhost_name, error.reply_text if isinstance(error, AMQPError) else error)
            self.ok = False
            if kind in ("delete", "purge", "count"):  # (answered whatever happens: the other process waits for it)
                self._counted(0)

    def _transaction(self, node: "Node", kind: str, operation: dict) -> None:
        """What the coordinator of a transaction across processes says of it (broker.crossing.transactions)."""
        crossing = node.crossing
        assert isinstance(crossing, Crossing), "a node of workers crosses with broker.crossing"
        transactions = crossing.transactions
        if kind == "hold":
            name = operation["transaction"]
            self.holding = transactions.hold(checked(name), self) if name is not None else None
        elif kind == "decided":  # (after the hello that named the coordinator)
            coordinator = self.group if self.group is not None else -1
            self.wrote = transactions.resolve(coordinator, [checked(name) for name in operation["transactions"]],
                                              [checked(name) for name in operation["deciding"]], self) or self.wrote
        else:
            adopted = transactions.settle(checked(operation["transaction"]), kind == "commit")
            if adopted is None:
                self.ok = False  # (its coordinator is told it could not be committed here)
            self.wrote = bool(adopted) or self.wrote

    def _copy(self, node: "Node", operation: dict) -> None:
        """A change of a vhost this process keeps a copy of, or its whole definitions, from its home."""
        vhost = node.vhosts.get(str(operation["vhost"]))
        crossing = node.crossing
        if vhost is None or crossing is None or node.serves(vhost.name):  # (a vhost made or moved meanwhile)
            return
        assert isinstance(crossing, Crossing), "a node of workers crosses with broker.crossing"
        vhost.copy, vhost.home = True, self
        try:
            if operation["op"] == "definitions":
                owned = copies.replace(vhost, crossing, crossing.number, operation)
                copies.register_again(vhost, crossing, owned)
                vhost.copy_ready = True
            else:
                queue = copies.apply(vhost, crossing, crossing.number, str(operation["kind"]),
                                     bool(operation["present"]), operation["data"])
                owned = [queue] if queue is not None else []
            if operation["op"] == "definitions" or "policy" in str(operation["kind"]):
                task = asyncio.get_running_loop().create_task(reapply_policies(vhost))
                self.reapplying.add(task)
                task.add_done_callback(self.reapplying.discard)
        except (AMQPError, PolicyError, ValueError, KeyError, TypeError) as error:  # (the home made it with the same
            # checks: what a copy cannot take is a bug, said once, and the copy goes on without it)
            log.error("could not copy a definition of vhost %.200r from the worker that leads it: %s", vhost.name,
                      error.reply_text if isinstance(error, AMQPError) else repr(error))
            self.ok = False
            return
        if operation["op"] == "define" and operation["kind"] == "queue" and operation["present"]:
            data = operation["data"]
            if data["owner"] == crossing.number and data["name"] not in vhost.queues:  # (gone meanwhile: the home
                self.link.send(NOTICE, encode_data({"op": "gone", "vhost": vhost.name, "queue": data["name"]}))  # too)
        for queue in owned:
            self._use(queue)

    def _watch(self, node: "Node", vhosts: list[str], stand_ins: list[dict]) -> None:
        """The queues here that the other process has stand-ins of are used, with the policies it says apply; its
        vhosts' transient queues it has none of are gone there (it started again, which a transient queue does not
        outlive), and go here too."""
        for stand_in in stand_ins:
            queue = self._queue(node, stand_in["vhost"], stand_in["queue"])
            if queue is not None:
                apply_policies(queue, stand_in)
        named = {(stand_in["vhost"], stand_in["queue"]) for stand_in in stand_ins}
        for vhost_name in vhosts:
            vhost = node.vhosts.get(vhost_name)
            if vhost is None or node.serves(vhost_name) or vhost.copy:  # (a copy's are registered again: _copy)
                continue
            for queue in [queue for queue in vhost.queues.values()
                          if not queue.durable and (vhost_name, queue.name) not in named]:
                vhost.delete_queue(queue)

    def _refuse(self, number: int, code: int, text: str) -> None:
        """A consume of the other process's refused: its channel closes with code and text (RabbitMQ's)."""
        self.link.send(NOTICE, encode_data({"op": "refused", "id": number, "code": code, "text": text}))

    def _counted(self, count: int, consumers: int = 0) -> None:
        """The answer to a delete, a purge or a count (before the ack the other process's reply waits for); a
        count's says the queue's consumers too, wherever they are."""
        self.link.send(NOTICE, encode_data({"op": "counted", "count": count, "consumers": consumers}))

    def _get(self, queue: "Queue | None", request: int, no_ack: bool) -> None:
        """The queue's head for a basic.get (once the expired messages ahead of it left, over turns if many)."""
        if not self.link.open:
            return
        entry = None if queue is None or queue.deleted else queue.take(no_ack)
        if entry is None and queue is not None and queue.take_again():
            next_turn(lambda: self._get(queue, request, no_ack))
            return
        delivery = b""
        if entry is not None:
            assert queue is not None and entry.message is not None, "taken from a queue: a live entry"
            delivery_id = self._delivery_id(queue, entry, None) if not no_ack else NO_ACK_ID
            if no_ack:
                queue.forget((entry,))
            delivery = encode_delivery(0, delivery_id, entry.redelivered, entry.message)
            self.touched.add(queue)
        self.link.send(GOT, encode_got(request, queue.count_ready() if queue is not None else 0, delivery))

    def _delivery_id(self, queue: "Queue", entry: "QueueEntry", subscriber: RemoteSubscriber | None) -> int:
        """A new delivery of entry, awaiting its settlement: its id."""
        delivery_id = self.id_base | self.next_id
        self.next_id += 1
        self.outstanding[delivery_id] = (queue, entry, subscriber)
        queue.unacked_count += 1
        queue.mark_delivered((entry,))
        return delivery_id

    def _settle(self, ids: list[int], requeue: bool | None, failed: bool) -> None:
        """Deliveries acked (requeue None), requeued or rejected, by their ids; a requeue follows the delayed retry of
        the consumer that had them, if it set one (as a channel's settle does)."""
        by_queue: dict[tuple[Queue, DelayedRetry | None], list[QueueEntry]] = {}
        for delivery_id in ids:
            found = self.outstanding.pop(delivery_id, None)
            if found is None:
                continue
            queue, entry, subscriber = found
            retry = None
            if subscriber is not None:
                subscriber.unacked -= 1
                retry = subscriber.delayed_retry if requeue else None
            queue.unacked_count -= 1
            by_queue.setdefault((queue, retry), []).append(entry)
        for (queue, retry), entries in by_queue.items():
            self.wrote = self.wrote or queue.stored
            if not queue.deleted:
                queue.settle(entries, requeue, failed, retry)
                queue.credit_offered()
            self.touched.add(queue)

    def _count_all(self) -> None:
        """Every used queue's counts, now and then (its messages expire, it may have deleted itself)."""
        self.counting = None
        if self.link.open and self.used:
            self.touched.update(self.used.values())
            self.link.wake()
            self.counting = asyncio.get_running_loop().call_later(COUNTS_INTERVAL, self._count_all)

    # --- broker.model.interfaces.DeliveryTarget -------------------------------------------------------------
    def deliver(self, subscriber: RemoteSubscriber, queue: "Queue", entry: "QueueEntry") -> None:
        message = entry.message
        assert message is not None, "a live entry"
        if subscriber.no_ack:
            queue.forget((entry,))
            delivery_id = NO_ACK_ID
        else:
            delivery_id = self._delivery_id(queue, entry, subscriber)
            subscriber.unacked += 1
        if not subscriber.on_settle:
            subscriber.in_flight += 1
        self.link.add(DELIVER, encode_delivery(subscriber.number, delivery_id, entry.redelivered, message))
        self.touched.add(queue)

    def consumer_cancelled_by_server(self, subscriber: RemoteSubscriber) -> None:
        if self.subscribers.pop(subscriber.number, None) is not None and self.link.open:
            self.link.send(NOTICE, encode_data({"op": "cancelled", "id": subscriber.number}))
