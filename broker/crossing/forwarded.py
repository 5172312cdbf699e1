"""The changes a copy's client makes to a vhost's definitions (broker.crossing.copies), run at the vhost's home: by
the operations the home's own clients go through (broker.model.operations), with the same checks, as the client's
user; answered once every copy applied what they changed (and the home's disk has it, where they wrote), so that the
client's reply follows its copy's change.

A queue a copy's client declares ``client-local`` is placed at the client's process; an exclusive or server-named
one is made there first and registered here (``register``), as a stand-in exclusive to that client's connection
(broker.crossing.copies.OwnerElsewhere); when that connection closes, its stand-ins go (``release``) before its
close-ok."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from broker.crossing.frames import NOTICE
from broker.crossing.home import Crossing
from broker.model import operations
from broker.model.access import ChannelAccess
from broker.model.remote import RemoteQueue
from broker.model.vhost import OwnerElsewhere
from protocol import errors
from protocol.constants import INTERNAL_ERROR
from protocol.errors import AMQPError
from storage.definitions_log import encode_data

if TYPE_CHECKING:
    from broker.crossing.owner import HomeLink
    from broker.model.node import Node
    from broker.model.vhost import VirtualHost


def run(node: "Node", link: "HomeLink", operation: dict) -> None:
    """Run one change a copy asked for, and answer it (a ``ran`` notice with the asker's id) once it is applied
    everywhere."""
    number = int(operation["id"])
    vhost = node.vhosts.get(str(operation["vhost"]))
    group = link.group
    if vhost is None or group is None or not node.serves(vhost.name):  # (moved, or deleted, meanwhile)
        _answer(link, number, {"error": [INTERNAL_ERROR, f"INTERNAL_ERROR - vhost '{operation['vhost']}' is not "
                                                         "led by the worker asked"]})
        return
    crossing = vhost.crossing
    assert crossing is not None, "a copy's client reaches its home across"
    vhost.changed_owners = {}  # (those of changes made outside any method: nobody waits for them)
    stand_in = _counted_first(vhost, operation)
    if stand_in is not None:
        stand_in.count_there()
        vhost.counted_there = None
        owners = vhost.take_changed_owners()
        assert owners is not None, "a count asks the queue's owner"
        vhost.when_acked(owners, lambda ok: run(node, link, {**operation, "counted": True}))
        return
    owner = vhost.owner_elsewhere(group, str(operation["connection"]))
    client_id = operation.get("client_id")  # (an MQTT client's, for its topic permissions)
    access = ChannelAccess(node, str(operation["user"]), vhost.name, None if client_id is None else str(client_id))
    actor = operations.Actor(vhost, access, owner)
    if _unbound_first(node, link, actor, operation):
        return
    changes = vhost.durable_changes
    vhost.counted_there = None
    vhost.placing_for = group
    result: dict = {}
    undo: Callable[[], object] | None = None  # takes the change back, if the disk or a copy could not take it
    try:
        result, undo = _run(actor, operation, group)
    except AMQPError as error:
        result = {"error": [error.reply_code, error.text]}
    finally:
        vhost.placing_for = None
    if not owner.exclusive_queues:  # (kept while a queue is exclusive to its connection)
        vhost.owners_elsewhere.pop(owner.key, None)
    counted, vhost.counted_there = vhost.counted_there, None
    if crossing.reaches(group):  # (the asker's copy has every change made so far before the answer)
        vhost.note_owner(vhost.changed_owners, group)
    owners = vhost.take_changed_owners()
    written = vhost.durable_changes != changes

    def applied(ok: bool) -> None:
        if not ok and "error" not in result:
            if undo is not None:
                undo()
            # (the text of a change of the home's own clients that the disk, or a copy, could not take)
            result["error"] = [INTERNAL_ERROR, f"INTERNAL_ERROR - {operation['what']} could not be written to disk"]
        if counted is not None:
            result["messages"] = counted.value
            if "consumers" in result:  # (a declare's: the owner counts those of every process)
                result["consumers"] = counted.consumers
        _answer(link, number, result)

    if written:
        vhost.when_durable(applied, owners)
    elif owners:
        vhost.when_acked(owners, applied)
    else:
        applied(True)


def _counted_first(vhost: "VirtualHost", operation: dict) -> RemoteQueue | None:
    """The queue elsewhere whose owner is to count its messages and consumers (on any process) for the if-empty
    or if-unused of a delete, before it runs; None if there is none, or it has."""
    queue = vhost.queues.get(str(operation.get("queue")))
    if (operation["what"] == "queue.delete" and "counted" not in operation
            and (operation["if_unused"] or operation["if_empty"]) and isinstance(queue, RemoteQueue)):
        return queue
    return None


def _unbound_first(node: "Node", link: "HomeLink", actor: operations.Actor, operation: dict) -> bool:
    """Whether a queue.delete or exchange.delete, its checks passed, waits for the many bindings of what it deletes
    to go first, a slice a loop turn (VirtualHost.unbind_all), as the home's own clients' deletes do; it then runs
    again without if-unused and if-empty, or, where another client deleted the subject meanwhile, is answered as
    for none."""
    what = operation["what"]
    if what not in ("queue.delete", "exchange.delete") or "unbound" in operation:
        return False
    vhost = actor.vhost
    try:
        subject = (operations.queue_to_delete(actor, str(operation["queue"]), bool(operation["if_unused"]),
                                              bool(operation["if_empty"])) if what == "queue.delete"
                   else operations.exchange_to_delete(actor, str(operation["exchange"]), bool(operation["if_unused"])))
    except AMQPError:
        return False  # (refused as it runs)
    if subject is None or not vhost.has_many_bindings(subject):
        return False

    def unbound() -> None:
        if subject.deleted:
            vhost.delete(subject)  # (the records of its end, where its own deletion has yet to write them)
            _answer(link, int(operation["id"]), {"messages": 0} if what == "queue.delete" else {})
        else:
            run(node, link, {**operation, "unbound": True, "if_unused": False, "if_empty": False})

    vhost.unbind_all(subject, unbound)
    return True


def _run(actor: operations.Actor, operation: dict, group: int) -> tuple[dict, Callable[[], object] | None]:
    """The change made: what the answer says, and how to take it back (as the AMQP handlers' undo)."""
    what = operation["what"]
    vhost = actor.vhost
    if what == "exchange.declare":
        name = str(operation["exchange"])
        _, made = operations.declare_exchange(actor, name, str(operation["type"]), False, bool(operation["durable"]),
                                              bool(operation["auto_delete"]), bool(operation["internal"]),
                                              dict(operation["arguments"]))
        return {}, (lambda: vhost.delete_exchange(name, if_unused=False)) if made else None
    if what == "exchange.delete":
        operations.delete_exchange(actor, str(operation["exchange"]), bool(operation["if_unused"]))
        return {}, None
    if what == "bind":
        key, arguments = str(operation["routing_key"]), dict(operation["arguments"])
        source, destination, made = operations.bind(actor, str(operation["source"]), str(operation["kind"]),
                                                    str(operation["destination"]), key, arguments)
        return {}, (lambda: vhost.unbind(source, destination, key, arguments)) if made else None
    if what == "unbind":
        operations.unbind(actor, str(operation["source"]), str(operation["kind"]), str(operation["destination"]),
                          str(operation["routing_key"]), dict(operation["arguments"]))
        return {}, None
    if what == "queue.declare":
        queue, made = operations.declare_queue(actor, str(operation["queue"]), False, bool(operation["durable"]),
                                               False, bool(operation["auto_delete"]), dict(operation["arguments"]))
        undo = (lambda: vhost.delete_queue(queue)) if made else None
        if isinstance(queue, RemoteQueue) and not made:  # (its owner counts its messages)
            queue.count_there()
            return {"consumers": len(queue.consumers)}, undo
        return {"messages": queue.count_ready(), "consumers": len(queue.consumers)}, undo
    if what == "queue.delete":  # (a stand-in's if-empty and if-unused read what its owner counted just now)
        return {"messages": operations.delete_queue(actor, str(operation["queue"]), bool(operation["if_unused"]),
                                                    bool(operation["if_empty"]))}, None
    if what == "register":
        stand_in = _register(vhost, actor, operation, group)
        return {}, lambda: vhost.delete_queue(stand_in)
    if what == "release":  # (the copy's connection closed: the queues exclusive to it are gone there)
        crossing = vhost.crossing
        assert isinstance(crossing, Crossing), "a copy's client reaches its home across"
        for stand_in in list(actor.owner.exclusive_queues):
            if isinstance(stand_in, RemoteQueue):
                crossing.queue_gone(stand_in)
        return {}, None
    raise errors.command_invalid(f"unknown change {what!r}")


def _register(vhost: "VirtualHost", actor: operations.Actor, operation: dict, group: int) -> RemoteQueue:
    """A queue a copy's client made there (exclusive or server-named): a stand-in here, which the copies learn of."""
    name = str(operation["queue"])
    if name in vhost.queues:
        raise vhost.locked(name)
    crossing = vhost.crossing
    assert crossing is not None, "a copy's client reaches its home across"
    stand_in = RemoteQueue(vhost, name, bool(operation["durable"]), bool(operation["auto_delete"]),
                           dict(operation["arguments"]), group, crossing)
    holder = actor.owner if operation.get("exclusive") else None
    assert holder is None or isinstance(holder, OwnerElsewhere), "a copy's client is a connection elsewhere"
    vhost.add_stand_in(stand_in, True, holder)
    return stand_in


def _answer(link: "HomeLink", number: int, result: dict) -> None:
    if link.link.open:
        link.link.send(NOTICE, encode_data({"op": "ran", "id": number, **result}))
