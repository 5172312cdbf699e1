"""The side of the process that serves a vhost's clients (its home): the stand-ins of the vhost's queues that other
processes own (broker.model.remote) reach them here, over one link per owner, which this process dials.

What goes to an owner: batches of messages (PUBLISH), batches of acks (ACKED), and operations (CONTROL: declare,
delete, purge, consume, cancel, settle, credit, and those of transactions: broker.crossing.transactions). What comes
back: ACKs of those frames (once the owner applied them and its store has them on disk), deliveries, and notices (a
subscriber cancelled, a queue gone, queues' counts).

Credit: a subscriber with a prefetch below WINDOW gets its prefetch as a window at the owner, which its settlements
give back; any other (no ack, or no limit) gets WINDOW, which comes back as its deliveries are written to its
client, so that a slow client holds its deliveries at the owner rather than here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Final

from broker.crossing.frames import (
    ACK, ACKED, CONTROL, DEAD_LETTER, DELIVER, GOT, ID, NOTICE, PUBLISH, FrameError, Messages, decode_ack,
    decode_dead_letter, decode_got, decode_table, encode_message,
)
from broker.crossing import copies
from broker.crossing.link import Link
from broker.crossing.transactions import Transactions
from broker.model.features.dead_letter import republish
from broker.model.join import Join
from broker.model.message import QueueEntry
from broker.model.remote import NO_ACK_ID, Counted, RemoteQueue, Verdict
from broker.model.transactions import Share
from protocol.constants import INTERNAL_ERROR
from storage.definitions_log import encode_data

if TYPE_CHECKING:
    from broker.model.interfaces import Subscriber
    from broker.model.queue import Queue
    from broker.model.message import Message
    from broker.model.node import Node
    from broker.model.vhost import VirtualHost

log = logging.getLogger(__name__)

WINDOW: Final = 1000  # deliveries a subscriber without a smaller prefetch may have on their way to it
DIAL_RETRY: Final = 0.1  # seconds between attempts to reach an owner's link socket
EPOCH_SHIFT: Final = 40  # a delivery id holds the link's epoch above these bits (see OwnerLink.epoch)
CLIENT_LOCAL: Final = "client-local"  # RabbitMQ's leader locator that keeps a queue with its declaring client
FAILED_KEPT: Final = 100_000  # frames back that a failed one is remembered for the waits that name them
COPY_CHECK: Final = 1.0  # seconds between two looks for vhosts led here that the other processes have no copy of


class Crossing:
    """broker.model.interfaces.QueueCrossing for one process: its links to the other processes of the node."""

    def __init__(self, number: int, paths: dict[int, str], default_locator: str, name_of: Callable[[int], str],
                 spread: bool = False):
        self.number = number  # this process's group
        self.name_of = name_of  # a process's node name, by its group
        self.default_locator = default_locator  # the locator of a queue that names none ([queues] leader_locator)
        self.spread = spread  # each process keeps a copy of each vhost and serves its clients (broker.crossing.copies)
        self.owners = {group: OwnerLink(self, group, path) for group, path in paths.items()}
        self.node: Node | None = None  # the node of the broker this process runs, once it runs one
        self.gone: RemoteQueue | None = None  # a stand-in being deleted because its owner deleted the queue
        self.transactions = Transactions(self)  # those across processes, at either end

    def start(self) -> list[asyncio.Task]:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(owner.keep_linked()) for owner in self.owners.values()]
        if self.spread:
            tasks.append(loop.create_task(self._copy_new_vhosts()))
        return tasks

    async def _copy_new_vhosts(self) -> None:
        """A vhost this process came to lead after its links were made (one made since) is copied to them too."""
        while True:
            await asyncio.sleep(COPY_CHECK)
            for owner in self.owners.values():
                owner.copy_vhosts()

    def _owner_of(self, queue: RemoteQueue) -> "OwnerLink":
        owner = queue.owner
        assert owner is not None, "a stand-in names its owner"
        return self.owners[owner]

    # --- broker.model.interfaces.QueueCrossing ----------------------------------------------------------------
    def runs(self, owner: int) -> bool:
        return owner in self.owners

    def reaches(self, owner: int) -> bool:
        return self.owners[owner].link is not None

    def place(self, vhost: "VirtualHost", locator: str | None) -> int | None:
        """client-local: the process of the declaring client (here, unless a copy's client asked). balanced (and its
        deprecated names): the process owning the fewest of the vhost's queues, this one first among equals, then
        the lowest number."""
        if (locator or self.default_locator) == CLIENT_LOCAL:
            return vhost.placing_for
        counts = {self.number: 0, **{group: 0 for group, owner in self.owners.items() if owner.link is not None}}
        for queue in vhost.queues.values():
            group = queue.owner if queue.owner is not None else self.number
            if group in counts:
                counts[group] += 1
        chosen = min(counts, key=lambda group: (counts[group], group != self.number, group))
        return None if chosen == self.number else chosen

    def declare(self, queue: RemoteQueue) -> None:
        self._owner_of(queue).control({"op": "declare", "vhost": queue.vhost.name, "queue": queue.name,
                                       "durable": queue.durable, "auto_delete": queue.auto_delete,
                                       "arguments": queue.arguments, **policies_of(queue)})

    def defined(self, vhost: "VirtualHost", kind: str, subject: Any, present: bool) -> None:
        node = self.node
        if not self.spread or node is None or not node.serves(vhost.name):
            return
        operation = {"op": "define", "vhost": vhost.name, "kind": kind, "present": present,
                     "data": copies.definition_of(vhost, kind, subject, self.number)}
        for group, owner in self.owners.items():
            if owner.link is not None:
                owner.control(operation)
                vhost.note_owner(vhost.changed_owners, group)  # (the method's reply waits for every copy)

    def run_at_home(self, vhost: "VirtualHost", operation: dict, answer: Callable[[dict], None]) -> None:
        """A copy's client changes the vhost's definitions: its home runs it (broker.crossing.forwarded), and
        answer(result) is called once every copy applied it (result["error"]: [code, text] when it was refused)."""
        home = vhost.home
        group = home.group if home is not None else None
        if group is None or group not in self.owners:
            asyncio.get_running_loop().call_soon(answer, unreachable(vhost.name))
            return
        self.owners[group].run({**operation, "vhost": vhost.name}, answer)

    def apply_policies(self, queue: RemoteQueue) -> None:
        self._owner_of(queue).control({"op": "policies", "vhost": queue.vhost.name, "queue": queue.name,
                                       **policies_of(queue)})

    def delete(self, queue: RemoteQueue, counted: Counted) -> None:
        self._owner_of(queue).forget(queue)  # (its consumers here were cancelled with it)
        if queue is not self.gone:
            self._owner_of(queue).ask({"op": "delete", "vhost": queue.vhost.name, "queue": queue.name}, counted)

    def purge(self, queue: RemoteQueue, counted: Counted) -> None:
        self._owner_of(queue).ask({"op": "purge", "vhost": queue.vhost.name, "queue": queue.name}, counted)

    def count(self, queue: RemoteQueue, counted: Counted) -> None:
        self._owner_of(queue).ask({"op": "count", "vhost": queue.vhost.name, "queue": queue.name}, counted)

    def touch(self, queue: RemoteQueue) -> None:
        self._owner_of(queue).control({"op": "touch", "vhost": queue.vhost.name, "queue": queue.name})

    def publish(self, queue: RemoteQueue, message: "Message") -> bool:
        owner = self._owner_of(queue)
        link = owner.link
        if link is None:
            return False
        if owner.holding is not None:
            owner.hold(None)
        vhost_name, queue_name = queue.names
        link.add(PUBLISH, encode_message(vhost_name, queue_name, message))
        return True

    # --- transactions across processes (broker.crossing.transactions) --------------------------------------
    def begin_transaction(self) -> Share:
        return self.transactions.begin()

    def publish_held(self, queue: RemoteQueue, message: "Message", share: Share) -> bool:
        owner = self._owner_of(queue)
        link = owner.link
        if link is None or share.links.setdefault(owner.group, owner.epoch) != owner.epoch:
            return False  # (its share is not held there, or was sent on a link since closed: dropped there)
        if owner.holding != share.name:
            owner.hold(share.name)
        vhost_name, queue_name = queue.names
        link.add(PUBLISH, encode_message(vhost_name, queue_name, message))
        if owner.group not in share.owners:
            share.owners[owner.group] = link.last_number() - 1
        return True

    def decide(self, share: Share, callback: Callable[[bool], None]) -> None:
        self.transactions.decide(share, callback)

    def commit(self, share: Share, callback: Callable[[bool], None]) -> None:
        self.transactions.commit(share, callback)

    def abort(self, share: Share) -> None:
        self.transactions.abort(share)

    def recovered(self, decisions: list[dict], shares: dict[str, Share]) -> dict[str, Share]:
        return self.transactions.recovered(decisions, shares)

    def get(self, queue: RemoteQueue, no_ack: bool, answer: Callable[[QueueEntry | None], None]) -> None:
        self._owner_of(queue).get(queue, no_ack, answer)

    def subscribe(self, queue: RemoteQueue, subscriber: "Subscriber", verdict: Verdict | None = None) -> None:
        self._owner_of(queue).subscribe(queue, subscriber, verdict)

    def leave(self, queue: RemoteQueue, subscribers: "list[Subscriber]") -> None:
        self._owner_of(queue).leave(subscribers)

    def unsubscribe(self, queue: RemoteQueue, subscribers: "list[Subscriber]") -> None:
        self._owner_of(queue).unsubscribe(subscribers)

    def offer_credit(self, queue: RemoteQueue) -> None:
        self._owner_of(queue).offer_credit(queue)

    def settle(self, queue: RemoteQueue, entries: list[QueueEntry], requeue: bool | None, failed: bool) -> None:
        self._owner_of(queue).settle(entries, requeue, failed)

    def frame(self, owner: int) -> int:
        link = self.owners[owner].link
        return link.last_number() if link is not None else 0

    def when_acked(self, owners: dict[int, int], callback: Callable[[bool], None]) -> None:
        join = Join(callback)
        for group, before in owners.items():
            self.owners[group].when_acked(before, join.part())
        join.seal()

    # --- what owners say ------------------------------------------------------------------------------------
    def stand_in(self, vhost_name: str, name: str) -> RemoteQueue | None:
        vhost = self.node.vhosts.get(vhost_name) if self.node is not None else None
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if isinstance(queue, RemoteQueue) else None

    def served(self) -> list[str]:
        """The vhosts this process leads."""
        return [vhost.name for vhost in self.served_vhosts()]

    def served_vhosts(self) -> list["VirtualHost"]:
        node = self.node
        return [vhost for name, vhost in node.vhosts.items() if node.serves(name)] if node is not None else []

    def stand_ins_of(self, group: int) -> list[dict]:
        """Each stand-in of a queue that group owns: its vhost, its name and the policies that apply to it."""
        vhosts = self.node.vhosts.values() if self.node is not None else ()
        return [{"vhost": vhost.name, "queue": queue.name, **policies_of(queue)}
                for vhost in vhosts for queue in vhost.queues.values() if queue.owner == group]

    def dead_lettered(self, table: dict, message: "Message") -> None:
        """A message a queue of another process dead-lettered: routed here, where the vhost's exchanges are."""
        vhost = self.node.vhosts.get(table["vhost"]) if self.node is not None else None
        if vhost is not None:
            deaths = None
            if table["no_cycles"]:
                history = (message.properties.headers or {}).get("x-death")
                deaths = [death for death in history if isinstance(death, dict)] if isinstance(history, list) else []
            republish(vhost, table["exchange"], table["keys"], message, deaths)

    def transient_gone(self, group: int) -> None:
        """That owner ended: its transient queues are gone with it (as RabbitMQ's of a node that went down); from a
        copy of a vhost, when its home says so."""
        vhosts = list(self.node.vhosts.values()) if self.node is not None else []
        for vhost in vhosts:
            if vhost.copy:
                continue
            for queue in [queue for queue in vhost.queues.values() if queue.owner == group and not queue.durable]:
                assert isinstance(queue, RemoteQueue), "a queue with an owner is a stand-in"
                self.queue_gone(queue)

    def queue_gone(self, queue: RemoteQueue) -> None:
        """Its owner deleted it (x-expires, auto-delete): so does its vhost here, without telling the owner again."""
        self.gone = queue
        try:
            queue.vhost.delete_queue(queue)
        finally:
            self.gone = None


