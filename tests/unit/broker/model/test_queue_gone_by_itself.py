"""A queue of many bindings that the server deletes by itself (x-expires unused, auto-delete after its last
consumer: VirtualHost.delete_queue) goes at once, as RabbitMQ deletes it the moment it decides to: its name is free
for a new queue, no message is routed to it, no listing shows its bindings; they leave the exchanges' indexes
after it, a slice a loop turn. The store is told of its end in an order a restart on the way, or a queue of the
same name recorded meanwhile, can rely on."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from pamqp.commands import Basic

from broker.model import durability
from broker.model.message import Address, Header, Message
from broker.model.node import Node
from broker.model.vhost import VirtualHost
from protocol.codec import encode_header_payload
from tests.unit.broker.model.test_exclusive_queues import Owner
from tests.unit.broker.model.node_support import on_node

MANY = 20_000  # topic bindings of the queue: more than a deletion removes at once (BINDINGS_AT_ONCE), several turns


def bound(vhost: VirtualHost, durable_ends: bool = False, auto_delete_exchange: bool = False,
          arguments: dict | None = None):
    """A topic exchange "t" (of these arguments) and queue "q" bound by MANY patterns k.<n>.#."""
    exchange = vhost.declare_exchange("t", "topic", False, durable_ends, auto_delete_exchange, False, arguments or {})
    queue = vhost.declare_queue("q", Owner(), False, durable_ends, False, False, {})
    for number in range(MANY):
        vhost.bind(exchange, queue, f"k.{number}.#", {})
    return exchange, queue


async def left_indexes(vhost: VirtualHost) -> int:
    """The loop turns taken until no deleted queue's bindings are left in an index."""
    turns = 0
    while vhost.unindexing:
        await asyncio.sleep(0)
        turns += 1
    return turns


def published(routing_key: str) -> Message:
    return Message(Address("t", routing_key), Header(encode_header_payload(0, Basic.Properties())), b"")


def routed(vhost: VirtualHost, routing_key: str) -> list[str]:
    """The queues a message published to "t" with this key reaches."""
    return [queue.name for queue in vhost.route(vhost.exchanges["t"], [routing_key], published(routing_key))]


def test_the_queue_goes_at_once_and_its_bindings_leave_the_index_over_loop_turns():
    async def scenario() -> int:
        vhost = VirtualHost("/")
        exchange, queue = bound(vhost)
        vhost.delete_queue(queue)
        assert queue.deleted and "q" not in vhost.queues
        assert len(exchange.bindings) == MANY  # (still in the index: they leave from the next loop turn on)
        assert routed(vhost, "k.1.x") == [] and list(exchange.live_bindings()) == []
        assert vhost.exchange_to_delete("t", if_unused=True) is exchange  # (unused: its bindings are gone)
        turns = await left_indexes(vhost)
        assert not exchange.bindings and not list(exchange.route("k.1.x", published("k.1.x"))) and not queue.bindings
        return turns

    assert asyncio.run(scenario()) > 1


def test_a_queue_declared_at_once_under_its_name_is_a_new_one_reached_by_its_own_bindings_alone():
    async def scenario() -> None:
        vhost = VirtualHost("/")
        exchange, old = bound(vhost)
        vhost.delete_queue(old)
        new = vhost.declare_queue("q", Owner(), False, False, False, False, {})
        assert new is not old and not new.bindings
        vhost.bind(exchange, new, "k.1.#", {})  # (an old binding's very names)
        assert vhost.route(exchange, ["k.1.x"], published("k.1.x")) == [new]
        assert routed(vhost, "k.2.x") == []
        assert [binding.destination for binding in exchange.live_bindings()] == [new]
        await left_indexes(vhost)
        assert vhost.route(exchange, ["k.1.x"], published("k.1.x")) == [new] and list(exchange.bindings.values()) == [
            exchange.find_binding(new, "k.1.#", {})]

    asyncio.run(scenario())


def test_a_message_that_reaches_the_deleted_queue_alone_goes_to_the_alternate_exchange():
    async def scenario() -> None:
        vhost = VirtualHost("/")
        alternate = vhost.declare_exchange("ae", "fanout", False, False, False, False, {})
        caught = vhost.declare_queue("caught", Owner(), False, False, False, False, {})
        vhost.bind(alternate, caught, "", {})
        _, queue = bound(vhost, arguments={"alternate-exchange": "ae"})
        vhost.delete_queue(queue)
        assert routed(vhost, "k.1.x") == ["caught"]
        await left_indexes(vhost)

    asyncio.run(scenario())


def test_an_auto_delete_exchange_goes_with_the_last_of_them_unless_bound_meanwhile():
    async def scenario() -> tuple[bool, bool]:
        vhost = VirtualHost("/")
        exchange, queue = bound(vhost, auto_delete_exchange=True)
        vhost.delete_queue(queue)
        await left_indexes(vhost)
        alone = exchange.deleted and "t" not in vhost.exchanges
        exchange, queue = bound(vhost, auto_delete_exchange=True)
        vhost.delete_queue(queue)
        other = vhost.declare_queue("other", Owner(), False, False, False, False, {})
        vhost.bind(exchange, other, "k.1.#", {})
        await left_indexes(vhost)
        return alone, vhost.exchanges.get("t") is exchange and not exchange.deleted

    assert asyncio.run(scenario()) == (True, True)


# --- what a restart finds -----------------------------------------------------------------------------------------
def vhost_v(node: Node) -> VirtualHost:
    """The node's vhost "v", added on its first start."""
    return node.vhosts["v"] if "v" in node.vhosts else node.add_vhost("v")


