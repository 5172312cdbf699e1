"""A vhost deleted a step at a time (Node.delete_vhost, run by the API in slices): it leaves the node's vhosts at its
first step, its name stays taken until its last, and everything in it goes, what a client still closing made
meanwhile and a queue's many bindings included."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Iterator

import pytest

from broker.model.node import Node
from broker.model.vhost import BINDINGS_AT_ONCE
from tests.unit.broker.model.test_exclusive_queues import Owner

if TYPE_CHECKING:
    from broker.model.vhost import VirtualHost

QUEUES = 300


def filled(node: Node, name: str = "v") -> None:
    """A vhost of QUEUES queues, each bound to a topic exchange, the first by more than its deletion removes at once;
    and an auto-delete exchange bound to the first queue alone."""
    vhost = node.add_vhost(name)
    topic = vhost.declare_exchange("t", "topic", False, True, False, False, {})
    lone = vhost.declare_exchange("lone", "direct", False, True, True, False, {})
    for number in range(QUEUES):
        queue = vhost.declare_queue(f"q{number}", Owner(), False, True, False, False, {})
        vhost.bind(topic, queue, f"q.{number}", {})
    first = vhost.queues["q0"]
    vhost.bind(lone, first, "k", {})
    for number in range(2 * BINDINGS_AT_ONCE):
        vhost.bind(topic, first, f"many.{number}.#", {})


def deletion_begun() -> tuple[Node, "VirtualHost", Iterator[None]]:
    """A node whose vhost "v" (filled) has taken its deletion's first step: the node, the vhost, the other steps."""
    node = Node()
    filled(node)
    vhost = node.vhosts["v"]
    steps = node.delete_vhost("v")
    next(steps)
    return node, vhost, steps


def test_a_vhost_leaves_at_the_first_step_and_its_name_is_taken_until_the_last():
    async def scenario() -> None:
        node, vhost, steps = deletion_begun()
        assert "v" not in node.vhosts and "v" in node.deleting
        with pytest.raises(ValueError, match="vhost 'v' is being deleted"):
            node.add_vhost("v")
        waiting = asyncio.ensure_future(node.vhost_deleted("v"))
        late = vhost.declare_queue("made-meanwhile", Owner(), False, True, False, False, {})
        taken = 1
        for _ in steps:
            taken += 1
        await asyncio.sleep(0)
        assert waiting.done() and not node.deleting
        assert taken > QUEUES + 2 * BINDINGS_AT_ONCE  # (a step each, the first queue's bindings too)
        assert not vhost.queues and list(vhost.exchanges) == [""] and late.deleted
        assert node.add_vhost("v").queues == {}

    asyncio.run(scenario())


def test_a_vhost_being_deleted_is_found_by_no_one():
    async def scenario() -> None:
        node = Node()
        filled(node)
        steps = node.delete_vhost("v")
        next(steps)
        with pytest.raises(Exception, match="no vhost 'v'"):
            node.vhost("v")
        for _ in steps:
            pass
        await node.vhost_deleted("v")  # (none under way: at once)

    asyncio.run(scenario())


def test_the_first_step_takes_the_vhost_out_with_its_permissions():
    async def scenario() -> None:
        node = Node()
        filled(node)
        node.put_user("bob", "secret")
        node.set_permissions("bob", "v", ".*", ".*", ".*")
        steps = node.delete_vhost("v")
        next(steps)
        assert "v" not in node.vhosts and ("v", "bob") not in node.permissions
        for _ in steps:
            pass

    asyncio.run(scenario())


class Failing:
    """A watcher of the topology that fails at the first change it is told of (a bug in a step of the deletion)."""

    def topology_changed(self, vhost, kind: str, name: str) -> None:
        raise RuntimeError("a bug")


def test_a_deletion_that_fails_leaves_what_is_left_of_the_vhost_and_frees_its_name():
    async def scenario() -> None:
        node, vhost, steps = deletion_begun()
        waiting = asyncio.ensure_future(node.vhost_deleted("v"))
        await asyncio.sleep(0)
        vhost.watcher = Failing()  # (told of the first queue deleted)
        with pytest.raises(RuntimeError):
            for _ in steps:
                pass
        await asyncio.sleep(0)
        assert node.vhosts["v"] is vhost and not node.deleting and waiting.done()

    asyncio.run(scenario())