def unreachable(vhost: str) -> dict:
    """The answer to a copy's change while the vhost's home cannot be reached (RabbitMQ's for a vhost that is down)."""
    return {"error": [INTERNAL_ERROR, f"INTERNAL_ERROR - the worker that orders the definitions of vhost '{vhost}' "
                                      "cannot be reached now; try again"]}


def policies_of(queue: "Queue") -> dict:
    """The policy and operator policy that apply to a queue (its owner holds none of its vhost's)."""
    return {"policy": queue.policy.export() if queue.policy is not None else None,
            "operator_policy": queue.operator_policy.export() if queue.operator_policy is not None else None}


class OwnerLink:
    """This process's link to one owner: what it sent that is not acked yet, and the subscribers it registered
    there. The link is dialled again whenever it closes (the owner's socket waits for it while the owner restarts);
    each new link has a new epoch, which the owner puts in its delivery ids, so that a settlement of a delivery of
    an earlier link (requeued by the owner when that link closed) is not sent."""

    def __init__(self, crossing: Crossing, group: int, path: str):
        self.crossing = crossing
        self.group = group  # the owner's
        self.path = path  # its link socket
        self.link: Link | None = None  # while linked
        self.epoch = 0  # counts the links made
        self.acked = 0  # the number of the last frame the owner acked on this link
        # (the frame before those it is for, the last of them, callback) of each wait for acks, in the order made
        self.waiters: deque[tuple[int, int, Callable[[bool], None]]] = deque()
        # frames the owner said failed, of the last FAILED_KEPT (a wait names the frame its caller's first went in)
        self.failed: deque[int] = deque()
        self.subscribers: dict[int, tuple[RemoteQueue, Subscriber]] = {}  # id -> its stand-in and subscriber
        self.ids: dict[Subscriber, int] = {}  # subscriber -> its id
        self.verdicts: dict[int, Verdict] = {}  # id of a subscriber whose consume waits for the owner's verdict
        self.next_id = 1
        self.returns_on_write: dict[int, int] = {}  # id of a subscriber whose credit comes back as it is written ->
        # deliveries written to it since its credit last went back
        self.grants: dict[int, int] = {}  # credit to give back with this turn's frames, by subscriber id
        self.counting: deque[Counted] = deque()  # the counts asked for and not answered yet, in order
        self.gets: dict[int, tuple[RemoteQueue, Callable[[QueueEntry | None], None]]] = {}  # asked, by their ids
        self.next_get = 1
        self.copied: set[str] = set()  # the vhosts led here whose whole the other process was sent on this link
        # the definitions changes this process's clients asked for, by id: their vhost's name, and the answer's callback
        self.runs: dict[int, tuple[str, Callable[[dict], None]]] = {}
        self.next_run = 1
        self.messages = Messages()
        self.closed: asyncio.Event | None = None
        self.holding: str | None = None  # the transaction the owner holds what comes next on the link for

    async def keep_linked(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                _, link = await loop.create_unix_connection(lambda: Link(self, f"worker {self.group}"), self.path)
            except OSError:
                await asyncio.sleep(DIAL_RETRY)
                continue
            self.epoch += 1
            self.acked = 0
            self.closed = asyncio.Event()
            self.link = link
            link.send(CONTROL, encode_data({"op": "hello", "epoch": self.epoch, "group": self.crossing.number}))
            self.holding = None
            self.crossing.transactions.linked(self)
            self.control({"op": "watch", "vhosts": self.crossing.served(),
                          "queues": self.crossing.stand_ins_of(self.group)})
            self.copied = set()
            self.copy_vhosts()
            await self.closed.wait()
            await asyncio.sleep(DIAL_RETRY)

    def control(self, operation: dict) -> None:
        if self.link is not None:
            self.link.send(CONTROL, encode_data(operation))

    def hold(self, transaction: str | None) -> None:
        """What comes next on the link is for the owner to hold for this transaction (None: to take as it comes)."""
        self.control({"op": "hold", "transaction": transaction})
        self.holding = transaction

    def ask(self, operation: dict, counted: Counted) -> None:
        """An operation the owner answers with a count (a notice, in the order they were asked)."""
        if self.link is not None:
            self.counting.append(counted)
            self.control(operation)

    def copy_vhosts(self) -> None:
        """Send the whole of each vhost this process leads that the other process has no copy of yet."""
        if self.link is None or not self.crossing.spread:
            return
        for vhost in self.crossing.served_vhosts():
            if vhost.name not in self.copied:
                self.copied.add(vhost.name)
                self.control(copies.whole(vhost, self.crossing.number))

    def run(self, operation: dict, answer: Callable[[dict], None]) -> None:
        """A change of a vhost's definitions, run by this process, its home (see Crossing.run_at_home)."""
        if self.link is None:
            asyncio.get_running_loop().call_soon(answer, unreachable(str(operation["vhost"])))
            return
        number = self.next_run
        self.next_run += 1
        self.runs[number] = (str(operation["vhost"]), answer)
        self.control({**operation, "op": "run", "id": number})

    # --- acks -----------------------------------------------------------------------------------------------
    def when_acked(self, before: int, callback: Callable[[bool], None]) -> None:
        """callback(ok) once the owner acked every frame made so far on this link: ok unless the link closed, the
        owner's store failed, or a frame after before failed (a message refused, an operation the owner could not
        apply). The batch being gathered is closed, so that what comes next is in frames of its own."""
        link = self.link
        if link is None:
            callback(False)
            return
        link.cut()
        if link.sent <= self.acked:
            callback(not any(frame > before for frame in self.failed))
        else:
            self.waiters.append((before, link.sent, callback))

    # --- gets and subscribers ---------------------------------------------------------------------------------
    def get(self, queue: RemoteQueue, no_ack: bool, answer: Callable[[QueueEntry | None], None]) -> None:
        if self.link is None:
            asyncio.get_running_loop().call_soon(answer, None)
            return
        number = self.next_get
        self.next_get += 1
        self.gets[number] = (queue, answer)
        self.control({"op": "get", "vhost": queue.vhost.name, "queue": queue.name, "id": number, "no_ack": no_ack})

    def _got(self, payload: bytes) -> None:
        number, ready, found = decode_got(payload, self.messages)
        asked = self.gets.pop(number, None)
        if asked is None:
            raise FrameError(f"an answer to get {number}, which was not asked")
        queue, answer = asked
        queue.counted(ready, queue.ready_bytes, queue.retrying_at_owner, queue.consumers_at_owner,
                      queue.waiting_at_owner)
        answer(QueueEntry(*found) if found is not None else None)

    def subscribe(self, queue: RemoteQueue, subscriber: "Subscriber", verdict: Verdict | None) -> None:
        if self.link is None:
            if verdict is not None:
                verdict(None)  # (consume-ok, then the cancel of a consumer whose owner is down)
            self.crossing_cancelled(queue, subscriber)
            return
        number = self.next_id
        self.next_id += 1
        self.subscribers[number] = (queue, subscriber)
        self.ids[subscriber] = number
        if verdict is not None:
            self.verdicts[number] = verdict
        credit = subscriber.credit()
        on_settle = credit < WINDOW and not subscriber.no_ack
        if not on_settle:
            self.returns_on_write[number] = 0
        self.control({"op": "consume", "vhost": queue.vhost.name, "queue": queue.name, "id": number,
                      "window": credit if on_settle else WINDOW, "on_settle": on_settle, "no_ack": subscriber.no_ack,
                      "priority": subscriber.priority, "exclusive": subscriber.exclusive,
                      "arguments": subscriber.arguments})

    def forget(self, queue: RemoteQueue) -> None:
        """The queue is deleted here, its consumers cancelled: the owner's cancels of them are not passed on."""
        for number in [number for number, (subscribed, _) in self.subscribers.items() if subscribed is queue]:
            _, subscriber = self.subscribers.pop(number)
            self.ids.pop(subscriber, None)
            self.returns_on_write.pop(number, None)
            self.grants.pop(number, None)
            self._judged(number, None)

    def leave(self, subscribers: "list[Subscriber]") -> None:
        numbers = [number for number in (self.ids.get(subscriber) for subscriber in subscribers) if number is not None]
        if numbers:
            self.control({"op": "leave", "ids": numbers})

    def unsubscribe(self, subscribers: "list[Subscriber]") -> None:
        numbers = []
        for subscriber in subscribers:
            number = self.ids.pop(subscriber, None)
            if number is not None:
                del self.subscribers[number]
                self.returns_on_write.pop(number, None)
                self.grants.pop(number, None)
                numbers.append(number)
        if numbers:
            self.control({"op": "cancel", "ids": numbers})

    def offer_credit(self, queue: RemoteQueue) -> None:
        """Credit of subscribers whose deliveries were written goes back once their channel can deliver again."""
        owed = self.returns_on_write
        for subscriber in queue.consumers:
            number = self.ids.get(subscriber)
            if number is not None and owed.get(number) and subscriber.credit() > 0:
                self._grant(number, owed[number])
                owed[number] = 0

    def _grant(self, number: int, count: int) -> None:
        if self.link is not None:
            if not self.grants:
                self.link.wake()  # (they go as it flushes: see flushing)
            self.grants[number] = self.grants.get(number, 0) + count

    def settle(self, entries: list[QueueEntry], requeue: bool | None, failed: bool) -> None:
        link, epoch = self.link, self.epoch
        if link is None:
            return
        ids = [entry.seq for entry in entries if entry.seq != NO_ACK_ID and entry.seq >> EPOCH_SHIFT == epoch]
        if not ids:
            return
        if requeue is None:
            for delivery_id in ids:
                link.add(ACKED, ID.pack(delivery_id))
        else:
            self.control({"op": "settle", "ids": ids, "requeue": requeue, "failed": failed})

    def _judged(self, number: int, refusal: tuple[int, str] | None) -> None:
        """The owner's verdict on a consume that waits for it, if one does."""
        verdict = self.verdicts.pop(number, None)
        if verdict is not None:
            verdict(refusal)

    def crossing_cancelled(self, queue: RemoteQueue, subscriber: "Subscriber") -> None:
        """The subscriber cannot be served (its owner is not linked, or cancelled it): its client is told."""
        if subscriber in queue.consumers:
            queue.consumers.remove(subscriber)
        subscriber.channel.consumer_cancelled_by_server(subscriber)

    # --- broker.crossing.link.Handler -----------------------------------------------------------------------
    def received(self, kind: int, payload: bytes) -> None:
        if kind == ACK:
            self._acked(*decode_ack(payload))
        elif kind == DELIVER:
            self._delivered(payload)
        elif kind == NOTICE:
            self._noticed(decode_table(payload))
        elif kind == GOT:
            self._got(payload)
        elif kind == DEAD_LETTER:
            self.crossing.dead_lettered(*decode_dead_letter(payload, self.messages))
        else:
            raise FrameError(f"a frame of kind {kind} from an owner")

    def flushing(self) -> None:
        grants, self.grants = self.grants, {}
        if grants:
            self.control({"op": "credit", "grants": [[number, count] for number, count in grants.items()]})

    def lost(self) -> None:
        if self.subscribers or self.waiters:  # (a link made while the owner starts closes quietly)
            log.info("the link with worker %d closed: the consumers of its queues here are cancelled, and what waits "
                     "for its acks is nacked", self.group)
        self.link = None
        self.counting.clear()  # (the replies that waited for them fail: see when_acked)
        waiters, self.waiters = self.waiters, deque()
        self.failed = deque()
        for _, _, callback in waiters:
            callback(False)
        gets, self.gets = self.gets, {}
        for _, answer in gets.values():
            answer(None)
        runs, self.runs = self.runs, {}
        for vhost_name, ran in runs.values():
            ran(unreachable(vhost_name))
        subscribers, self.subscribers = self.subscribers, {}
        self.ids.clear()
        self.returns_on_write.clear()
        self.grants.clear()
        verdicts, self.verdicts = self.verdicts, {}
        for verdict in verdicts.values():
            verdict(None)  # (consume-ok, then the cancel)
        for queue, subscriber in subscribers.values():
            self.crossing_cancelled(queue, subscriber)
        self.crossing.transient_gone(self.group)
        if self.closed is not None:
            self.closed.set()

    def _acked(self, number: int, stored: bool, failed: list[int]) -> None:
        self.acked = number
        kept = self.failed
        kept.extend(failed)
        while kept and kept[0] <= number - FAILED_KEPT:
            kept.popleft()
        waiters = self.waiters
        while waiters and waiters[0][1] <= number:
            before, last, callback = waiters.popleft()
            callback(stored and not any(before < frame <= last for frame in kept))

    def _delivered(self, payload: bytes) -> None:
        subscribers, owed = self.subscribers, self.returns_on_write
        # deliveries for subscribers cancelled meanwhile, or leaving: they go back to the queue
        returned: list[int] = []
        written: dict[int, int] = {}  # subscriber whose credit comes back as it is written -> deliveries written
        last, found = -1, None  # (a batch mostly holds runs of deliveries to one subscriber)
        for number, delivery_id, redelivered, message in self.messages.delivered(payload):
            if number != last:
                last, found = number, subscribers.get(number)
            if found is None:
                if delivery_id != NO_ACK_ID:
                    returned.append(delivery_id)
                continue
            queue, subscriber = found
            if subscriber.leaving:  # (its channel closed: the owner sent this before it heard so)
                if delivery_id != NO_ACK_ID:
                    returned.append(delivery_id)
                continue
            subscriber.channel.deliver(subscriber, queue, QueueEntry(delivery_id, message, redelivered))
            written[number] = written.get(number, 0) + 1
        for number, count in written.items():
            if number in owed:
                owed[number] += count
        if returned:
            self.control({"op": "settle", "ids": returned, "requeue": True, "failed": False})
        for number in written:
            if number in owed and number in subscribers:
                queue, subscriber = subscribers[number]
                if subscriber.credit() > 0:
                    self._grant(number, owed[number])
                    owed[number] = 0

    def _noticed(self, notice: dict) -> None:
        operation = notice.get("op")
        if operation == "consumed":
            self._judged(int(notice["id"]), None)
        elif operation in ("cancelled", "refused"):
            found = self.subscribers.pop(notice.get("id"), None)  # type: ignore[arg-type]
            if found is not None:
                queue, subscriber = found
                number = self.ids.pop(subscriber)
                self.returns_on_write.pop(number, None)
                if operation == "refused" and number in self.verdicts:  # (the client never heard of it)
                    if subscriber in queue.consumers:
                        queue.consumers.remove(subscriber)
                    self._judged(number, (int(notice["code"]), str(notice["text"])))
                else:
                    self._judged(number, None)
                    self.crossing_cancelled(queue, subscriber)
        elif operation == "counted":
            if not self.counting:
                raise FrameError("a count that was not asked for")
            self.counting.popleft().answered(int(notice["count"]), int(notice.get("consumers", 0)))
        elif operation == "counts":
            for vhost, name, ready, ready_bytes, retrying, consumers, waiting in notice.get("queues", ()):
                stand_in = self.crossing.stand_in(vhost, name)
                if stand_in is not None:
                    stand_in.counted(ready, ready_bytes, retrying, consumers, bool(waiting))
        elif operation == "ran":
            asked = self.runs.pop(int(notice["id"]), None)
            if asked is None:
                raise FrameError(f"an answer to change {notice['id']}, which was not asked")
            asked[1](notice)
        elif operation == "gone":
            gone = self.crossing.stand_in(notice.get("vhost", ""), notice.get("queue", ""))
            if gone is not None and gone.owner == self.group:
                self.crossing.queue_gone(gone)
        else:
            raise FrameError(f"unknown notice {operation!r}")
