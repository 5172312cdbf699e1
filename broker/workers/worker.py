"""One worker process: a broker that leads some of the node's vhosts and accepts from the AMQP socket all share.

Started by the supervisor (broker.workers.supervisor) as ``python -m broker.workers.worker CONTROL_FD PID`` (PID:
the supervisor's); the control socket carries JSON lines both ways:

- supervisor -> worker, first: its instructions (config, number, the file descriptors it inherited, and for all
  but the first worker the vhost placement and the first worker's node-wide definitions);
- first worker -> supervisor: ``{"vhosts": [...], "found": [...]}`` once its store is read, answered with
  ``{"placement": {...}}``;
- worker -> supervisor: ``{"refused": "..."}`` when it cannot start, with the reason the supervisor gives;
- worker -> supervisor: ``{"serving": true, "node": ...}`` once it serves (the first worker sends its node-wide
  definitions, which every other worker copies);
- supervisor -> worker, later: ``{"placement": {...}, "down": [...]}`` when a vhost is made or deleted and when a
  worker ends or serves again, answered ``{"placed": true}``; and to the first worker ``{"export": true}`` after the
  API changed the node-wide definitions, answered ``{"node": ...}``.

Refused AMQP logins are counted by the supervisor, for the whole node, over a socket pair of their own
(broker.workers.logins).

Each worker also serves the management API and the Prometheus endpoint (broker.management) on internal sockets the
supervisor made, for the supervisor's listeners in front of them all (broker.workers.api, broker.workers.metrics).

A worker stops on SIGTERM or SIGINT, and when the supervisor goes: at once if it was killed, cleanly if its control
socket just closed.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Awaitable, Callable

import uvloop
from aiohttp import web
from pamqp import commands as spec

from broker import logs
from broker.config import Config
from broker.connection.alarms.memory import memory_limit
from broker.connection.connection import Connection
from broker.connection.handoff import HandedOver, Handoffs, receive_all
from broker.connection.server import GC_THRESHOLD, Server, StartupError, stop_on_signals
from broker.management import http
from broker.management.app import make_app
from broker.management.prometheus import make_prometheus_app
from broker.model.definitions import VHOST_SECTIONS, export_node_wide, of_vhosts
from broker.model.node import Node
from broker.workers.logins import NodeLoginThrottle
from broker.workers.placement import pins_of, worker_data_dir
from protocol.codec import encode_method
from protocol.constants import INTERNAL_ERROR

log = logging.getLogger(__name__)

CONTROL_LINE_LIMIT = 256 * 1024 * 1024  # the longest control line read: node-wide definitions of many users


async def send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the supervisor closed the control socket")
    return json.loads(line)


class Worker:
    """This process's part among the workers (the Server's role): which vhosts it leads, and the node-wide
    definitions it copies from the first worker."""

    def __init__(self, instructions: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.number: int = instructions["worker"]
        self.keeps_node_definitions = self.number == 0
        self.leaders: dict[str, int] = instructions.get("placement") or {}  # vhost -> worker that leads it
        self.node_wide: dict | None = instructions.get("node")  # the first worker's users, vhosts, permissions
        self.led: set[str] = set()  # the vhosts this worker leads, once its boot definitions are known
        self.reader = reader
        self.writer = writer

    async def boot_definitions(self, document: dict, found: list[str], node: Node) -> dict:
        if self.keeps_node_definitions:
            named = [item.get("name") for item in document.get("vhosts", []) if isinstance(item, dict)]
            planned = sorted(set(node.vhosts) | {name for name in named if isinstance(name, str)})
            await send(self.writer, {"vhosts": planned, "found": found})
            self.leaders.update((await receive(self.reader))["placement"])
        else:
            assert self.node_wide is not None, "the supervisor gives every other worker the first one's definitions"
            self._forget_what_the_first_worker_has_not(node)
            document = {**self.node_wide, **{key: document[key] for key in VHOST_SECTIONS if key in document}}
        self.led = {name for name, worker in self.leaders.items() if worker == self.number}
        return of_vhosts(document, self.led)

    async def follow_supervisor(self, node: Node, handoffs: Handoffs) -> None:
        """Answer the supervisor until it closes the control socket: take the placement's changes (a vhost made or
        deleted, a worker down or serving again), and give the node-wide definitions (the first worker's, for a
        worker started again)."""
        while line := await self.reader.readline():
            message = json.loads(line)
            if "placement" in message:
                self.leaders.clear()
                self.leaders.update(message["placement"])
                handoffs.down = set(message["down"])
                await send(self.writer, {"placed": True})
            else:
                await send(self.writer, {"node": export_node_wide(node)})

    def _forget_what_the_first_worker_has_not(self, node: Node) -> None:
        """Users and permissions this store kept that the first worker no longer has (its copy is the node's)."""
        assert self.node_wide is not None
        users = {item["name"] for item in self.node_wide["users"]}
        permissions = {(item["vhost"], item["user"]) for item in self.node_wide["permissions"]}
        for name in [name for name in node.users if name not in users]:
            node.delete_user(name)
        for vhost, user in [key for key in node.permissions if key not in permissions]:
            node.clear_permissions(user, vhost)


class Placed:
    """Which worker leads a vhost, as the management API shows it and an operator chooses it
    (broker.connection.server.Leadership): this worker checks a request to move one, and the supervisor, which
    passed the request on, moves it once this worker has accepted it (broker.workers.api, broker.workers.moving)."""

    def __init__(self, worker: Worker, workers: int, pins: dict[str, int]):
        self.worker = worker
        self.workers = workers  # how many the broker runs
        self.pins = pins  # vhost -> the worker its [[vhosts]] table pins it to

    async def state(self, vhost: str) -> dict:
        pinned = self.pins.get(vhost)
        return {"node": http.worker_name(self.worker.leaders.get(vhost, 0)),
                "pinned": http.worker_name(pinned) if pinned is not None else None}

    async def pin(self, vhost: str, node: str | None) -> None:
        if node is None:
            raise ValueError("a vhost stays on its worker until it is moved to another (PUT {\"node\": ...}): there "
                             "is no choice to clear")
        number = http.worker_named(node, self.workers)
        if number is None:
            names = ", ".join(http.worker_name(number) for number in range(self.workers))
            raise ValueError(f"node '{node}' is not a worker of this broker (its workers: {names})")
        pinned = self.pins.get(vhost)
        if pinned is not None and pinned != number:
            raise ValueError(f"vhost '{vhost}' is pinned to {http.worker_name(pinned)} by the config ([[vhosts]] "
                             "worker): change the pin to move it")


class Adoption:
    """Connections handed to this worker become connections of the broker that serves here; while none does (a
    clustered worker that has stopped leading its group), the client is told to come again."""

    def __init__(self, serving: Callable[[], Server | None]):
        self.serving = serving
        self.adopting: set[asyncio.Task] = set()  # hand-offs whose sockets are being attached to the loop

    def take(self, client: socket.socket, handed: HandedOver) -> None:
        server = self.serving()
        if server is None or not server.serving:
            refuse(client, "INTERNAL_ERROR - vhost unavailable: its leader changed while the connection was handed "
                           "to it; connect again")
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: Connection(server, handed), client))
        self.adopting.add(task)
        task.add_done_callback(lambda done: self._adopted(done, client, handed))

    def _adopted(self, task: asyncio.Task, client: socket.socket, handed: HandedOver) -> None:
        self.adopting.discard(task)
        if not task.cancelled() and task.exception() is not None:  # (the socket closed under it, say)
            log.warning("dropped a connection from %s handed over by another worker: %s", handed.peer[0],
                        task.exception())
            client.close()


