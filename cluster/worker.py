"""One worker process of a node of W workers: worker k of every node is a member of replication group k
(cluster.groups), and the node that leads the group serves the group's vhosts from worker k's store
(data_dir/workers/k; worker 0's is the data dir), replicated to worker k of every other node. Outside a cluster
(``--workers``) each group has one member, which leads it by walkover (cluster.walkover). Which group holds a vhost
is recorded by one rule (broker.workers.placement): by the supervisor outside a cluster (placement.json), in etcd in
one (cluster.groups.VhostRecord), which each worker writes for the vhosts of its store and the first worker follows.

Every worker is also a front door of the node's AMQP port (broker.connection.front_door): it answers a client's
handshake up to connection.open and sends the client to the worker that leads its vhost's group, on this node
(a hand-off of the socket) or another (a forward to that node's port). Which node leads each group, the node's
workers post on the supervisor's board (broker.workers.board) as they learn it.

Started by the supervisor (broker.workers.supervisor) as ``python -m cluster.worker CONTROL_FD PID``, with the
control socket broker.workers.control describes; the worker stops when the supervisor closes it, or on SIGTERM or
SIGINT.
"""

from __future__ import annotations

import signal

# First, before an import could write to the terminal (a warning, a traceback): a worker, in a process group of its
# own in its supervisor's session, is in the background of the supervisor's terminal if it has one, where it writes
# its log and reads nothing, whatever the terminal's settings (with `stty tostop` its first line would stop it, and
# the node's start with it: docs/workers.md). This module is the worker's program: nothing imports it.
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
signal.signal(signal.SIGTTIN, signal.SIG_IGN)

import asyncio
import dataclasses
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import web

from broker import interpreter, logs
from broker.config import Config
from broker.connection.alarms.memory import memory_limit
from broker.connection.front_door import FrontDoors, Route, close_frame, open_doors, refused
from broker.connection.greeting import platform_name
from broker.connection.connection import Connection
from broker.connection.handoff import HandedOver, receive_all
from broker.connection.mqtt.connection import MqttConnection
from broker.connection.mqtt.front_door import PROTOCOL as MQTT, MqttFrontDoor, mqtt_unavailable
from broker.connection.server import Server, StartupError, stop_on_signals, version
from broker.connection.tls import server_context
from broker.crossing.home import Crossing
from broker.crossing.owner import serve_links
from broker.management import http
from broker.management.app import make_app, unavailable
from broker.management.prometheus import make_prometheus_app
from broker.management.server import ManagementServer, take_web_mqtt
from broker.management.views.nodes import node_entry
from broker.model.definitions import VHOST_SECTIONS, export_node_wide, of_vhosts
from broker.model.node import Node
from broker.model.queue import Queue
from broker.workers.board import (
    CLUSTER_SECRET, PLACEMENT_KEY, BoardCopy, group_key, known_key, maintenance_key, members_key,
)
from broker.workers.control import CONTROL_LINE_LIMIT, WorkerControl, receive, run_worker, send
from broker.workers.logins import NodeLoginThrottle
from broker.workers.placement import RecordedPlacement, Recorder, pins_of, worker_data_dir
from protocol.constants import INTERNAL_ERROR
from cluster.coordinator import Coordinator, CoordinatorError, Member, NodeStillNeeded
from cluster.groups import DEFAULT_GROUP, VhostRecord, led_by, members_posted, posted
from cluster.node import ClusterNode, make_coordinator

log = logging.getLogger("cluster")

FIRST_ELECTIONS_IN_ORDER = 0.1  # seconds between looks at the board while the groups before this one elect


