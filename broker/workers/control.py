"""The control socket between the supervisor (broker.workers.supervisor) and each worker process it starts
(``python -m cluster.worker CONTROL_FD PID``): JSON lines both ways, and the worker's life around it.

- supervisor -> worker, first: its instructions (config, number, the file descriptors it inherited, the vhost
  placement the supervisor records, and for all but the first worker the first one's node-wide definitions);
- first worker -> supervisor, outside a cluster: ``{"vhosts": [...], "found": [...]}`` once its store is read,
  answered with ``{"placement": {...}}``;
- worker -> supervisor: ``{"serving": true, "node": ...}`` once it serves (the first worker outside a cluster sends
  its node-wide definitions, which a worker started again copies), or ``{"refused": "..."}`` when it cannot start,
  with the reason the supervisor gives;
- supervisor -> worker: ``{"open": true}`` once every worker serves (at once, for a worker started again), answered
  ``{"opened": true}``: its front doors open on the node's port;
- supervisor -> worker, later: ``{"placement": {...}}`` when a vhost is made or deleted, answered
  ``{"placed": true}``; and to the first worker ``{"export": true}`` after the API changed the node-wide
  definitions, answered ``{"node": ...}``; on a clustered node, to the first worker ``{"record": [vhost, ...]}``
  and ``{"forget": [vhost, ...]}`` as the API makes and deletes vhosts, answered with the cluster's record
  ``{"placement": {...}}`` (``{"refused": "..."}`` when etcd does not answer); and to the first worker
  ``{"maintenance": true}`` (a drain) or ``{"maintenance": false}`` (a revive) of the node, answered ``{"done":
  true}`` once etcd has it, or ``{"refused": "..."}``; and on a clustered node, to each worker ``{"forget_node":
  node}`` (a node that left the cluster for good), answered ``{"done": true}`` once its group has forgotten it, or
  ``{"refused": "...", "still_needed": true}`` while the node runs or is in the group's in-sync replica set, or
  ``{"refused": "..."}``.

A worker stops on SIGTERM or SIGINT, and when the supervisor goes: at once if it was killed, cleanly if its control
socket just closed. It runs in a process group of its own, in its supervisor's session (see the supervisor's
``_start``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import socket
import sys
from typing import Awaitable, Callable

import uvloop

from broker.connection.server import StartupError

CONTROL_LINE_LIMIT = 256 * 1024 * 1024  # the longest control line read: node-wide definitions of many users
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


async def send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the supervisor closed the control socket")
    return json.loads(line)


class WorkerControl:
    """A worker's end of the control socket once its instructions are read: the supervisor's requests answered, and
    this worker's own request answered in turn (the supervisor asks nothing meanwhile: it waits for it to serve)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.placed: Callable[[dict], None] = lambda leaders: None  # the placement the supervisor records, told anew
        self.export: Callable[[], dict | None] = lambda: None  # this worker's node-wide definitions (None: none)
        # a cluster's record of its vhosts changed by the first worker: {"record"} or {"forget"} -> the answer
        self.recording: Callable[[dict], Awaitable[dict]] | None = None
        # the node put in maintenance (True) or revived, by the first worker of a clustered node -> the answer
        self.maintenance: Callable[[bool], Awaitable[dict]] | None = None
        # a node that left the cluster forgotten by this worker's group, on a clustered node -> the answer
        self.forgetting: Callable[[str], Awaitable[dict]] | None = None
        self.answer: asyncio.Future[dict] | None = None  # the answer to this worker's request, while awaited
        self.opened = asyncio.Event()  # set once the supervisor has the worker open its front doors

    async def ask(self, message: dict) -> dict:
        self.answer = asyncio.get_running_loop().create_future()
        await send(self.writer, message)
        return await self.answer

    async def follow(self) -> None:
        """Answer the supervisor until it closes the control socket."""
        while line := await self.reader.readline():
            message = json.loads(line)
            if self.answer is not None and not self.answer.done():
                self.answer.set_result(message)
            elif "placement" in message:
                self.placed(message["placement"])
                await send(self.writer, {"placed": True})
            elif "export" in message:
                await send(self.writer, {"node": self.export()})
            elif self.recording is not None and ("record" in message or "forget" in message):
                await send(self.writer, await self.recording(message))
            elif self.maintenance is not None and "maintenance" in message:
                await send(self.writer, await self.maintenance(message["maintenance"] is True))
            elif self.forgetting is not None and "forget_node" in message:
                await send(self.writer, await self.forgetting(str(message["forget_node"])))
            elif "open" in message:
                self.opened.set()
                await send(self.writer, {"opened": True})


def die_with_the_supervisor(supervisor: int) -> None:
    """A kill -9 of the supervisor ends its workers at once, as it would end a one-process broker: nothing is left
    holding the data dir when it is started again."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:  # it ended before the line above
        os._exit(1)


def run_worker(serve: Callable[[socket.socket], Awaitable[None]]) -> int:
    """A worker process's life: its arguments are the control socket's descriptor and the supervisor's pid."""
    die_with_the_supervisor(int(sys.argv[2]))
    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        uvloop.run(serve(control))
    except (StartupError, ConnectionError):  # the supervisor says why
        return 1
    logging.shutdown()
    os._exit(0)  # as broker.__main__: skip freeing every queued message one by one
