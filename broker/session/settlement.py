"""Work on a channel's deliveries that can be too large for one turn of the event loop, done a slice a turn, in the
order its client asked for it (Channel.settling): a multiple ack, nack or reject of millions and the requeue of a
closing channel's deliveries (Settlement), and within a transaction a multiple ack, nack or reject taken into it
(TakenIntoTransaction), its commit (Commit, or CommitAcross where queues of other processes may take part) and its
rollback (Rollback); a basic.get, which may wait for the expired messages at its queue's head to leave, or for the
process that owns it (Get); and the deletion of a queue or exchange with many bindings (Unbinding). The frames the
client sent after it wait meanwhile, as they wait for a reply that waits for the disk, so that what follows sees it
done."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Final, Iterator

from pamqp import commands as spec

from broker.model.queue import PIECE, SLICE_SECONDS, Queue, in_pieces
from broker.model.remote import RemoteQueue
from protocol import errors
from protocol.errors import AMQPError, made_elsewhere

if TYPE_CHECKING:
    from broker.model.interfaces import QueueCrossing
    from broker.model.exchange import Exchange
    from broker.model.message import QueueEntry
    from broker.model.transactions import Share
    from broker.session.channel import Channel
    from broker.session.consumer import Consumer
    from broker.session.transaction import Transaction
    from broker.session.unacked import Unacked, UnackedStore

# Deliveries settled in one loop turn at most (fewer where they cost more: broker.model.queue.SLICE_SECONDS): one of
# millions goes on a slice a turn, holding the other clients a few milliseconds at a time
SETTLE_SLICE: Final = 4096
# A publish routed at a commit costs about as much as this many deliveries settled (a slice routes a quarter as many)
PUBLISH_COST: Final = 4
# What a commit leaves of an ack, nack or reject it settled
SETTLED: Final[tuple[list[Unacked], bool | None, bool]] = ([], None, False)
# The stages of a commit across processes (CommitAcross)
ROUTE, PREPARE, DECIDE, ADOPT, SETTLE = range(5)


class Slices:
    """Work done over loop turns: step() does a slice of it and says whether that was the last."""

    def step(self, channel: Channel) -> bool:
        raise NotImplementedError

    def parked(self) -> bool:
        """Whether it waits for something else, which wakes the channel (Channel.unpark), rather than for the next
        turn."""
        return False


class Settlement(Slices):
    """The deliveries up to a tag, settled over loop turns, a slice a turn. Requeued ones are all taken from the
    channel's unacked first, then put back the last slice first, so that each goes back ahead of the one before, at
    the head of its queue (the first slice first would merge every later one into the queue). A channel closed
    meanwhile settles all that its client asked for."""

    __slots__ = ("tag", "requeue", "failed", "taken")

    def __init__(self, tag: int, requeue: bool | None, failed: bool) -> None:
        self.tag = tag
        self.requeue = requeue
        self.failed = failed
        self.taken: list[Unacked] = []  # requeued ones taken, in tag order, not put back yet

    def step(self, channel: Channel) -> bool:
        unacked = channel.unacked
        if self.requeue and unacked.holds_up_to(self.tag):  # (requeued ones are all taken first)
            self.taken += unacked.take_up_to(self.tag, SETTLE_SLICE)
            return False
        if self.requeue:  # (a requeue that counts a return rewrites the message's header, or dead-letters it)
            return in_pieces(lambda: self._requeue_piece(channel), SETTLE_SLICE)
        return in_pieces(lambda: self._settle_piece(channel), SETTLE_SLICE)  # (a dead-lettered one costs ten acked)

    def _requeue_piece(self, channel: Channel) -> bool:
        """PIECE of the requeued ones put back, the last first; whether they were the last."""
        taken = self.taken
        piece = taken[-PIECE:]
        del taken[-PIECE:]
        channel.unacked.release(piece)
        channel.settle(piece, True, self.failed)
        return not taken

    def _settle_piece(self, channel: Channel) -> bool:
        """PIECE of the deliveries acked or dropped; whether they were the last."""
        unacked = channel.unacked
        piece = unacked.take_up_to(self.tag, PIECE)
        unacked.release(piece)
        channel.settle(piece, self.requeue, self.failed)
        return not unacked.holds_up_to(self.tag)


class TakenIntoTransaction(Slices):
    """A multiple ack, nack or reject of many deliveries within a transaction: taken into it a slice a turn, to be
    settled at the commit (their prefetch slots stay taken until then, as in RabbitMQ). A channel closed meanwhile
    stops taking: its transaction is rolled back and every delivery goes back to its queue."""

    __slots__ = ("tx", "tag", "requeue", "failed")

    def __init__(self, tx: Transaction, tag: int, requeue: bool | None, failed: bool) -> None:
        self.tx = tx
        self.tag = tag
        self.requeue = requeue
        self.failed = failed

    def step(self, channel: Channel) -> bool:
        if not channel.open:
            return True
        unacked = channel.unacked
        for _ in range(SETTLE_SLICE // PIECE):  # (in pieces, so that the commit can settle them a piece at a time)
            self.tx.settles.append((unacked.take_up_to(self.tag, PIECE), self.requeue, self.failed))
            if not unacked.holds_up_to(self.tag):
                return True
        return False


class Commit(Slices):
    """A transaction's acks, nacks and rejects settled, then its publishes routed, a slice a turn; then commit-ok,
    once the disk has what went there. Finished though the channel closes meanwhile: its client asked for it."""

    __slots__ = ("tx", "settled", "routed", "persisted")

    def __init__(self, tx: Transaction) -> None:
        self.tx = tx
        self.settled = 0  # entries of tx.settles done
        self.routed = 0  # publishes of tx.publishes done
        self.persisted = False  # whether a publish went to disk (commit-ok waits for it)

    def step(self, channel: Channel) -> bool:
        settles, publishes = self.tx.settles, self.tx.publishes
        budget = SETTLE_SLICE
        ends = time.perf_counter() + SLICE_SECONDS
        while budget > 0 and time.perf_counter() < ends:
            if self.settled < len(settles):
                budget -= _settle_one(channel, settles, self.settled)
                self.settled += 1
            elif self.routed < len(publishes):
                self.persisted = publishes[self.routed]() or self.persisted
                publishes[self.routed] = _routed  # (its message let go: it is in its queues now)
                self.routed += 1
                budget -= PUBLISH_COST
            else:
                channel.committed(self.persisted)
                return True
        return False


class CommitAcross(Slices):
    """A commit in a vhost some of whose queues other processes own: on every process or on none
    (broker.model.transactions). Its publishes are routed and held, a slice a turn: each process writes its share
    aside and enqueues none of it. Where several processes hold a share, once every share is safe (on this
    process's disk, and acked by each owner after its own) the decision is recorded, and each process adopts its
    share. Where one process holds it all, its adoption (written with its share, in the turn of the last slice)
    commits it. Then its acks, nacks and rejects are settled, a slice a turn, and commit-ok follows. A share that
    could not be held (an owner unreachable or gone, a queue deleted there, a disk that failed) ends it on none: the
    shares are dropped, its deliveries go back to their queues, and the channel is closed (541). The frames that
    follow wait until it ends. Finished though the channel closes meanwhile: its client asked for it."""

    __slots__ = ("tx", "share", "stage", "routed", "settled", "waiting", "answered", "ok")

    def __init__(self, tx: Transaction, share: Share) -> None:
        self.tx = tx
        self.share = share  # this process's share, which names the transaction and notes the other owners
        self.stage = ROUTE
        self.routed = 0  # publishes of tx.publishes routed
        self.settled = 0  # entries of tx.settles done
        self.waiting = False  # parked for an answer (the disk's, the owners')
        self.answered = False  # the answer asked for last came
        self.ok = True  # every answer so far said it went well

    def parked(self) -> bool:
        return self.waiting

    def step(self, channel: Channel) -> bool:
        crossing = channel.vhost.crossing
        assert crossing is not None, "a vhost whose queues other processes own crosses to them"
        share = self.share
        if self.stage == ROUTE:
            if not self._route(channel):
                return False
            if share.failed:
                return self._fail(channel, crossing)
            if len(share.owners) + bool(share.entries) > 1:
                self.stage = PREPARE
                self._wait(channel, lambda done: channel.vhost.when_durable(done, dict(share.owners)))
            else:  # (one process holds it all)
                self.stage = ADOPT
                self._wait(channel, lambda done: crossing.commit(share, done))
            return False
        if self.stage in (PREPARE, DECIDE):
            if not self.ok:
                return self._fail(channel, crossing)
            if self.stage == PREPARE:
                self.stage = DECIDE
                self._wait(channel, lambda done: crossing.decide(share, done))
            else:
                self.stage = ADOPT
                self._wait(channel, lambda done: crossing.commit(share, done))
            return False
        if self.stage == ADOPT:  # every process took its share, or will once it can where the decision was recorded
            if not (self.ok or share.recorded):
                return self._unadopted(channel)
            self.stage = SETTLE
        if not self._settle(channel):
            return False
        if channel.open:
            channel.send_method(spec.Tx.CommitOk())
        return True

    def _route(self, channel: Channel) -> bool:
        """A slice of the publishes routed and held; whether they were the last."""
        publishes, share = self.tx.publishes, self.share
        budget = SETTLE_SLICE
        ends = time.perf_counter() + SLICE_SECONDS
        while self.routed < len(publishes):
            if budget <= 0 or time.perf_counter() >= ends:
                return False
            publishes[self.routed](share)
            publishes[self.routed] = _routed
            self.routed += 1
            budget -= PUBLISH_COST
        return True

    def _settle(self, channel: Channel) -> bool:
        """A slice of the acks, nacks and rejects settled; whether they were the last."""
        settles = self.tx.settles
        budget = SETTLE_SLICE
        ends = time.perf_counter() + SLICE_SECONDS
        while self.settled < len(settles):
            if budget <= 0 or time.perf_counter() >= ends:
                return False
            budget -= _settle_one(channel, settles, self.settled)
            self.settled += 1
        return True

    def _wait(self, channel: Channel, ask: Callable[[Callable[[bool], None]], None]) -> None:
        self.answered = False
        ask(lambda ok: self._answered(channel, ok))
        self.waiting = not self.answered  # (answered at once where nothing was to wait for)

    def _answered(self, channel: Channel, ok: bool) -> None:
        self.answered = True
        self.ok = self.ok and ok
        if self.waiting:
            self.waiting = False
            channel.unpark()

    def _fail(self, channel: Channel, crossing: QueueCrossing) -> bool:
        """Not committed anywhere: the shares dropped, the deliveries back in their queues, the channel closed."""
        crossing.abort(self.share)
        self._requeue(channel)
        if channel.open:
            channel.connection.failed(errors.internal_error(
                "the transaction could not be held by every process that owns one of its queues: it was committed "
                "on none"), channel)
        return True

    def _unadopted(self, channel: Channel) -> bool:
        """The one process that held it all could not adopt all of it (a queue gone), or its disk or its link
        failed meanwhile: the deliveries go back to their queues and the channel is closed."""
        self._requeue(channel)
        if channel.open:
            if self.share.owners:
                channel.connection.failed(errors.internal_error(
                    "the transaction's commit was not confirmed by the process that owns its queues"), channel)
            else:
                channel.disk_failed()
        return True

    def _requeue(self, channel: Channel) -> None:
        for deliveries, _, _ in self.tx.settles:
            channel.unacked.release(deliveries)
            channel.settle(deliveries, True)


class Rollback(Slices):
    """A transaction's acks, nacks and rejects undone: its deliveries unacked again, in tag order among the others,
    over loop turns (UnackedStore.put_back); then rollback-ok, unless the channel is closing."""

    __slots__ = ("steps",)

    def __init__(self, tx: Transaction, unacked: UnackedStore) -> None:
        self.steps: Iterator[None] = unacked.put_back(_taken(tx), SETTLE_SLICE)

    def step(self, channel: Channel) -> bool:
        for _ in self.steps:
            return False
        channel.ack_timer.walk_again()  # (the deliveries back may be older than where its walk is)
        if channel.open:
            channel.send_method(spec.Tx.RollbackOk())
        return True


class Get(Slices):
    """A basic.get, answered in its turn unless the queue holds more expired messages at its head than one turn lets
    go (Queue.take): they leave a slice a turn, then it is answered (get-empty if the queue went meanwhile), unless
    the channel closed. A queue owned by another process is asked there, and the get waits for its answer."""

    __slots__ = ("queue", "no_ack", "asked", "answered", "answer")

    def __init__(self, queue: Queue, no_ack: bool) -> None:
        self.queue = queue
        self.no_ack = no_ack
        self.asked = False  # the owner of the queue was asked
        self.answered = False  # and has answered: answer (None: no message)
        self.answer: QueueEntry | None = None

    def parked(self) -> bool:
        return self.asked and not self.answered

    def step(self, channel: Channel) -> bool:
        queue = self.queue
        if not channel.open:
            return True
        if self.answered:
            channel.answer_get(queue, self.answer, self.no_ack)
            return True
        if isinstance(queue, RemoteQueue) and not queue.deleted:
            self.asked = True
            queue.take_there(self.no_ack, lambda entry: self._answered(channel, entry))
            return False
        entry = None if queue.deleted else queue.take(self.no_ack)
        if entry is None and queue.take_again():
            return False
        channel.answer_get(queue, entry, self.no_ack)
        return True


    def _answered(self, channel: Channel, entry: QueueEntry | None) -> None:
        self.answer, self.answered = entry, True
        channel.unpark()


class Subscribing(Slices):
    """A basic.consume of a queue another process owns: consume-ok once the owner took the consumer (before any
    delivery to it, which follows the owner's answer), or the channel closed with the error the owner refused it
    with (an exclusive consumer of another process's there, which this process could not see: RabbitMQ's 403)."""

    __slots__ = ("queue", "consumer", "nowait", "method_index", "waiting", "answered", "refusal")

    def __init__(self, queue: RemoteQueue, consumer: Consumer, nowait: bool, method_index: int) -> None:
        self.queue = queue
        self.consumer = consumer
        self.nowait = nowait
        self.method_index = method_index  # the method's class and method ids, for the error that closes the channel
        self.waiting = False  # parked for the owner's answer
        self.answered = False
        self.refusal: tuple[int, str] | None = None  # the reply code and text the owner refused it with

    def parked(self) -> bool:
        return self.waiting and not self.answered

    def step(self, channel: Channel) -> bool:
        if not self.answered:
            if not self.waiting:
                # (a Consumer is the queue's Subscriber: see Channel.cancel_consumer)
                self.queue.subscribe_there(self.consumer,  # type: ignore[arg-type]
                                           lambda refusal: self._answered(channel, refusal))
            self.waiting = not self.answered  # (answered at once where the owner cannot be reached)
            if self.waiting:
                return False
        refusal = self.refusal
        if refusal is not None and channel.open:
            channel.consumers.pop(self.consumer.tag, None)
            channel.connection.failed(made_elsewhere(refusal[0], refusal[1], *divmod(self.method_index, 65536)),
                                      channel)
        return True

    def _answered(self, channel: Channel, refusal: tuple[int, str] | None) -> None:
        self.answered, self.refusal = True, refusal
        if refusal is None and not self.nowait and channel.open:
            channel.send_method(spec.Basic.ConsumeOk(consumer_tag=self.consumer.tag))
        if self.waiting:
            channel.unpark()


class Forwarded(Slices):
    """A change of the vhost's definitions asked on a copy of it (broker.crossing.copies): the vhost's home runs it,
    and the channel's reply (reply makes it of the answer; None for a nowait method) or the error it was refused
    with follows the answer, by which this process's copy has the change."""

    __slots__ = ("operation", "method_index", "reply", "undo", "asked", "answer")

    def __init__(self, operation: dict, method_index: int, reply: Callable[[dict], object],
                 undo: Callable[[], None] | None = None) -> None:
        self.operation = operation
        self.method_index = method_index  # the method's class and method ids, for the error that closes the channel
        self.reply = reply
        self.undo = undo  # what to take back here if the home refuses it
        self.asked = False
        self.answer: dict | None = None

    def parked(self) -> bool:
        return self.asked and self.answer is None

    def step(self, channel: Channel) -> bool:
        if not channel.open:
            return True
        answer = self.answer
        if answer is None:
            vhost = channel.vhost
            crossing = vhost.crossing
            assert crossing is not None, "a copy reaches its home across"
            self.asked = True
            channel.notices_held = True  # (a cancel of a consumer of the channel's comes after the reply)
            crossing.run_at_home(vhost, self.operation, lambda answer: self._answered(channel, answer))
            return False
        error = answer.get("error")
        if error is not None:
            if self.undo is not None:
                self.undo()
            channel.connection.failed(made_elsewhere(int(error[0]), str(error[1]), *divmod(self.method_index, 65536)),
                                      channel)
            return True
        method = self.reply(answer)
        if method is not None:
            channel.send_method(method)
        channel.release_notices()
        return True

    def _answered(self, channel: Channel, answer: dict) -> None:
        self.answer = answer
        channel.unpark()


class Unbinding(Slices):
    """A queue.delete or exchange.delete of a subject with more bindings than its deletion removes at once
    (broker.model.vhost.BINDINGS_AT_ONCE): they go first, a slice a loop turn (VirtualHost.unbind_all), the subject
    otherwise as it was; then ``decided`` (the method without if-unused and if-empty, its checks passed) runs as any
    method does, removing the subject with what bindings are left; or, where another client deleted it meanwhile,
    is answered as for no such subject. A channel closed meanwhile has the deletion made all the same."""

    __slots__ = ("subject", "decided", "waiting", "unbound")

    def __init__(self, subject: Queue | Exchange, decided: spec.Queue.Delete | spec.Exchange.Delete) -> None:
        self.subject = subject
        self.decided = decided
        self.waiting = False  # parked until the bindings are gone
        self.unbound = False

    def parked(self) -> bool:
        return self.waiting and not self.unbound

    def step(self, channel: Channel) -> bool:
        subject, vhost = self.subject, channel.vhost
        if not self.unbound:
            vhost.unbind_all(subject, lambda: self._unbound(channel))
            self.waiting = not self.unbound
            if self.waiting:
                return False
        if not channel.open:
            vhost.delete(subject)
        elif channel.replies is not None:  # (a reply still waits, within the handler that started this or for the
            return False                   # disk: the method's own must follow it, and wait for the disk itself)
        elif subject.deleted:
            vhost.delete(subject)  # (the records of its end, where its own deletion has yet to write them)
            if not self.decided.nowait:
                channel.send_method(spec.Queue.DeleteOk(message_count=0) if isinstance(subject, Queue)
                                    else spec.Exchange.DeleteOk())
        else:
            try:
                channel.handle_method(self.decided)
            except AMQPError as error:  # (refused now, say the user's rights were taken back meanwhile)
                channel.connection.failed(error, channel)
        return True

    def _unbound(self, channel: Channel) -> None:
        self.unbound = True
        if self.waiting:
            channel.unpark()


def _settle_one(channel: Channel, settles: list[tuple[list[Unacked], bool | None, bool]], index: int) -> int:
    """A transaction's index-th ack, nack or reject settled at its commit, and let go (millions held to the end
    held the loop); how many deliveries it settled."""
    deliveries, requeue, failed = settles[index]
    settles[index] = SETTLED
    channel.unacked.release(deliveries)
    channel.settle(deliveries, requeue, failed)
    return len(deliveries)


def _routed(held: Share | None = None) -> bool:
    """What a commit leaves of a publish it routed."""
    return False


def _taken(tx: Transaction) -> Iterator[list[Unacked]]:
    """The deliveries each ack, nack or reject of the transaction took, as the rollback reaches them."""
    for deliveries, _, _ in tx.settles:
        yield deliveries