class GroupWorker:
    """This worker's group: the broker it leads with, the routes of its front doors, and when it campaigns."""

    def __init__(self, config: Config, number: int, groups: RecordedPlacement, board: BoardCopy,
                 senders: dict[int, socket.socket], logins: NodeLoginThrottle, node_wide: dict | None = None,
                 crossing: Crossing | None = None):
        self.config = config
        self.number = number  # this worker's number, and its group's
        self.groups = groups
        self.board = board
        self.senders = senders  # worker number -> where hand-offs to it go (this one's own included)
        self.logins = logins
        self.node_id = config.cluster_node_id
        self.started_at = time.monotonic()
        self.cluster: ClusterNode | None = None  # set once made
        # its management API and Prometheus endpoint, on the sockets the supervisor's listeners reach it at
        self.internal = (InternalSocket(number, lambda server: make_app(server, forwarded=True), self.why_not,
                                        self.node_entry),
                         InternalSocket(number, make_prometheus_app, self.why_not))
        # what a group leader's broker reports of its part (broker.connection.server.WorkerRole)
        self.led: set[str] = set()
        # The first worker's node-wide definitions (users, vhosts, permissions), for a worker whose group has no
        # other copy to catch up from (outside a cluster); None: its own are current
        self.node_wide = node_wide
        self.keeps_node_definitions = node_wide is None  # (else it copies the first worker's)
        self.leading = asyncio.Event()  # set once this node first leads the group
        self.doors: FrontDoors | None = None  # this worker's front doors, once they are made
        self.posting: asyncio.Task | None = None  # the last leader to post on the board (each after the one before)
        # its links to the node's other workers, which own queues of its vhosts (outside a cluster); None: all its
        # vhosts' queues are its own
        self.crossing = crossing

    def why_not(self) -> str:
        """Why this worker's group has no leader, as its node sees it ("": no reason known, an election under way)."""
        return self.cluster.waiting_for if self.cluster is not None else ""

    def node_entry(self) -> dict:
        """This worker's entry in /api/nodes while it follows (and so runs no broker): the supervisor asks for it
        once a group's leader has accepted the request's credentials (broker.workers.api)."""
        return node_entry(self.started_at, Path(self.config.data_dir).absolute(), self.config.memory_limit, (), 0,
                          self.being_drained)

    @property
    def being_drained(self) -> bool:
        """This node is in maintenance (``warrenctl drain``)."""
        return self.cluster is not None and self.cluster.in_maintenance

    # --- cluster.node.Group ---------------------------------------------------------------------------------
    def server(self, config: Config) -> Server:
        server = Server(config, role=self, accepting=False)
        server.failed_logins = self.logins
        server.leadership = self
        if self.crossing is not None:  # (before its store is read: the definitions it holds name queues' owners)
            server.node.cross(self.crossing)
            self.crossing.node = server.node
        return server

    def announce(self, leader: Member | None) -> None:
        """Show the leader on this worker's internal sockets, then post it on the board, where the node's supervisor
        routes API requests by it (posted first, a request could reach the answer of the leader before)."""
        assert self.cluster is not None
        server = self.cluster.server if leader is not None and leader.node_id == self.node_id else None
        if server is not None:
            self.leading.set()
        switches = [switch for internal in self.internal if (switch := internal.show(server, leader)) is not None]
        self.posting = asyncio.get_running_loop().create_task(
            self._post_after([*switches, *([self.posting] if self.posting is not None else [])], posted(leader)))

    async def _post_after(self, switches: list[asyncio.Task], leader: dict | None) -> None:
        if switches:
            await asyncio.wait(switches)
        self.board.post({group_key(self.number): leader})

    def export(self) -> dict | None:
        """The node-wide definitions while this worker leads its group (None while it does not)."""
        assert self.cluster is not None
        return export_node_wide(self.cluster.server.node) if self.cluster.server is not None else None

    def hold(self, candidates: list[str]) -> float:
        """A node lets another that could lead the group, and leads fewer groups, campaign first, for one lease (so
        the only node that could lead never waits); at a fresh start the groups elect in order, so that each
        campaign counts the leaders before it."""
        board = self.board.entries
        led = len(led_by(board, self.node_id, self.groups.workers))
        # (in its first lease a worker may not see every node registered yet: a node leading any group waits)
        starting = time.monotonic() - self.started_at < self.config.cluster_lease_ttl
        if (starting and led) or any(len(led_by(board, node, self.groups.workers)) < led for node in candidates):
            return self.config.cluster_lease_ttl
        if starting and any(group_key(group) not in board for group in range(self.number)):
            return FIRST_ELECTIONS_IN_ORDER
        return 0.0

    def lighter(self, candidates: list[str]) -> str | None:
        """(Only the lowest-numbered group a node leads steps aside at a time: two at once could both go to the
        same lighter node, which would then step aside in turn.)"""
        board = self.board.entries
        led_here = led_by(board, self.node_id, self.groups.workers)
        if not led_here or led_here[0] != self.number:
            return None
        loads = sorted((len(led_by(board, node, self.groups.workers)), node) for node in candidates)
        return loads[0][1] if loads and loads[0][0] + 2 <= len(led_here) else None

    def maintenance(self, on: bool) -> None:
        if self.doors is not None:
            self.doors.suspend(on)
        self.board.post({maintenance_key(self.number): on})

    def learnt(self, secret: str) -> None:
        """Group 0's secret is the cluster's: posted for the node's API and every worker's front door, which prove
        the requests and clients they forward between nodes with it."""
        if self.number == 0 and self.board.entries.get(CLUSTER_SECRET) != secret:
            self.board.post({CLUSTER_SECRET: secret})

    # --- broker.connection.server.Leadership ----------------------------------------------------------------
    async def state(self, vhost: str) -> dict:
        assert self.cluster is not None
        try:
            pinned = await self.cluster.coordinator.preferred()
        except CoordinatorError as error:
            raise RuntimeError(f"etcd cannot be reached: {error}") from None
        return {"group": self.number, "node": self.node_id, "pinned": pinned}

    async def pin(self, vhost: str, node: str | None) -> None:
        """(A node is named by its node_id, or by its name in /api/nodes: node_id@host.)"""
        assert self.cluster is not None
        try:
            await self.cluster.prefer(node.partition("@")[0] if node is not None else None)
        except CoordinatorError as error:
            raise RuntimeError(f"etcd cannot be reached: {error}") from None

    def check_move(self, vhost: str, group: int) -> None:
        self.groups.check_move(vhost, group)
        if self.config.spread_vhosts:
            raise ValueError(f"with [server] spread_vhosts every worker serves vhost '{vhost}' already, and its "
                             "queues are owned by several; moving a vhost is not supported there yet")
        server = self.cluster.server if self.cluster is not None else None
        served = server.node.vhosts.get(vhost) if server is not None else None
        if served is not None and served.remote_queues:
            names = ", ".join(sorted(repr(queue.name) for queue in served.queues.values() if queue.owner is not None))
            raise ValueError(f"vhost '{vhost}' has queues other workers own ({names[:200]}): moving a vhost moves "
                             "what its worker's store holds, so these would be left behind; move them to its worker "
                             "first (PUT /api/queues/{vhost}/{name}/group)")

    def check_queue_move(self, vhost: str, queue: Queue, group: int) -> None:
        self.groups.check_group(group)
        if self.config.spread_vhosts:
            raise ValueError(f"with [server] spread_vhosts every worker keeps a copy of vhost '{vhost}'; moving a queue "
                             "is not supported there yet")
        named = f"queue '{queue.name}' in vhost '{vhost}'"
        if queue.queue_type == "stream":
            raise ValueError(f"{named} is a stream: a stream stays on the worker of its vhost")
        if queue.exclusive_owner is not None:
            raise ValueError(f"{named} is exclusive: it stays on the worker that serves its connection")
        if not queue.durable:
            raise ValueError(f"{named} is not durable: moving a queue restarts the workers that hold it, which a "
                             "transient queue does not outlive")

    # --- broker.connection.server.WorkerRole ----------------------------------------------------------------
    def serves(self, vhost: str) -> bool:
        return self.groups.leaders.get(vhost) == self.number

    async def boot_definitions(self, document: dict, found: list[str], node: Node) -> dict:
        """Every group holds the node-wide definitions (users, vhosts, permissions); the vhosts' contents only where
        they live. The vhosts of its store are recorded where they are not yet."""
        if self.node_wide is not None:
            self._forget_what_the_first_worker_has_not(node)
            document = {**self.node_wide, **{key: document[key] for key in VHOST_SECTIONS if key in document}}
        named = [item.get("name") for item in document.get("vhosts", []) if isinstance(item, dict)]
        planned = sorted(set(node.vhosts) | {name for name in named if isinstance(name, str)})
        await self.groups.record(planned, found)
        self.led = {name for name in planned if self.groups.of(name) == self.number}
        return of_vhosts(document, self.led)

    def _forget_what_the_first_worker_has_not(self, node: Node) -> None:
        """Users, permissions and topic permissions this store kept that the first worker no longer has (its copy is
        the node's)."""
        assert self.node_wide is not None
        users = {item["name"] for item in self.node_wide["users"]}
        permissions = {(item["vhost"], item["user"]) for item in self.node_wide["permissions"]}
        topic_permissions = {(item["vhost"], item["user"], item["exchange"])
                             for item in self.node_wide["topic_permissions"]}
        for name in [name for name in node.users if name not in users]:
            node.delete_user(name)
        for vhost, user in [key for key in node.permissions if key not in permissions]:
            node.clear_permissions(user, vhost)
        for vhost, user, exchange in [(vhost, user, exchange) for (vhost, user), held in node.topic_permissions.items()
                                      for exchange in held if (vhost, user, exchange) not in topic_permissions]:
            node.clear_topic_permissions(user, vhost, exchange)

    # --- the front doors ------------------------------------------------------------------------------------
    def route(self, vhost: str | None, forwarded: bool, copies: bool = True, mqtt: bool = False) -> Route:
        if copies and vhost is not None and self._keeps_copy(vhost):  # ([server] spread_vhosts: served here)
            return self.senders[self.number]
        group = self.groups.of(vhost) if vhost is not None else DEFAULT_GROUP
        leader = self.board.entries.get(group_key(group))
        if leader is None:
            return refused(vhost, "the replication group that holds it has no leader now")
        if leader["node"] == self.node_id:
            return self.senders[group]
        if forwarded:
            return refused(vhost, f"node {self.node_id} does not lead it now")
        if mqtt:  # (its MQTT port; over TLS with [cluster] tls, as amqps)
            port = leader.get("mqtt_tls_port" if self.config.cluster_tls else "mqtt_port") or 0
            if not port:
                return refused(vhost, f"node {leader['node']}, which leads it, takes no MQTT clients"
                               + (" over TLS" if self.config.cluster_tls else ""))
            return leader["host"], port
        return leader["host"], leader["tls_port"] if self.config.cluster_tls else leader["port"]


    def _keeps_copy(self, vhost: str) -> bool:
        """Whether this worker has a copy of the vhost with its home's definitions (broker.crossing.copies)."""
        server = self.cluster.server if self.cluster is not None else None
        copy = server.node.vhosts.get(vhost) if server is not None else None
        return copy is not None and copy.copy_ready


