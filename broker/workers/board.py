"""A board the workers of a node post facts on and read whole: each worker posts under keys of its own, and the
supervisor keeps the union and sends it to every worker whenever it changes. (The workers of a clustered node post
which node leads their replication group, and route clients by what all of them posted: cluster.worker.)

One socket pair per worker carries JSON lines: worker -> supervisor ``{key: value, ...}`` (a null value takes the
key off); supervisor -> worker the whole board. A worker that ends has its keys taken off (but those the board's
``lasting`` keeps).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

LINE_LIMIT = 1024 * 1024  # the longest line either side reads: a board of a few thousand short entries
GROUP_KEY_PREFIX = "group "  # (group_key)
CLUSTER_SECRET = "cluster secret"  # a clustered node's key for the cluster's secret (group 0's), which proves forwards
PLACEMENT_KEY = "placement"  # a clustered node's key for the cluster's record of its vhosts (vhost -> group)


def group_key(group: int) -> str:
    """A clustered node's key for who leads a replication group: {"node", "host", "port", "api"} (its management
    port), as cluster.groups.posted writes it."""
    return f"{GROUP_KEY_PREFIX}{group}"


def members_key(group: int) -> str:
    """A clustered node's key for the nodes registered in a replication group now: {node: {"host", "api"}} (its
    AMQP host and management port), as cluster.groups.members_posted writes it."""
    return f"members {group}"


def known_key(group: int) -> str:
    """A clustered node's key for every node that ever registered in a replication group, running or not: {node:
    {"host", "api"}}, as members_key's."""
    return f"known {group}"


def maintenance_key(worker: int) -> str:
    """A clustered node's key for whether a worker has taken the node's maintenance in (True: its front doors
    take no client, cluster.node), for a drain or a revive to wait on."""
    return f"maintenance {worker}"


def nodes_of(board: dict[str, Any], groups: int, key: Callable[[int], str] = members_key) -> dict[str, dict]:
    """Every node registered in any of a clustered node's groups, as its board says: node -> {"host", "api"} (with
    known_key: every node that ever registered, running or not)."""
    return {node: address for group in range(groups) for node, address in (board.get(key(group)) or {}).items()}


def led_elsewhere(node: str) -> Callable[[str, Any], bool]:
    """What a clustered node's board keeps of a worker that ends: who leads its group, when another node does. That
    node still leads it as far as this one knows, and the node's other workers go on forwarding the group's clients
    there while the worker starts again (it posts anew once it has read the leader from etcd). And the cluster's
    secret and the record of the vhosts, which worker 0 posts: the node's other workers go on proving their forwards
    with it, and the supervisor placing vhosts by it, while worker 0 starts again."""
    def kept(key: str, value: Any) -> bool:
        return key in (CLUSTER_SECRET, PLACEMENT_KEY) or (
            key.startswith(GROUP_KEY_PREFIX) and isinstance(value, dict) and value.get("node") != node)
    return kept


class Board:
    """The supervisor's side: the board, and the workers it is sent to."""

    def __init__(self, lasting: Callable[[str, Any], bool] = lambda key, value: False,
                 changed: Callable[[], None] = lambda: None) -> None:
        self.lasting = lasting  # which of a worker's posts stay on the board when it ends
        self.changed = changed  # called after each change of the entries
        self.entries: dict[str, Any] = {}
        self.owners: dict[str, int] = {}  # key -> the worker that posted it
        self.readers: dict[int, asyncio.StreamWriter] = {}  # worker number -> where the board goes to it
        self.posted = asyncio.Event()  # set, and replaced, at each change of the entries

    async def serve(self, worker: int, sock: socket.socket) -> None:
        """Read one worker's posts until its end of the socket closes (it ended), then take its keys off."""
        reader, writer = await asyncio.open_connection(sock=sock, limit=LINE_LIMIT)
        self.readers[worker] = writer
        self._send(writer)
        try:
            while line := await reader.readline():
                try:
                    posted = json.loads(line)
                except ValueError as error:
                    log.error("worker %d posted a malformed line: %s", worker, error)
                    continue
                if isinstance(posted, dict):
                    self._post(worker, posted)
        except (ConnectionError, ValueError):  # (ValueError: a line over the limit)
            pass
        finally:
            if self.readers.get(worker) is writer:
                del self.readers[worker]
            writer.close()
            self._post(worker, {key: None for key, owner in self.owners.items()
                                if owner == worker and not self.lasting(key, self.entries[key])})

    def _post(self, worker: int, posted: dict[str, Any]) -> None:
        changed = False
        for key, value in posted.items():
            if value is None:
                changed |= self.entries.pop(key, None) is not None
                self.owners.pop(key, None)
            elif self.entries.get(key) != value:
                self.entries[key] = value
                self.owners[key] = worker
                changed = True
        if changed:
            for writer in self.readers.values():
                self._send(writer)
            self.posted.set()
            self.posted = asyncio.Event()
            self.changed()

    async def entry(self, key: str, within: float) -> Any:
        """The entry under key, once one is posted (None if none is within that many seconds)."""
        deadline = time.monotonic() + within
        while (value := self.entries.get(key)) is None and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self.posted.wait(), left)
            except TimeoutError:
                pass
        return value

    def _send(self, writer: asyncio.StreamWriter) -> None:
        if not writer.is_closing():
            writer.write(json.dumps(self.entries).encode() + b"\n")


class BoardCopy:
    """A worker's side: its copy of the board, kept current, and its posts."""

    def __init__(self, sock: socket.socket, changed: Callable[[], None] = lambda: None) -> None:
        self.sock = sock
        self.entries: dict[str, Any] = {}
        self.changed = changed  # called after each new copy
        self.writer: asyncio.StreamWriter | None = None
        self.unsent: dict[str, Any] = {}  # posted before the socket was opened
        self.reading: asyncio.Task | None = None

    async def start(self) -> None:
        reader, self.writer = await asyncio.open_connection(sock=self.sock, limit=LINE_LIMIT)
        self.reading = asyncio.get_running_loop().create_task(self._read(reader))
        if self.unsent:
            self.post(self.unsent)
            self.unsent = {}

    def post(self, entries: dict[str, Any]) -> None:
        if self.writer is None:
            self.unsent.update(entries)
        elif not self.writer.is_closing():
            self.writer.write(json.dumps(entries).encode() + b"\n")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self.entries = json.loads(line)
                self.changed()
        except (ConnectionError, ValueError) as error:
            log.error("the board's copy stopped: %s", error)
