"""A helper of the model tests: a node started on a data dir as the broker starts one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

from broker.model.durability import restore
from broker.model.node import Node
from storage.store import MessageStore
from tests.unit.storage.storage_support import durable

T = TypeVar("T")


def on_node(data_dir: Path, scenario: Callable[[Node], Awaitable[T]], cut_short: bool = False) -> T:
    """Start on data_dir as the broker does (vhosts, users and permissions, then the rest), run the scenario, stop
    once everything is durable (or, cut short, at once: what was handed to the store written, the work under way
    left where it is)."""
    async def main() -> T:
        store = MessageStore(data_dir)
        recovered = store.recover()
        node = Node(store)
        node.restore_definitions(recovered.vhosts, recovered.users, recovered.permissions,
                                 recovered.topic_permissions)
        restore(node, recovered)
        seen = await scenario(node)
        if not cut_short:
            assert await durable(store)
        store.close()
        return seen
    return asyncio.run(main())