class Adoption:
    """Connections handed to this worker become connections of the broker that serves here; while none does (it
    has stopped leading its group), the client is told to come again."""

    def __init__(self, serving: Callable[[], Server | None]):
        self.serving = serving
        self.adopting: set[asyncio.Task] = set()  # hand-offs whose sockets are being attached to the loop

    def take(self, client: socket.socket, handed: HandedOver) -> None:
        server = self.serving()
        if server is None or not server.serving:
            refuse(client, "INTERNAL_ERROR - vhost unavailable: its leader changed while the connection was handed "
                           "to it; connect again", handed.protocol)
            return
        loop = asyncio.get_running_loop()
        protocol = MqttConnection if handed.protocol == MQTT else Connection
        task = loop.create_task(loop.connect_accepted_socket(lambda: protocol(server, handed), client))
        self.adopting.add(task)
        task.add_done_callback(lambda done: self._adopted(done, client, handed))

    def _adopted(self, task: asyncio.Task, client: socket.socket, handed: HandedOver) -> None:
        self.adopting.discard(task)
        if not task.cancelled() and task.exception() is not None:  # (the socket closed under it, say)
            log.warning("dropped a connection from %s handed over by a front door: %s", handed.peer[0],
                        task.exception())
            client.close()


def refuse(client: socket.socket, text: str, protocol: str = "amqp") -> None:
    """Close a handed connection with 541 and text (an MQTT client: CONNACK 3, server unavailable), as far as its
    socket takes it at once."""
    client.setblocking(False)
    try:
        client.send(mqtt_unavailable() if protocol == MQTT else close_frame(INTERNAL_ERROR, text))
    except OSError:
        pass
    client.close()


