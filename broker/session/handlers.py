"""The handlers of the AMQP methods a client may send on a channel: each checks its arguments and calls the model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pamqp import commands as spec

from broker.model.vhost import generated_name
from broker.session import direct_reply
from broker.session.consumer import Consumer
from protocol import errors
from protocol.erlang_terms import amqp_type_name

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


def _exchange_declare(channel: Channel, method: spec.Exchange.Declare) -> None:
    vhost = channel.vhost
    existed = method.exchange in vhost.exchanges
    exchange = vhost.declare_exchange(method.exchange, method.exchange_type, method.passive, method.durable,
                                      method.auto_delete, method.internal, method.arguments or {})
    if not existed:
        channel.undo = lambda: vhost.delete_exchange(exchange.name, if_unused=False)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeclareOk())


def _exchange_delete(channel: Channel, method: spec.Exchange.Delete) -> None:
    channel.vhost.delete_exchange(method.exchange, method.if_unused)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeleteOk())


def _exchange_bind(channel: Channel, method: spec.Exchange.Bind) -> None:
    vhost = channel.vhost
    source, destination = vhost.get_exchange(method.source), vhost.get_exchange(method.destination)
    vhost.bind(source, destination, method.routing_key, method.arguments or {})
    channel.undo = lambda: vhost.unbind(source, destination, method.routing_key, method.arguments or {})
    if not method.nowait:
        channel.send_method(spec.Exchange.BindOk())


def _exchange_unbind(channel: Channel, method: spec.Exchange.Unbind) -> None:
    vhost = channel.vhost
    vhost.unbind(vhost.exchanges.get(method.source), vhost.exchanges.get(method.destination), method.routing_key,
                 method.arguments or {})
    if not method.nowait:
        channel.send_method(spec.Exchange.UnbindOk())


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
    name = method.queue if not (method.passive and not method.queue) else _queue_name(channel, "")
    existed = name in vhost.queues
    queue = vhost.declare_queue(name, channel.connection, method.passive, method.durable, method.exclusive,
                                method.auto_delete, method.arguments or {})
    if not existed:
        channel.undo = lambda: vhost.delete_queue(queue)
    channel.last_queue = queue.name
    if not method.nowait:
        channel.send_method(spec.Queue.DeclareOk(queue.name, queue.count_ready(), len(queue.consumers)))


def _queue_bind(channel: Channel, method: spec.Queue.Bind) -> None:
    vhost = channel.vhost
    queue = vhost.get_queue(_queue_name(channel, method.queue), channel.connection)
    routing_key = method.routing_key if (method.routing_key or method.queue) else queue.name
    exchange = vhost.get_exchange(method.exchange)
    vhost.bind(exchange, queue, routing_key, method.arguments or {})
    channel.undo = lambda: vhost.unbind(exchange, queue, routing_key, method.arguments or {})
    if not method.nowait:
        channel.send_method(spec.Queue.BindOk())


def _queue_unbind(channel: Channel, method: spec.Queue.Unbind) -> None:
    vhost = channel.vhost
    queue = vhost.queues.get(_queue_name(channel, method.queue))
    vhost.unbind(vhost.exchanges.get(method.exchange), queue, method.routing_key, method.arguments or {},
                 channel.connection)
    channel.send_method(spec.Queue.UnbindOk())


def _queue_purge(channel: Channel, method: spec.Queue.Purge) -> None:
    queue = channel.vhost.get_queue(_queue_name(channel, method.queue), channel.connection)
    count = queue.purge()
    if not method.nowait:
        channel.send_method(spec.Queue.PurgeOk(message_count=count))


def _queue_delete(channel: Channel, method: spec.Queue.Delete) -> None:
    vhost = channel.vhost
    queue = vhost.queues.get(_queue_name(channel, method.queue))
    count = 0
    if queue is not None:
        vhost.check_exclusive_access(queue, channel.connection)
        if method.if_unused and queue.consumers:
            raise errors.precondition_failed(f"queue '{queue.name}' in vhost '{vhost.name}' in use")
        if method.if_empty and queue.entries:
            raise errors.precondition_failed(f"queue '{queue.name}' in vhost '{vhost.name}' not empty")
        count = vhost.delete_queue(queue)
    if not method.nowait:
        channel.send_method(spec.Queue.DeleteOk(message_count=count))


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
    queue = vhost.get_queue(_queue_name(channel, method.queue), channel.connection)
    arguments = method.arguments or {}
    priority = arguments.get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise errors.precondition_failed(f"invalid arg 'x-priority' for queue '{queue.name}' in vhost "
                                         f"'{vhost.name}': \"expected integer, got {amqp_type_name(priority)}\"")
    if queue.has_exclusive_consumer() or (method.exclusive and queue.consumers):
        raise errors.access_refused(f"queue '{queue.name}' in vhost '{vhost.name}' in exclusive use")
    consumer = Consumer(tag, channel, queue, method.no_ack, method.exclusive, arguments, channel.consumer_prefetch)
    channel.consumers[tag] = consumer
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
    channel.get(channel.vhost.get_queue(_queue_name(channel, method.queue), channel.connection), method.no_ack)


def _basic_recover(channel: Channel, method: spec.Basic.Recover) -> None:
    if not method.requeue:
        raise errors.not_implemented("requeue=false")
    channel.requeue_all()
    channel.send_method(spec.Basic.RecoverOk())


def _basic_recover_async(channel: Channel, method: spec.Basic.RecoverAsync) -> None:
    if not method.requeue:
        raise errors.not_implemented("requeue=false")
    channel.requeue_all()


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
