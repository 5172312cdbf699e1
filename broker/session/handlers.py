"""The handlers of the AMQP methods a client may send on a channel: each checks its arguments and calls the model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pamqp import base, commands as spec

from broker.model import operations
from broker.model.access import EXCHANGE, QUEUE
from broker.model.remote import RemoteQueue
from broker.model.vhost import connection_token, generated_name
from broker.session import direct_reply
from broker.session.consumer import Consumer
from broker.session.settlement import Forwarded, Subscribing, Unbinding
from protocol import errors
from protocol.codec import make_method

if TYPE_CHECKING:
    from broker.session.channel import Channel


def _channel_close(channel: Channel, method: spec.Channel.Close) -> None:
    channel.connection.close_channel(channel.number, send_close_ok=True)


def _channel_open(channel: Channel, method: spec.Channel.Open) -> None:
    raise errors.channel_error("second 'channel.open' seen")


def _channel_flow(channel: Channel, method: spec.Channel.Flow) -> None:
    if not method.active:
        raise errors.not_implemented("active=false")
    channel.send_method(spec.Channel.FlowOk(active=True))


def _actor(channel: Channel) -> operations.Actor:
    return operations.Actor(channel.vhost, channel.access, channel.connection)


def _forward(channel: Channel, method: base.Frame, operation: dict,
             reply: Callable[[dict], base.Frame | None], undo: Callable[[], None] | None = None) -> None:
    """A change of the definitions of a vhost this process keeps a copy of (broker.crossing.copies): its home runs
    it for the channel's user, and the reply waits for its answer (undo: what to take back if it refuses)."""
    connection = channel.connection
    operation = {**operation, "user": connection.user, "client_id": channel.access.client_id,
                 "connection": connection_token(connection)}
    channel.start(Forwarded(operation, method.index, reply, undo))


def _exchange_declare(channel: Channel, method: spec.Exchange.Declare) -> None:
    vhost = channel.vhost
    if vhost.copy and not method.passive:
        _forward(channel, method, {"what": "exchange.declare", "exchange": method.exchange,
                                   "type": method.exchange_type, "durable": method.durable,
                                   "auto_delete": method.auto_delete, "internal": method.internal,
                                   "arguments": method.arguments or {}},
                 lambda answer: None if method.nowait else spec.Exchange.DeclareOk())
        return
    exchange, created = operations.declare_exchange(
        _actor(channel), method.exchange, method.exchange_type, method.passive, method.durable, method.auto_delete,
        method.internal, method.arguments or {})
    if created:
        channel.undo = lambda: vhost.delete_exchange(exchange.name, if_unused=False)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeclareOk())


def _exchange_delete(channel: Channel, method: spec.Exchange.Delete) -> None:
    if channel.vhost.copy:
        _forward(channel, method, {"what": "exchange.delete", "exchange": method.exchange,
                                   "if_unused": method.if_unused},
                 lambda answer: None if method.nowait else spec.Exchange.DeleteOk())
        return
    exchange = operations.exchange_to_delete(_actor(channel), method.exchange, method.if_unused)
    if exchange is not None and channel.vhost.has_many_bindings(exchange):
        channel.start(Unbinding(exchange, make_method(spec.Exchange.Delete, exchange=exchange.name,
                                                      nowait=method.nowait)))
        return
    if exchange is not None:
        channel.vhost.delete_exchange(exchange.name, if_unused=False)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeleteOk())


def _bind(channel: Channel, method: base.Frame, source: str, kind: str, destination: str, routing_key: str,
          arguments: dict, reply: base.Frame | None) -> None:
    """queue.bind and exchange.bind: a binding this makes is taken back if its record cannot be written."""
    vhost = channel.vhost
    if vhost.copy:
        _forward(channel, method, {"what": "bind", "source": source, "kind": kind, "destination": destination,
                                   "routing_key": routing_key, "arguments": arguments}, lambda answer: reply)
        return
    source_exchange, destination_end, created = operations.bind(_actor(channel), source, kind, destination,
                                                                 routing_key, arguments)
    if created:
        channel.undo = lambda: vhost.unbind(source_exchange, destination_end, routing_key, arguments)
    if reply is not None:
        channel.send_method(reply)


def _unbind(channel: Channel, method: base.Frame, source: str, kind: str, destination: str, routing_key: str,
            arguments: dict, reply: base.Frame | None) -> None:
    if channel.vhost.copy:
        _forward(channel, method, {"what": "unbind", "source": source, "kind": kind, "destination": destination,
                                   "routing_key": routing_key, "arguments": arguments}, lambda answer: reply)
        return
    operations.unbind(_actor(channel), source, kind, destination, routing_key, arguments)
    if reply is not None:
        channel.send_method(reply)


def _exchange_bind(channel: Channel, method: spec.Exchange.Bind) -> None:
    _bind(channel, method, method.source, EXCHANGE, method.destination, method.routing_key, method.arguments or {},
          None if method.nowait else spec.Exchange.BindOk())