class InternalSocket:
    """A worker's management API, or its Prometheus endpoint, on its internal socket: its broker's while it leads
    its group, else a 503 that says who does (but for the API's /api/nodes, which lists every worker). Each is
    served on a copy of the socket's descriptor, so that closing one leaves the socket listening."""

    def __init__(self, number: int, serving: Callable[[Server], web.Application], why_not: Callable[[], str],
                 following: Callable[[], dict] | None = None) -> None:
        self.number = number
        self.serving = serving  # the app of the broker while it leads
        self.why_not = why_not  # why no node leads the group, while none does ("": an election under way)
        self.following = following  # this worker's /api/nodes entry while it follows (None: a 503 there too)
        self.fd = -1  # the socket's, once serving
        self.shown: tuple[Server | None, Member | None] = (None, None)  # the broker and the leader last shown
        self.runner: web.AppRunner | None = None
        self.switching: asyncio.Task | None = None  # the last switch asked for (each waits for the one before)

    def show(self, server: Server | None, leader: Member | None) -> asyncio.Task | None:
        """Serve the broker's app, or the answer of a worker that does not lead; the switch (None before start)."""
        self.shown = server, leader
        if self.fd < 0:
            return None
        if server is not None:
            app = self.serving(server)
        else:
            async def answer(request: web.Request) -> web.Response:
                if leader is not None:
                    reason = (f"worker {self.number} of this node follows the leader of its group on node "
                              f"{leader.node_id}")
                else:
                    why = self.why_not()
                    reason = f"worker {self.number}'s group has no leader now" + (f": {why}" if why else "")
                return unavailable(request.path, reason)

            app = web.Application()
            if self.following is not None:
                entry = self.following
                async def nodes(request: web.Request) -> web.Response:
                    return http.reply([entry()])

                app.router.add_get("/api/nodes", nodes)
            app.router.add_route("*", "/{path:.*}", answer)
        before = self.switching
        self.switching = asyncio.get_running_loop().create_task(self._serve(app, before))
        return self.switching

    async def _serve(self, app: web.Application, before: asyncio.Task | None) -> None:
        if before is not None:
            await asyncio.wait([before])
        if self.runner is not None:
            await self.runner.cleanup()
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           auto_decompress=False)  # (a body as the client sent it, as the public API reads it)
        await runner.setup()
        await web.SockSite(runner, socket.socket(fileno=os.dup(self.fd))).start()
        self.runner = runner

    async def start(self, fd: int) -> None:
        """Serve on the socket: listening once this returns (the worker then says it serves)."""
        self.fd = fd
        self.show(*self.shown)
        assert self.switching is not None
        await asyncio.wait([self.switching])

    async def stop(self) -> None:
        if self.switching is not None:
            await asyncio.wait([self.switching])
        if self.runner is not None:
            await self.runner.cleanup()