def found(data_dir: Path) -> dict[str, list[str]]:
    """Each queue of vhost "v" a start finds, with the routing keys of its bindings."""
    async def look(node: Node) -> dict[str, list[str]]:
        return {name: sorted(binding.routing_key for binding in queue.bindings)
                for name, queue in vhost_v(node).queues.items()}
    return on_node(data_dir, look)


def test_a_durable_queue_recorded_again_at_once_keeps_its_own_bindings_across_a_restart(tmp_path):
    async def scenario(node: Node) -> None:
        vhost = vhost_v(node)
        exchange, old = bound(vhost, durable_ends=True)
        vhost.delete_queue(old)
        new = vhost.declare_queue("q", Owner(), False, True, False, False, {})
        vhost.bind(exchange, new, "k.1.#", {})
        vhost.bind(exchange, new, "mine", {})
        await left_indexes(vhost)

    on_node(tmp_path, scenario)
    assert found(tmp_path) == {"q": ["k.1.#", "mine"]}


def test_a_restart_on_the_way_finds_the_queue_with_the_bindings_left_and_a_later_end_leaves_nothing(tmp_path,
                                                                                                   caplog):
    async def cut_short(node: Node) -> None:
        vhost = vhost_v(node)
        _, queue = bound(vhost, durable_ends=True)
        vhost.delete_queue(queue)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert vhost.unindexing  # (stopped on the way)

    on_node(tmp_path, cut_short, cut_short=True)
    with caplog.at_level(logging.ERROR):
        halfway = found(tmp_path)
    assert list(halfway) == ["q"] and 0 < len(halfway["q"]) < MANY
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]

    async def deleted_again(node: Node) -> None:
        vhost = vhost_v(node)
        vhost.delete_queue(vhost.queues["q"])
        await left_indexes(vhost)

    on_node(tmp_path, deleted_again)
    assert found(tmp_path) == {}


def test_a_client_deleting_the_queue_meanwhile_has_its_end_recorded_at_once(tmp_path):
    async def scenario(node: Node) -> None:
        vhost = vhost_v(node)
        _, queue = bound(vhost, durable_ends=True)
        vhost.delete_queue(queue)
        vhost.delete(queue)  # (a client's delete that looked it up before: its reply waits for what is written)
        assert not vhost.unrecorded and vhost.unindexing

    on_node(tmp_path, scenario, cut_short=True)  # (before its bindings left the indexes)
    assert found(tmp_path) == {}


def test_a_vhost_deleted_meanwhile_leaves_nothing_of_the_queue_to_a_new_vhost_of_its_name(tmp_path):
    async def scenario(node: Node) -> None:
        vhost = vhost_v(node)
        _, queue = bound(vhost, durable_ends=True)
        vhost.delete_queue(queue)
        for _ in node.delete_vhost("v"):
            pass
        again = node.add_vhost("v")
        again.declare_queue("q", Owner(), False, True, False, False, {})
        await left_indexes(vhost)

    on_node(tmp_path, scenario)
    assert found(tmp_path) == {"q": []}


def test_a_client_deletion_under_way_leaves_the_bindings_of_a_new_queue_of_its_name_alone(tmp_path):
    """A client deletes the queue (its bindings removed first, unbind_all), its last consumer goes meanwhile, and a
    queue of its name is declared again at once and bound by some of the old keys: those stay, across a restart."""
    async def scenario(node: Node) -> int:
        vhost = vhost_v(node)
        exchange, old = bound(vhost, durable_ends=True)
        unbound = asyncio.get_running_loop().create_future()
        vhost.unbind_all(old, lambda: unbound.set_result(None))
        await asyncio.sleep(0)
        vhost.delete_queue(old)
        new = vhost.declare_queue("q", Owner(), False, True, False, False, {})
        keys = [binding.routing_key for binding in old.bindings if exchange.bindings.get(binding.key) is binding]
        for key in keys[::100]:
            vhost.bind(exchange, new, key, {})
        await unbound
        vhost.delete(old)  # (the client's delete, once the bindings are few enough)
        await left_indexes(vhost)
        assert len(new.bindings) == len(keys[::100])
        return len(new.bindings)

    kept = on_node(tmp_path, scenario)
    assert kept > 10 and len(found(tmp_path)["q"]) == kept


def test_a_stop_on_the_way_records_the_queue_gone(tmp_path):
    async def scenario(node: Node) -> None:
        vhost = vhost_v(node)
        _, queue = bound(vhost, durable_ends=True)
        vhost.delete_queue(queue)
        node.record_ends()  # (as the server's stop does, before its store's last batch)

    on_node(tmp_path, scenario, cut_short=True)
    assert found(tmp_path) == {}


def test_a_binding_whose_leaving_failed_has_its_record_written_with_the_others(tmp_path, monkeypatch):
    async def scenario(node: Node) -> None:
        vhost = vhost_v(node)
        _, queue = bound(vhost, durable_ends=True)
        vhost.delete_queue(queue)
        asked = []
        is_durable = durability.binding_is_durable

        def failing_once(binding) -> bool:
            asked.append(binding)
            if len(asked) == 5:
                raise OSError("the fifth binding's record refused")
            return is_durable(binding)
        monkeypatch.setattr(durability, "binding_is_durable", failing_once)
        await asyncio.sleep(0)  # (the slice that fails, logged: the rest of the bindings left in the index)
        monkeypatch.undo()
        node.record_ends()
        vhost.declare_queue("q", Owner(), False, True, False, False, {})  # (which a record left would bind)

    on_node(tmp_path, scenario, cut_short=True)
    assert found(tmp_path) == {"q": []}
