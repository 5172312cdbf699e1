"""What the broker writes to durable storage, and how it rebuilds a virtual host from what was stored."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.message import Address, Header, Message

if TYPE_CHECKING:
    from broker.exchange import Binding, Exchange
    from broker.queue import Queue
    from broker.vhost import VirtualHost
    from storage.recovery import Recovered

log = logging.getLogger(__name__)


def queue_key(vhost_name: str, queue_name: str) -> str:
    """The name a queue's messages and definition have in the store."""
    return f"{vhost_name}|{queue_name}"


def exchange_definition(vhost: "VirtualHost", exchange: "Exchange") -> dict:
    return {"vhost": vhost.name, "name": exchange.name, "type": exchange.kind, "durable": True,
            "auto_delete": exchange.auto_delete, "internal": exchange.internal, "arguments": exchange.arguments}


def queue_definition(vhost: "VirtualHost", queue: "Queue") -> dict:
    return {"vhost": vhost.name, "name": queue.name, "durable": True, "auto_delete": queue.auto_delete,
            "arguments": queue.arguments}


def binding_is_durable(binding: "Binding") -> bool:
    """RabbitMQ keeps a binding across restarts when both its ends are durable."""
    destination = binding.destination
    durable_destination = destination.durable if binding.destination_is_exchange else destination.stored
    return binding.source.durable and durable_destination


def binding_key(vhost: "VirtualHost", binding: "Binding") -> str:
    kind = "exchange" if binding.destination_is_exchange else "queue"
    return "\x00".join((vhost.name, binding.source.name, kind, binding.destination.name, binding.routing_key,
                        binding.arguments_key))


def binding_definition(vhost: "VirtualHost", binding: "Binding") -> dict:
    return {"vhost": vhost.name, "source": binding.source.name, "destination": binding.destination.name,
            "destination_kind": "exchange" if binding.destination_is_exchange else "queue",
            "routing_key": binding.routing_key, "arguments": binding.arguments}


def restore(vhost: "VirtualHost", recovered: "Recovered") -> None:
    """Rebuild the durable exchanges, queues, bindings and queued messages of vhost."""
    for data in recovered.exchanges:
        if data["vhost"] == vhost.name and data["name"] not in vhost.exchanges:
            vhost.restore_exchange(data["name"], data["type"], data["auto_delete"], data["internal"],
                                   data["arguments"])
    for data in recovered.queues:
        if data["vhost"] == vhost.name:
            vhost.restore_queue(data["name"], data["auto_delete"], data["arguments"])
    for data in recovered.bindings:
        if data["vhost"] != vhost.name:
            continue
        source = vhost.exchanges.get(data["source"])
        table = vhost.exchanges if data["destination_kind"] == "exchange" else vhost.queues
        destination = table.get(data["destination"])
        if source is None or destination is None:
            log.warning("dropping a stored binding whose ends are gone: %s -> %s", data["source"],
                        data["destination"])
            continue
        vhost.bind(source, destination, data["routing_key"], data["arguments"], record=False)
    restored = 0
    addresses: dict[tuple[str, str], Address] = {}  # shared by the messages that have the same one
    headers: dict[bytes, Header] = {}
    for queue in vhost.queues.values():
        stored = recovered.messages.get(queue.store_key, ())
        messages = []
        for item in stored:
            address = addresses.get((item.exchange, item.routing_key))
            if address is None:
                address = addresses[item.exchange, item.routing_key] = Address(item.exchange, item.routing_key)
            header = headers.get(item.header_payload)
            if header is None:
                header = headers[item.header_payload] = Header(item.header_payload)
            messages.append((Message(address, header, item.body, item.msg_id), item.redelivered))
        queue.restore(messages)
        restored += len(messages)
    known = {queue.store_key for queue in vhost.queues.values()}
    for key in recovered.messages:
        if key not in known and key.startswith(f"{vhost.name}|"):
            vhost.store.delete_queue(key)  # messages of a queue whose definition did not survive
    vhost.next_msg_id = max(recovered.next_msg_id, 1)  # 0 marks a message that is not stored
    log.info("vhost '%s': %d exchanges, %d queues, %d bindings, %d messages restored", vhost.name,
             len(recovered.exchanges), len(recovered.queues), len(recovered.bindings), restored)