async def agree_on_workers(coordinator: Coordinator, workers: int) -> str | None:
    """Worker 0 checks that the cluster runs as many workers on every node as here (the first node says how many);
    why not, if it does not."""
    said = ""
    while True:
        try:
            agreed = await coordinator.agree("workers", str(workers))
            break
        except CoordinatorError as error:
            if str(error) != said:
                log.warning("cannot reach etcd yet: %s", error)
                said = str(error)
            await asyncio.sleep(0.2)
    if agreed != str(workers):
        return (f"the cluster's nodes run {agreed} workers each, and this node's config says {workers}: every node "
                f"must run the same number (its groups are the workers' slots)")
    return None


async def keep_up(cluster: ClusterNode, board: BoardCopy, number: int) -> None:
    """Keep the members, and every node ever registered, as etcd has them, posted on the board for the API's list of
    nodes (while etcd does not answer, those posted stay)."""
    while True:
        try:
            posts = {members_key(number): members_posted((await cluster.coordinator.members()).values()),
                     known_key(number): members_posted((await cluster.coordinator.known()).values())}
            changed = {key: value for key, value in posts.items() if board.entries.get(key) != value}
            if changed:
                board.post(changed)
        except CoordinatorError:
            pass
        await asyncio.sleep(cluster.ttl / 2)