def _exchange_unbind(channel: Channel, method: spec.Exchange.Unbind) -> None:
    _unbind(channel, method, method.source, EXCHANGE, method.destination, method.routing_key,
            method.arguments or {}, None if method.nowait else spec.Exchange.UnbindOk())


def _queue_name(channel: Channel, name: str) -> str:
    """An empty queue name means the channel's last declared queue."""
    if name:
        return name
    if not channel.last_queue:
        raise errors.not_found("no previously declared queue")
    return channel.last_queue


def _queue_declare(channel: Channel, method: spec.Queue.Declare) -> None:
    if method.queue == direct_reply.PSEUDO_QUEUE:
        if not method.nowait:
            channel.send_method(spec.Queue.DeclareOk(method.queue, 0, int(channel.reply_consumer is not None)))
        return
    vhost = channel.vhost
    # an empty name is the last declared queue to a passive declare, and asks any other for a server-named queue
    name = _queue_name(channel, method.queue) if method.passive else method.queue
    if vhost.copy and not method.passive and name and not method.exclusive:  # (those stay here: below)
        channel.last_queue = name
        _forward(channel, method, {"what": "queue.declare", "queue": name, "durable": method.durable,
                                   "auto_delete": method.auto_delete, "arguments": method.arguments or {}},
                 lambda answer: None if method.nowait else spec.Queue.DeclareOk(
                     name, int(answer.get("messages", 0)), int(answer.get("consumers", 0))))
        return
    queue, created = operations.declare_queue(_actor(channel), name, method.passive, method.durable,
                                              method.exclusive, method.auto_delete, method.arguments or {})
    if created:
        channel.undo = lambda: vhost.delete_queue(queue)
    channel.last_queue = queue.name
    if created and vhost.copy:  # (an exclusive or server-named one, made here: the home learns of it)
        _forward(channel, method, {"what": "register", "queue": queue.name, "durable": method.durable,
                                   "auto_delete": method.auto_delete, "arguments": method.arguments or {},
                                   "exclusive": method.exclusive},
                 lambda answer: None if method.nowait else spec.Queue.DeclareOk(queue.name, 0, 0),
                 lambda: vhost.delete_queue(queue))
        return
    if method.nowait:
        return
    if isinstance(queue, RemoteQueue) and not created:  # (its owner counts its messages)
        counted = queue.count_there()
        channel.send_method_later(lambda: spec.Queue.DeclareOk(queue.name, counted.value, counted.consumers))
    else:
        channel.send_method(spec.Queue.DeclareOk(queue.name, queue.count_ready(), len(queue.consumers)))


def _queue_bind(channel: Channel, method: spec.Queue.Bind) -> None:
    name = _queue_name(channel, method.queue)
    # an empty routing key with the last declared queue binds by that queue's name
    routing_key = method.routing_key if (method.routing_key or method.queue) else name
    _bind(channel, method, method.exchange, QUEUE, name, routing_key, method.arguments or {},
          None if method.nowait else spec.Queue.BindOk())


def _queue_unbind(channel: Channel, method: spec.Queue.Unbind) -> None:
    _unbind(channel, method, method.exchange, QUEUE, _queue_name(channel, method.queue), method.routing_key,
            method.arguments or {}, spec.Queue.UnbindOk())


def _readable_queue(channel: Channel, name: str):
    return operations.readable_queue(_actor(channel), _queue_name(channel, name))


def _queue_purge(channel: Channel, method: spec.Queue.Purge) -> None:
    channel.vhost.counted_there = None
    count = operations.purge(_actor(channel), _queue_name(channel, method.queue))
    if not method.nowait:
        _reply_with_count(channel, lambda counted: spec.Queue.PurgeOk(message_count=counted), count)


def _queue_delete(channel: Channel, method: spec.Queue.Delete) -> None:
    if channel.vhost.copy:
        _forward(channel, method, {"what": "queue.delete", "queue": _queue_name(channel, method.queue),
                                   "if_unused": method.if_unused, "if_empty": method.if_empty},
                 lambda answer: None if method.nowait else spec.Queue.DeleteOk(int(answer.get("messages", 0))))
        return
    vhost = channel.vhost
    vhost.counted_there = None
    queue = operations.queue_to_delete(_actor(channel), _queue_name(channel, method.queue), method.if_unused,
                                       method.if_empty)
    if queue is not None and vhost.has_many_bindings(queue):
        channel.start(Unbinding(queue, make_method(spec.Queue.Delete, queue=queue.name, nowait=method.nowait)))
        return
    count = 0 if queue is None else vhost.delete_queue(queue)
    if not method.nowait:
        _reply_with_count(channel, lambda counted: spec.Queue.DeleteOk(message_count=counted), count)


def _reply_with_count(channel: Channel, reply: Callable[[int], base.Frame], count: int) -> None:
    """A purge-ok or delete-ok with the count of what was dropped: count, or the count a queue's owner answers
    with (broker.model.remote.Counted) where another process owns it."""
    counted, channel.vhost.counted_there = channel.vhost.counted_there, None
    if counted is None:
        channel.send_method(reply(count))
    else:
        channel.send_method_later(lambda: reply(counted.value))