def refuse(client: socket.socket, text: str) -> None:
    """Close a handed connection with 541 and text, as far as its socket takes it at once."""
    client.setblocking(False)
    try:
        client.send(encode_method(0, spec.Connection.Close(reply_code=INTERNAL_ERROR, reply_text=text, class_id=0,
                                                                method_id=0)))
    except OSError:
        pass
    client.close()


async def serve(control: socket.socket) -> None:
    gc.set_threshold(GC_THRESHOLD)
    reader, writer = await asyncio.open_connection(sock=control, limit=CONTROL_LINE_LIMIT)
    instructions = await receive(reader)
    config = Config(**instructions["config"])
    number = instructions["worker"]
    logs.configure(config.log_level, config.log_format, number)
    http.name_worker(number)
    config.data_dir = str(worker_data_dir(Path(config.data_dir), number))
    # Each worker's memory alarm watches an equal share of the node's limit, so that together they keep to it
    config.memory_limit = max(1, memory_limit(config.memory_high_watermark, config.memory_limit)
                              // instructions["workers"])
    worker = Worker(instructions, reader, writer)
    tls = instructions["listening_tls"]
    server = Server(config, role=worker, listening=(socket.socket(fileno=instructions["listening"]),
                                                    socket.socket(fileno=tls) if tls is not None else None))
    senders = {int(other): socket.socket(fileno=fd) for other, fd in instructions["senders"].items()}
    server.handoffs = handoffs = Handoffs(number, worker.leaders, senders)
    server.leadership = Placed(worker, instructions["workers"], pins_of(config.vhosts))
    server.failed_logins = logins = NodeLoginThrottle(socket.socket(fileno=instructions["logins"]))
    await logins.start()
    stop = stop_on_signals()
    try:
        await server.start()
    except StartupError as error:  # the supervisor says it, as a one-process broker would
        await send(writer, {"refused": str(error)})
        raise
    receiving = socket.socket(fileno=instructions["receiving"])
    receiving.setblocking(False)
    loop = asyncio.get_running_loop()
    loop.add_reader(receiving.fileno(), receive_all, receiving, Adoption(lambda: server).take)
    internal = []  # the management API and the Prometheus endpoint, on the sockets the supervisor reads them on
    for app, fd in ((make_app(server, forwarded=True), instructions["api"]),
                    (make_prometheus_app(server), instructions["metrics"])):
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                auto_decompress=False)  # (a body as the client sent it, as the public API reads it)
        await runner.setup()
        await web.SockSite(runner, socket.socket(fileno=fd)).start()
        internal.append(runner)
    node_wide = export_node_wide(server.node) if worker.keeps_node_definitions else None
    await send(writer, {"serving": True, "node": node_wide})
    control = loop.create_task(worker.follow_supervisor(server.node, handoffs))
    control.add_done_callback(lambda _: stop.set())  # the supervisor has gone
    await stop.wait()
    loop.remove_reader(receiving.fileno())
    for runner in internal:
        await runner.cleanup()
    await server.stop()


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def die_with_the_supervisor(supervisor: int) -> None:
    """A kill -9 of the supervisor ends its workers at once, as it would end a one-process broker: nothing is left
    holding the data dir when it is started again."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != supervisor:  # it ended before the line above
        os._exit(1)


def run_worker(serve: Callable[[socket.socket], Awaitable[None]]) -> int:
    """A worker process's life, whatever its kind: its arguments are the control socket's descriptor and the
    supervisor's pid."""
    die_with_the_supervisor(int(sys.argv[2]))
    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        uvloop.run(serve(control))
    except (StartupError, ConnectionError):  # the supervisor says why
        return 1
    logging.shutdown()
    os._exit(0)  # as broker.__main__: skip freeing every queued message one by one


def main() -> int:
    return run_worker(serve)


if __name__ == "__main__":
    sys.exit(main())