def drain_by(coordinator: Coordinator, node: str) -> Callable[[bool], Awaitable[dict]]:
    """The node put in maintenance or revived, as its supervisor asks (in etcd: every worker of every node reads
    it there, cluster.node)."""
    async def drain(on: bool) -> dict:
        try:
            await coordinator.drain(node, on)
        except CoordinatorError as error:
            return {"refused": f"etcd cannot be reached: {error}"}
        return {"done": True}
    return drain


def forget_by(coordinator: Coordinator, number: int) -> Callable[[str], Awaitable[dict]]:
    """A node that left the cluster for good forgotten by this worker's group (in etcd), as its supervisor asks; by
    the first worker also the node's maintenance, which is the whole cluster's."""
    async def forget(node: str) -> dict:
        try:
            await coordinator.forget(node)
            if number == 0:
                await coordinator.drain(node, False)
        except NodeStillNeeded as error:
            return {"refused": f"group {number}: {error}: only a node that is down and out of the in-sync replica "
                               "set can be forgotten", "still_needed": True}
        except CoordinatorError as error:
            return {"refused": f"group {number}: {error}"}
        return {"done": True}
    return forget


def recorded_by(control: WorkerControl) -> Recorder:
    """The first worker's vhosts recorded by its supervisor (placement.json), outside a cluster."""
    async def record(vhosts: list[str], found: list[str]) -> dict[str, int]:
        return (await control.ask({"vhosts": vhosts, "found": found}))["placement"]
    return record