def _basic_qos(channel: Channel, method: spec.Basic.Qos) -> None:
    if method.prefetch_size:
        raise errors.not_implemented(f"prefetch_size!=0 ({method.prefetch_size})")
    if method.global_:
        channel.unacked.global_prefetch = method.prefetch_count
        channel.offer_credit({consumer.queue for consumer in channel.consumers.values()})
    else:
        channel.consumer_prefetch = method.prefetch_count
    channel.send_method(spec.Basic.QosOk())


def _basic_consume(channel: Channel, method: spec.Basic.Consume) -> None:
    vhost = channel.vhost
    tag = method.consumer_tag or generated_name("amq.ctag-")
    if tag in channel.consumers or (channel.reply_consumer is not None and channel.reply_consumer.tag == tag):
        raise errors.not_allowed(f"attempt to reuse consumer tag '{tag}'")
    if method.queue == direct_reply.PSEUDO_QUEUE:
        direct_reply.start(channel, tag, method.no_ack)
        if not method.nowait:
            channel.send_method(spec.Basic.ConsumeOk(consumer_tag=tag))
        return
    queue = _readable_queue(channel, method.queue)
    arguments = method.arguments or {}
    queue.check_consume(method.no_ack, channel.consumer_prefetch, channel.unacked.global_prefetch, arguments)
    if queue.has_exclusive_consumer() or (method.exclusive and queue.has_consumers()):
        raise errors.access_refused(f"queue '{queue.name}' in vhost '{vhost.name}' in exclusive use")
    consumer = Consumer(tag, channel, queue, method.no_ack, method.exclusive, arguments, channel.consumer_prefetch)
    channel.consumers[tag] = consumer
    if isinstance(queue, RemoteQueue):  # (its owner sees the consumers of every process: consume-ok once it took it)
        channel.start(Subscribing(queue, consumer, method.nowait, method.index))
        return
    if not method.nowait:
        channel.send_method(spec.Basic.ConsumeOk(consumer_tag=tag))
    queue.add_consumer(consumer)


def _basic_cancel(channel: Channel, method: spec.Basic.Cancel) -> None:
    consumer = channel.consumers.get(method.consumer_tag)
    if consumer is not None:
        channel.cancel_consumer(consumer)
    elif channel.reply_consumer is not None and channel.reply_consumer.tag == method.consumer_tag:
        direct_reply.stop(channel)
    if not method.nowait:
        channel.send_method(spec.Basic.CancelOk(consumer_tag=method.consumer_tag))


def _basic_get(channel: Channel, method: spec.Basic.Get) -> None:
    channel.get(_readable_queue(channel, method.queue), method.no_ack)


def _basic_recover(channel: Channel, method: spec.Basic.Recover) -> None:
    if not method.requeue:
        raise errors.not_implemented("requeue=false")
    channel.requeue_all(failed=False)
    channel.send_method(spec.Basic.RecoverOk())


def _basic_recover_async(channel: Channel, method: spec.Basic.RecoverAsync) -> None:
    if not method.requeue:
        raise errors.not_implemented("requeue=false")
    channel.requeue_all(failed=False)


def _confirm_select(channel: Channel, method: spec.Confirm.Select) -> None:
    channel.select_confirms()
    if not method.nowait:
        channel.send_method(spec.Confirm.SelectOk())


def _tx_select(channel: Channel, method: spec.Tx.Select) -> None:
    channel.select_tx()
    channel.send_method(spec.Tx.SelectOk())


def _tx_commit(channel: Channel, method: spec.Tx.Commit) -> None:
    channel.commit_tx()


def _tx_rollback(channel: Channel, method: spec.Tx.Rollback) -> None:
    channel.rollback_tx()


# method class -> handler; basic.publish, ack, nack and reject never get here: the channel decodes them on a fast path
HANDLERS: dict[type, Callable[[Channel, object], None]] = {
    spec.Channel.Open: _channel_open,
    spec.Channel.Close: _channel_close,
    spec.Channel.Flow: _channel_flow,
    spec.Exchange.Declare: _exchange_declare,
    spec.Exchange.Delete: _exchange_delete,
    spec.Exchange.Bind: _exchange_bind,
    spec.Exchange.Unbind: _exchange_unbind,
    spec.Queue.Declare: _queue_declare,
    spec.Queue.Bind: _queue_bind,
    spec.Queue.Unbind: _queue_unbind,
    spec.Queue.Purge: _queue_purge,
    spec.Queue.Delete: _queue_delete,
    spec.Basic.Qos: _basic_qos,
    spec.Basic.Consume: _basic_consume,
    spec.Basic.Cancel: _basic_cancel,
    spec.Basic.Get: _basic_get,
    spec.Basic.Recover: _basic_recover,
    spec.Basic.RecoverAsync: _basic_recover_async,
    spec.Confirm.Select: _confirm_select,
    spec.Tx.Select: _tx_select,
    spec.Tx.Commit: _tx_commit,
    spec.Tx.Rollback: _tx_rollback,
}
