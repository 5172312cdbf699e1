"""The handlers of the AMQP methods a client may send on a channel: each checks its arguments and calls the model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pamqp import commands as spec

from broker.model.access import CONFIGURE, EXCHANGE, QUEUE, READ, WRITE
from broker.model.exchange import EXCHANGE_TYPES
from broker.model.vhost import generated_name
from broker.session import direct_reply
from broker.session.consumer import Consumer
from protocol import errors

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
    # RabbitMQ checks the type and refuses the default exchange before permissions; a passive declare needs none
    if not method.passive and method.exchange and method.exchange_type in EXCHANGE_TYPES:
        channel.access.check(CONFIGURE, EXCHANGE, method.exchange)
        if not existed and not method.exchange.startswith("amq."):  # a reserved name is refused before the AE
            _check_alternate_exchange(channel, method)
    exchange = vhost.declare_exchange(method.exchange, method.exchange_type, method.passive, method.durable,
                                      method.auto_delete, method.internal, method.arguments or {})
    if not existed:
        channel.undo = lambda: vhost.delete_exchange(exchange.name, if_unused=False)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeclareOk())


def _check_alternate_exchange(channel: Channel, method: spec.Exchange.Declare) -> None:
    """A new exchange with an alternate exchange: its messages may end up there, so RabbitMQ wants read on it and
    write on the alternate."""
    alternate = (method.arguments or {}).get("alternate-exchange")
    if isinstance(alternate, str):  # another type is refused by the argument checks
        channel.access.check(READ, EXCHANGE, method.exchange)
        channel.access.check(WRITE, EXCHANGE, alternate)


def _exchange_delete(channel: Channel, method: spec.Exchange.Delete) -> None:
    if method.exchange and not method.exchange.startswith("amq."):  # those are refused first, whatever the rights
        channel.access.check(CONFIGURE, EXCHANGE, method.exchange)
    channel.vhost.delete_exchange(method.exchange, method.if_unused)
    if not method.nowait:
        channel.send_method(spec.Exchange.DeleteOk())


def _check_binding(channel: Channel, source: str, kind: str, destination: str) -> None:
    """(Un)binding needs write on the destination and read on the source exchange, checked before either is
    looked up, as in RabbitMQ, which refuses the default exchange between the two checks."""
    channel.access.check(WRITE, kind, destination)
    if not source or not destination:
        raise errors.access_refused("operation not permitted on the default exchange")
    channel.access.check(READ, EXCHANGE, source)


def _exchange_bind(channel: Channel, method: spec.Exchange.Bind) -> None:
    _check_binding(channel, method.source, EXCHANGE, method.destination)
    vhost = channel.vhost
    source, destination = vhost.get_exchange(method.source), vhost.get_exchange(method.destination)
    vhost.bind(source, destination, method.routing_key, method.arguments or {})
    channel.undo = lambda: vhost.unbind(source, destination, method.routing_key, method.arguments or {})
    if not method.nowait:
        channel.send_method(spec.Exchange.BindOk())


def _exchange_unbind(channel: Channel, method: spec.Exchange.Unbind) -> None:
    _check_binding(channel, method.source, EXCHANGE, method.destination)
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
    server_named = not method.passive and not method.queue
    # RabbitMQ checks a server-named queue's permissions on the name it is about to get, before it exists
    name = generated_name("amq.gen-") if server_named else _queue_name(channel, method.queue)
    existed = name in vhost.queues
    if not method.passive and (server_named or not name.startswith("amq.")):  # a reserved name is refused first
        _check_queue_declare(channel, name, existed, method.arguments)
    queue = vhost.declare_queue(name, channel.connection, method.passive, method.durable, method.exclusive,
                                method.auto_delete, method.arguments or {}, server_named)
    if not existed:
        channel.undo = lambda: vhost.delete_queue(queue)
    channel.last_queue = queue.name
    if not method.nowait:
        channel.send_method(spec.Queue.DeclareOk(queue.name, queue.count_ready(), len(queue.consumers)))


def _check_queue_declare(channel: Channel, name: str, existed: bool, arguments: dict | None) -> None:
    """Declaring a queue needs configure on it; a new one with a dead-letter exchange also needs read on the queue
    and write on that exchange (the DLX guide)."""
    channel.access.check(CONFIGURE, QUEUE, name)
    dead_letter_exchange = (arguments or {}).get("x-dead-letter-exchange")
    if not existed and isinstance(dead_letter_exchange, str):  # another type is refused by the argument checks
        channel.access.check(READ, QUEUE, name)
        channel.access.check(WRITE, EXCHANGE, dead_letter_exchange)


def _queue_bind(channel: Channel, method: spec.Queue.Bind) -> None:
    vhost = channel.vhost
    name = _queue_name(channel, method.queue)
    _check_binding(channel, method.exchange, QUEUE, name)
    queue = vhost.get_queue(name, channel.connection)
    routing_key = method.routing_key if (method.routing_key or method.queue) else queue.name
    exchange = vhost.get_exchange(method.exchange)
    vhost.bind(exchange, queue, routing_key, method.arguments or {})
    channel.undo = lambda: vhost.unbind(exchange, queue, routing_key, method.arguments or {})
    if not method.nowait:
        channel.send_method(spec.Queue.BindOk())


def _queue_unbind(channel: Channel, method: spec.Queue.Unbind) -> None:
    vhost = channel.vhost
    name = _queue_name(channel, method.queue)
    _check_binding(channel, method.exchange, QUEUE, name)
    queue = vhost.queues.get(name)
    vhost.unbind(vhost.exchanges.get(method.exchange), queue, method.routing_key, method.arguments or {},
                 channel.connection)
    channel.send_method(spec.Queue.UnbindOk())


def _readable_queue(channel: Channel, name: str):
    """The queue a purge, get or consume names, which needs read on it (checked before the queue is looked up)."""
    name = _queue_name(channel, name)
    channel.access.check(READ, QUEUE, name)
    return channel.vhost.get_queue(name, channel.connection)


def _queue_purge(channel: Channel, method: spec.Queue.Purge) -> None:
    queue = _readable_queue(channel, method.queue)
    count = queue.purge()
    if not method.nowait:
        channel.send_method(spec.Queue.PurgeOk(message_count=count))


def _queue_delete(channel: Channel, method: spec.Queue.Delete) -> None:
    vhost = channel.vhost
    name = _queue_name(channel, method.queue)
    channel.access.check(CONFIGURE, QUEUE, name)
    queue = vhost.queues.get(name)
    count = 0
    if queue is not None:
        vhost.check_exclusive_access(queue, channel.connection)
        if method.if_unused and queue.consumers:
            raise errors.precondition_failed(f"queue '{queue.name}' in vhost '{vhost.name}' in use")
        if method.if_empty and queue.has_ready():
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
    queue = _readable_queue(channel, method.queue)
    arguments = method.arguments or {}
    queue.check_consume(method.no_ack, channel.consumer_prefetch, channel.unacked.global_prefetch, arguments)
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