def group_config(config: Config, number: int, workers: int) -> Config:
    """The config of worker ``number``'s group: its store, its replication port, its share of the memory."""
    base = config.cluster_replication_port
    return dataclasses.replace(
        config, data_dir=str(worker_data_dir(Path(config.data_dir), number)),
        cluster_node_id=config.cluster_node_id or http.UNCLUSTERED_NODE,
        cluster_replication_port=base + number if base else 0,
        memory_limit=max(1, memory_limit(config.memory_high_watermark, config.memory_limit) // workers))


async def serve(control_socket: socket.socket) -> None:
    interpreter.tune()
    reader, writer = await asyncio.open_connection(sock=control_socket, limit=CONTROL_LINE_LIMIT)
    instructions = await receive(reader)
    number, workers = instructions["worker"], instructions["workers"]
    config = group_config(Config(**instructions["config"]), number, workers)
    logs.configure(config.log_level, config.log_format, number if workers > 1 else None)  # (one: named as the node)
    http.name_worker(number, config.cluster_node_id, workers)
    board = BoardCopy(socket.socket(fileno=instructions["board"]))
    senders = {int(other): socket.socket(fileno=fd) for other, fd in instructions["senders"].items()}
    logins = NodeLoginThrottle(socket.socket(fileno=instructions["logins"]))
    control = WorkerControl(reader, writer)
    coordinator = make_coordinator(config, number)
    if number == 0 and (refusal := await agree_on_workers(coordinator, workers)) is not None:
        await send(writer, {"refused": refusal})
        raise StartupError(refusal)
    pins = pins_of(config.vhosts)
    loop = asyncio.get_running_loop()
    background: list[asyncio.Task] = []  # what runs as long as the worker does
    if coordinator.followed:  # the record is the cluster's: each worker records what its store holds, if need be
        record = VhostRecord(coordinator, number, workers, pins)
        groups = RecordedPlacement(instructions["placement"] or {}, record.record, workers, pins, movable=False)
        if number == 0:  # it writes what the supervisor asks, and posts the record for it, which tells every worker
            control.recording = record.asked
            control.maintenance = drain_by(coordinator, config.cluster_node_id)
            background.append(loop.create_task(record.follow(lambda leaders: board.post({PLACEMENT_KEY: leaders}),
                                                             coordinator.lease_ttl)))
    else:  # the supervisor records the first worker's vhosts (and tells the others), which move between workers
        groups = RecordedPlacement(instructions["placement"] or {}, recorded_by(control) if number == 0 else None,
                                   workers, pins)
    control.placed = groups.told
    if coordinator.followed:
        control.forgetting = forget_by(coordinator, number)
    link = socket.socket(fileno=instructions["link"])
    crossing = None
    if not coordinator.followed and workers > 1:  # (queues are placed in other workers outside a cluster)
        crossing = Crossing(number, {int(other): path for other, path in instructions["links"].items()},
                            config.queues_leader_locator, http.owner_name, config.spread_vhosts)
    group = GroupWorker(config, number, groups, board, senders, logins, instructions["node"], crossing)
    control.export = group.export
    cluster = group.cluster = ClusterNode(config, coordinator, group)
    await board.start()
    await logins.start()
    stop = stop_on_signals()
    following = loop.create_task(control.follow())
    following.add_done_callback(lambda _: stop.set())  # the supervisor has gone
    running = loop.create_task(cluster.run(stop))
    if not coordinator.followed:  # a group of one serves before its worker says so, as a one-process broker does
        leading = loop.create_task(group.leading.wait())
        await asyncio.wait([leading, running], return_when=asyncio.FIRST_COMPLETED)
        leading.cancel()
        if running.done():
            error = running.exception() if not running.cancelled() else None
            reason = str(error) if error is not None else "it stopped before it served"
            await send(writer, {"refused": reason})
            raise StartupError(reason)
    doors = FrontDoors(config, version(), platform_name(), group.route,
                       lambda: board.entries.get(CLUSTER_SECRET) or "",  # (group 0's: one for the whole cluster)
                       towards=cluster.tls[1] if cluster.tls else None, users=lambda: cluster.server)
    board.changed = doors.reroute  # (a group's leader moved: the clients forwarded to the old one go again)
    group.doors = doors
    if cluster.in_maintenance:  # (known before the doors were made)
        doors.suspend()
    receiving = socket.socket(fileno=instructions["receiving"])
    receiving.setblocking(False)
    loop.add_reader(receiving.fileno(), receive_all, receiving, Adoption(lambda: cluster.server).take)
    for internal, fd in zip(group.internal, (instructions["api"], instructions["metrics"])):
        await internal.start(fd)
    background.append(loop.create_task(keep_up(cluster, board, number)))
    links = None
    if crossing is not None:
        links = await serve_links(link, lambda: cluster.server.node if cluster.server is not None else None)
        background.extend(crossing.start())
    else:
        link.close()
    # (the first worker outside a cluster gives its node-wide definitions, which a worker started again copies)
    node_wide = group.export() if number == 0 and not coordinator.followed else None
    await send(writer, {"serving": True, "node": node_wide})
    listeners = []
    web_mqtt: ManagementServer | None = None  # MQTT over WebSockets ([mqtt] web_port): front doors too
    try:
        # The node's port opens once every worker serves: no client finds a vhost down while the node starts
        opening = loop.create_task(control.opened.wait())
        await asyncio.wait([opening, running], return_when=asyncio.FIRST_COMPLETED)
        opening.cancel()
        if control.opened.is_set():
            listeners.append(await open_doors(doors, sock=socket.socket(fileno=instructions["listening"])))
            if instructions["listening_tls"] is not None:  # amqps: the TLS session ends at the front door
                listeners.append(await open_doors(doors, server_context(config),
                                                  sock=socket.socket(fileno=instructions["listening_tls"])))
            for name, fd in instructions["listening_mqtt"].items():  # (MQTT over TLS: as amqps)
                if name == "mqtt_web":
                    web_mqtt = await take_web_mqtt(config, lambda: MqttFrontDoor(doors, forwards=False),
                                                   socket.socket(fileno=fd))
                    await web_mqtt.serve()
                    continue
                tls = server_context(config) if name == "mqtt_tls" else None
                listeners.append(await open_doors(doors, tls, MqttFrontDoor, sock=socket.socket(fileno=fd)))
        await running
    finally:
        for task in (*background, following):
            task.cancel()
        for internal in group.internal:
            await internal.stop()
        loop.remove_reader(receiving.fileno())
        for listener in listeners:
            listener.close()
        if web_mqtt is not None:
            await web_mqtt.stop()
        if links is not None:
            links.close()
        doors.close()


if __name__ == "__main__":
    sys.exit(run_worker(serve))
