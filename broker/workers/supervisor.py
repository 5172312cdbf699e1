"""The supervisor of ``warren-server --workers N``: one AMQP socket, N worker processes that accept from it, each
leading a share of the vhosts with a store of its own, and a worker that dies started again.

Start: the first worker reads its store (the data dir itself) and names its vhosts; the supervisor places them
(broker.workers.placement) and answers; once the first worker serves, the others start with the placement and its
node-wide definitions (users, vhosts, permissions), which they copy. A worker started again goes through the same
steps, so it finds what the others have. While a worker is down, the others refuse connections to its vhosts as
RabbitMQ refuses a vhost that is down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Coroutine

from broker.config import MAX_WORKERS, Config
from broker.connection.handoff import handoff_pair
from broker.connection.login_throttle import LoginThrottle
from broker.connection.server import (
    StartupError, data_dir_error, prepare_data_dir, reason_of, stop_on_signals, version,
)
from broker.connection.tls import TlsError, server_context
from broker.management import http
from broker.management.server import ManagementServer, take
from broker.workers.api import WorkerApis, make_gateway_app
from broker.workers.board import Board, group_key, led_elsewhere, maintenance_key
from broker.workers import moving
from broker.workers.logins import serve_logins
from broker.workers.metrics import make_metrics_gateway_app
from broker.workers.placement import ClusterPlacement, Placement, PlacementError, pins_of
from broker.workers.control import CONTROL_LINE_LIMIT, receive, send
from storage.lock import DataDirLock, DataDirLocked
from storage.replica import WORKERS_LOCK  # (worker 0's store holds ".lock" in the same data dir)

log = logging.getLogger(__name__)

RESTART_DELAY = 1.0  # seconds before a worker that died soon after its start is started again
STEADY = 10.0  # seconds a worker must have run for its death to be restarted at once
STOP_GRACE = 15.0  # seconds workers get to stop cleanly before they are killed
DRAIN_WAIT = 15.0  # seconds a drain waits for another node to lead each of this node's groups before it answers
DRAIN_POLL = 0.05  # seconds between its looks at the board
MOVED_SERVING_WAIT = 60.0  # seconds a move waits for its two workers to serve again before it answers
PRIVATE_PREFIX = "warren-workers-"  # the names of the supervisors' private directories, in the temporary directory
PRIVATE_LOCK = "supervisor.lock"  # in each: the file its supervisor holds locked (flock) while it lives
LONGEST_SOCKET = f"{MAX_WORKERS - 1}.metrics"  # the longest name of a worker's socket in it
SOCKET_PATH_LIMIT = 108  # bytes of a Unix socket's path, its terminating NUL included (Linux's sun_path)


def private_directory() -> tuple[Path, int]:
    """A new directory only this user may enter, for the workers' API sockets, and its lock's descriptor, held by
    this process while it lives. The lock file gets its name once locked: a private directory whose lock can be
    taken is one whose supervisor died without removing it (kill -9, a power cut)."""
    private = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))
    longest = private / LONGEST_SOCKET
    if len(os.fsencode(longest)) >= SOCKET_PATH_LIMIT:
        private.rmdir()
        raise StartupError(f"the temporary directory {private.parent} is too long a path for the workers' sockets "
                           f"({longest} would pass the {SOCKET_PATH_LIMIT - 1} bytes a Unix socket's path may have): "
                           "set TMPDIR to a shorter one")
    making = private / f"{PRIVATE_LOCK}.new"
    lock = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    os.rename(making, private / PRIVATE_LOCK)
    return private, lock


def remove_stale_private_directories() -> None:
    """Remove the private directories that dead supervisors left in the temporary directory: this user's, whose
    lock can be taken. A symbolic link is not followed, and a directory without a lock is left alone (its
    supervisor is making it, or is older than the lock)."""
    parent = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(parent) if name.startswith(PRIVATE_PREFIX)]
    except OSError as error:
        log.warning("could not look for private directories left by supervisors that died in %s: %s", parent, error)
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            directory = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # not a directory (a symbolic link...), or removed meanwhile
            continue
        try:
            stale = os.fstat(directory).st_uid == os.getuid() and lock_free(directory)
        finally:
            os.close(directory)
        if stale:
            shutil.rmtree(path, ignore_errors=True)  # (which follows no symbolic link either)
            log.info("removed %s, left by a supervisor that died", path)


def lock_free(directory: int) -> bool:
    """Whether the lock of a private directory (its descriptor) can be taken: its supervisor is dead."""
    try:
        lock = os.open(PRIVATE_LOCK, os.O_RDWR | os.O_NOFOLLOW, dir_fd=directory)
    except OSError:  # none yet, or not a file this user may lock
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # (BlockingIOError) its supervisor holds it
        return False
    finally:
        os.close(lock)


class WorkerProcess:
    """One worker as the supervisor sees it."""

    def __init__(self, number: int, private: Path):
        self.number = number
        self.process: asyncio.subprocess.Process | None = None
        self.receiving, self.sending = handoff_pair()  # where its hand-offs wait (kept here across its restarts)
        self.started_at = 0.0  # monotonic seconds of its latest start
        # Its management API's socket, in a directory only this user may enter; requests wait in it while it
        # restarts
        self.api_path = str(private / f"{number}.api")
        self.api = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.api.bind(self.api_path)
        self.metrics_path = str(private / f"{number}.metrics")  # its Prometheus endpoint's, likewise
        self.metrics = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.metrics.bind(self.metrics_path)
        # Where the other workers link to it, for the queues it owns of vhosts they serve (broker.crossing): it
        # listens across its restarts, so that a link made meanwhile waits for it
        self.link_path = str(private / f"{number}.link")
        self.link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.link.bind(self.link_path)
        self.link.listen(MAX_WORKERS)
        # The control socket's ends while it serves (None before and after), and the lock that keeps one exchange
        # on it at a time
        self.control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.talking = asyncio.Lock()
        self.serving = asyncio.Event()  # set while it serves
        self.held: asyncio.Event | None = None  # while a vhost is moved: it starts again once this is set


class Supervisor:
    def __init__(self, config: Config):
        self.config = config
        workers = config.workers
        self.data_dir = Path(config.data_dir).absolute()
        # The workers' API sockets' directory (mode 0700), and its lock, held while this supervisor lives
        self.private, self.private_lock = private_directory()
        self.workers = [WorkerProcess(number, self.private) for number in range(workers)]
        # Which worker leads each vhost: recorded in placement.json (loaded at start), or on a clustered node in etcd
        self.placement: Placement | ClusterPlacement = ClusterPlacement(
            pins_of(config.vhosts), lambda request: self._ask(self.workers[0], lambda: request))
        # the first worker's users, vhosts and (topic) permissions, as of its last change
        self.node_wide: dict | None = None
        # each worker's _watch, refused logins being counted, posts being read (the loop keeps tasks by weak references)
        self.tasks: set[asyncio.Task] = set()
        self.listening: socket.socket | None = None  # the AMQP port's socket, which every worker accepts from
        self.listening_tls: socket.socket | None = None  # the amqps port's, when [tls] names a certificate
        # the MQTT ports', by name: "mqtt" ([mqtt] port), "mqtt_tls" (tls_port), "mqtt_web" (web_port, WebSockets)
        self.listening_mqtt: dict[str, socket.socket] = {}
        self.lock = DataDirLock(self.data_dir, WORKERS_LOCK)  # held while this node's workers use the data dir
        self.stopping = False
        self.opened = False  # every worker served once: the node's port is open
        self.failed_logins = LoginThrottle()  # refused AMQP logins per address, counted for every worker
        # The workers each lead or follow a replication group (cluster.worker), and post who leads it on the board;
        # a clustered node's vhosts are placed by the cluster, not here
        self.clustered = bool(config.cluster_etcd_endpoints)
        config.cluster_node_id = config.cluster_node_id or http.UNCLUSTERED_NODE  # (the board's and the API's name)
        self.board = Board(led_elsewhere(config.cluster_node_id), changed=self._posted)
        self.moving = asyncio.Lock()  # one vhost or queue moved at a time
        self.saving = asyncio.Lock()  # one write of placement.json at a time
        # One change of the vhosts through the API at a time (broker.workers.api): its vhosts placed, made on every
        # worker, and forgotten if refused, with no other change of them in between
        self.changing_vhosts = asyncio.Lock()
        self.rereading: asyncio.Task | None = None  # the placement read again for a vhost it did not hold (learn)

    def take_ports(self) -> None:
        """The AMQP port, and the amqps one once [tls] names a certificate (checked here first, as one process
        does); the MQTT ports."""
        self.listening = self._bind(self.config.port)
        self.config.port = self.listening.getsockname()[1]  # (0 picked one): the port other nodes forward clients to
        if self.config.tls_certfile:
            try:
                server_context(self.config)
            except TlsError as error:
                raise StartupError(str(error)) from error
            self.listening_tls = self._bind(self.config.tls_port)
            self.config.tls_port = self.listening_tls.getsockname()[1]
        for name, port in (("mqtt", self.config.mqtt_port), ("mqtt_tls", self.config.mqtt_tls_port),
                           ("mqtt_web", self.config.mqtt_web_port)):
            if port:
                self.listening_mqtt[name] = self._bind(port)

    def _bind(self, port: int) -> socket.socket:
        host = self.config.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))  # the workers listen once all serve: clients wait for nothing until then
        except OSError as error:
            sock.close()
            raise StartupError(f"cannot listen on {host}:{port}: {reason_of(error)}") from error
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        prepare_data_dir(self.data_dir)
        try:
            self.lock.acquire()  # before any worker: a second node on this data dir is refused naming this one
            if not self.clustered:
                self.placement = Placement.load(self.data_dir, len(self.workers), self.placement.pins)
        except (DataDirLocked, PlacementError) as refusal:
            raise StartupError(str(refusal)) from refusal
        except OSError as error:
            raise data_dir_error(self.data_dir, error) from error
        await self._finish_moving()
        for worker in self.workers:
            refusal = await self._start(worker)
            if refusal is not None:
                raise StartupError(refusal)  # (supervise stops the workers already started)
        self.opened = True
        for worker in self.workers:  # their front doors open on the node's port
            await self._ask(worker, lambda: {"open": True})
        assert self.listening is not None
        host, port = self.listening.getsockname()[:2]
        log.info("Warren %s listening on %s:%d with %d worker processes", version(), host, port, len(self.workers))

    async def _start(self, worker: WorkerProcess) -> str | None:
        """Start one worker and wait until it serves; if it does not, why (the worker's own reason if it gave one)."""
        # The control socket's ends, the logins' (broker.workers.logins) and the board's (broker.workers.board)
        (parent, child), (logins, logins_child), (board, board_child) = (
            socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3))
        logins_fd, board_fd = logins_child.fileno(), board_child.fileno()  # the worker's, as numbered in both processes
        assert self.listening is not None
        # (a worker hands a client to itself too: its front door does not serve the client)
        senders = {other.number: other.sending.fileno() for other in self.workers}
        tls = self.listening_tls.fileno() if self.listening_tls is not None else None
        mqtt = {name: sock.fileno() for name, sock in self.listening_mqtt.items()}
        links = {other.number: other.link_path for other in self.workers if other is not worker}
        inherited = [child.fileno(), self.listening.fileno(), worker.receiving.fileno(), worker.api.fileno(),
                     worker.metrics.fileno(), worker.link.fileno(), logins_fd, board_fd, *senders.values(),
                     *([tls] if tls is not None else []), *mqtt.values()]
        # A process group of its own: a terminal's Ctrl-C reaches the supervisor alone, which stops the workers in
        # turn. Not a session of its own, which Linux would schedule as a program of its own (docs/workers.md).
        # uvloop takes no process_group; its child resets every signal's disposition after this (cluster.worker).
        try:
            worker.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cluster.worker", str(child.fileno()), str(os.getpid()), pass_fds=inherited,
                preexec_fn=os.setpgrp)
        except BaseException:
            for end in (parent, logins, board):
                end.close()
            raise
        finally:
            for end in (child, logins_child, board_child):
                end.close()
        worker.started_at = time.monotonic()
        self._keep(serve_logins(logins, self.failed_logins))
        self._keep(self.board.serve(worker.number, board))
        reader, writer = await asyncio.open_connection(sock=parent, limit=CONTROL_LINE_LIMIT)
        first = worker.number == 0
        placed = self.placement.leaders
        try:
            await send(writer, {
                "config": dataclasses.asdict(self.config), "worker": worker.number, "workers": len(self.workers),
                "listening": self.listening.fileno(), "listening_tls": tls, "listening_mqtt": mqtt,
                "receiving": worker.receiving.fileno(),
                "api": worker.api.fileno(), "metrics": worker.metrics.fileno(), "link": worker.link.fileno(),
                "links": links, "logins": logins_fd,
                "board": board_fd, "senders": senders, "placement": None if first else placed,
                "node": None if first else self.node_wide})
            told = dict(placed)
            serving = await receive(reader)
            if first and "vhosts" in serving:  # its store read: the placement of its vhosts, then it serves
                if self.placement.place(serving["vhosts"], serving["found"]):
                    await self._save_placement()
                await send(writer, {"placement": self.placement.leaders})
                told = dict(self.placement.leaders)
                serving = await receive(reader)
        except PlacementError as error:  # its store holds a vhost pinned to another worker
            serving = {"refused": str(error)}
        except (ConnectionError, OSError, ValueError) as error:
            serving = {"refused": f"worker {worker.number} ended before it served ({error})"}
        if "refused" in serving:
            writer.close()
            await worker.process.wait()
            return serving["refused"]
        if first:
            self.node_wide = serving["node"]
        worker.control = reader, writer
        worker.serving.set()
        self._keep(self._watch(worker, writer))
        if self.opened:  # (a worker started again: the others serve)
            await self._ask(worker, lambda: {"open": True})
        if self.placement.leaders != told:  # a vhost made or deleted meanwhile
            await self._ask(worker, self._state)
        log.info("worker %d serves (pid %d)", worker.number, worker.process.pid)  # (every worker knows it does)
        return None

    def _keep(self, work: Coroutine) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def leader_named(self, group: int) -> None:
        """Wait while this clustered node's board names no node leading the group (an election under way, or this
        node not hearing the new leader yet), at most one lease, the time a failover takes: a request that comes
        meanwhile is answered once a leader can take it, rather than refused."""
        if self.clustered:
            await self.board.entry(group_key(group), self.config.cluster_lease_ttl)

    def api_target(self, worker: int, metrics: bool = False) -> str | tuple[str, int] | None:
        """Where a worker's API (or Prometheus endpoint) answers: its internal socket's path, or on a clustered node
        the management API of the node that leads its group ((host, port); None while no node does, and for the
        metrics of a group led elsewhere: a node's metrics are its own)."""
        process = self.workers[worker]
        local = process.metrics_path if metrics else process.api_path
        if not self.clustered:
            return local
        leader = self.board.entries.get(group_key(worker))
        if leader is None:
            return None
        if leader["node"] == self.config.cluster_node_id:
            return local
        return (leader["host"], leader["api"]) if leader.get("api") and not metrics else None

    def measured(self) -> list[int]:
        """The workers whose metrics are this node's: all of them, or on a clustered node those leading their
        group here (as RabbitMQ's endpoint reports the queues its node leads)."""
        return [worker.number for worker in self.workers
                if isinstance(self.api_target(worker.number, metrics=True), str)]

    async def place(self, vhosts: list[str]) -> list[str]:
        """Give new vhosts a worker, and tell every worker before any of them makes one; which were new.
        PlacementError when the record cannot be written now (a clustered node's first worker is not serving)."""
        new = [name for name in dict.fromkeys(vhosts) if name not in self.placement.leaders]
        if new and await self.placement.add(new):
            await self._placement_changed()
        return new

    async def learn(self, vhost: str) -> None:
        """Before a request naming a vhost a clustered node's placement does not hold is routed: read the record
        again (one read at a time, whatever the number of requests waiting on it), in case it was made through
        another node a moment ago."""
        if not self.clustered or vhost in self.placement.leaders:
            return
        if self.rereading is None or self.rereading.done():
            self.rereading = asyncio.get_running_loop().create_task(self._reread())
        await asyncio.shield(self.rereading)

    async def _reread(self) -> None:
        try:
            if await self.placement.reread():
                await self._placement_changed()
        except PlacementError as error:  # (etcd cannot be reached: routed by what the placement holds)
            log.warning("%s", error)

    async def forget(self, vhosts: list[str]) -> None:
        """Deleted vhosts, or vhosts a refused change would have made, leave the placement."""
        gone = [name for name in vhosts if name in self.placement.leaders]
        try:
            if gone and await self.placement.remove(gone):
                await self._placement_changed()
        except PlacementError as error:  # (a record left behind places the vhost there if it is made again)
            log.warning("%s", error)

    def _posted(self) -> None:
        """The board changed: on a clustered node, the cluster's record may have (a vhost made or deleted through
        another node), which every worker is then told."""
        if self.placement.posted(self.board.entries):
            self._keep(self._placement_changed())

    async def _placement_changed(self) -> None:
        await self._save_placement()
        for worker in self.workers:  # (one not serving is told once it serves)
            await self._ask(worker, self._state)

    def _state(self) -> dict:
        return {"placement": self.placement.leaders}

    async def node_wide_changed(self) -> None:
        """The first worker's node-wide definitions, after the API changed them: what a worker starting again
        copies, even while the first one is down. (A clustered node's workers copy nothing: each group applies every
        change itself.)"""
        if self.clustered:
            return
        answer = await self._ask(self.workers[0], lambda: {"export": True})
        if answer is not None:
            self.node_wide = answer["node"]

    async def drain(self, on: bool) -> str:
        """Put this clustered node in maintenance (on) or revive it, through its first worker (in etcd, where every
        worker of every node reads it: cluster.node); a drain answers once another node leads each of this node's
        groups, or after DRAIN_WAIT. Why it could not be done, or finished ("": it was)."""
        answer = await self._ask(self.workers[0], lambda: {"maintenance": on})
        if answer is None:
            return "this node's first worker is not running: try again once it serves"
        if "refused" in answer:
            return str(answer["refused"])
        deadline = time.monotonic() + DRAIN_WAIT
        while (late := [worker.number for worker in self.workers
                        if self.board.entries.get(maintenance_key(worker.number), False) != on]):
            if time.monotonic() > deadline:
                return f"workers {late} of this node have not taken it in after {DRAIN_WAIT:.0f} s"
            await asyncio.sleep(DRAIN_POLL)
        while on and (held := self.groups_without_another_leader()):
            if time.monotonic() > deadline:
                return (f"this node is in maintenance, but after {DRAIN_WAIT:.0f} s no other node leads its groups "
                        f"{held}: none can take them over (in sync, and not in maintenance itself)?")
            await asyncio.sleep(DRAIN_POLL)
        return ""

    async def forget_node(self, node: str) -> dict:
        """Forget ``node``, a node that left the cluster for good, in every group (in etcd, through each worker, group
        by group): ``{"done": True}``, or the first refusal (``still_needed``: the node runs or is in sync)."""
        for worker in self.workers:
            answer = await self._ask(worker, lambda: {"forget_node": node})
            if answer is None:
                return {"refused": f"worker {worker.number} of this node is not running: try again once it serves"}
            if "refused" in answer:
                return answer
        return {"done": True}

    def groups_without_another_leader(self) -> list[int]:
        """The groups this node leads, or that have no leader now, as the board says."""
        return [worker.number for worker in self.workers
                if (self.board.entries.get(group_key(worker.number)) or {}).get("node") in (
                    None, self.config.cluster_node_id)]

    async def _ask(self, worker: WorkerProcess, message: Callable[[], dict]) -> dict | None:
        """Send a worker a message (made once it is the worker's turn, so that it is current) and wait for its
        answer; None if it is not serving."""
        async with worker.talking:
            if worker.control is None:
                return None
            reader, writer = worker.control
            try:
                await send(writer, message())
                return await receive(reader)
            except (ConnectionError, OSError, ValueError):
                return None  # it has ended

    async def _watch(self, worker: WorkerProcess, control: asyncio.StreamWriter) -> None:
        """Wait for the worker to end; unless the node is stopping, start it again (after RESTART_DELAY when it
        had run less than STEADY seconds)."""
        assert worker.process is not None
        code = await worker.process.wait()
        worker.control = None
        worker.serving.clear()
        control.close()  # (its vhosts are down meanwhile: its post on the board, that it leads them, is gone)
        while not self.stopping:
            if worker.held is not None:  # stopped for a move: started again once it is made
                await worker.held.wait()
            else:
                log.error("worker %d (pid %d) ended with %s; starting it again", worker.number, worker.process.pid,
                          f"signal {-code}" if code < 0 else f"exit code {code}")
                if time.monotonic() - worker.started_at < STEADY:
                    await asyncio.sleep(RESTART_DELAY)
            if self.stopping:
                return
            refusal = await self._start(worker)
            if refusal is None:
                return
            log.error("worker %d could not start: %s", worker.number, refusal)
            code = worker.process.returncode or 0

    async def move(self, vhost: str, target: int, queue: str | None = None, source: int | None = None) -> None:
        """Move a vhost, or a durable queue of it from worker source (its owner when the move was asked), to another
        worker (broker.workers.moving): the workers involved (the vhost's, source and target) stop cleanly, the data
        moves from one store to the other, and they start again; returns once they serve. moving.MoveError if a
        store could not be read or written, or the queue changed meanwhile. (The worker leading the vhost has checked
        the move first: RecordedPlacement.check_move, which refuses a vhost the config pins elsewhere, and any move
        in a cluster; a queue's, cluster.worker's check_queue_move.)"""
        async with self.moving:
            home = self.placement.of(vhost)
            source = home if source is None else source
            if source == target:
                return
            stopped = sorted({home, source, target})
            what = f"vhost '{vhost}'" if queue is None else f"queue '{queue}' of vhost '{vhost}'"
            log.info("stopping workers %s to move %s from worker %d to worker %d", ", ".join(map(str, stopped)),
                     what, source, target)
            loop = asyncio.get_running_loop()

            def work() -> None:  # (on the mover's thread)
                if queue is None:
                    moving.move(self.data_dir, vhost, source, target, lambda: self.placement.of(vhost),
                                lambda: self._lead(vhost, target, loop))
                else:
                    moving.move_queue(self.data_dir, vhost, queue, home, source, target)
            await self._stopped_for(stopped, work)

    async def _stopped_for(self, numbers: list[int], work: Callable[[], None]) -> None:
        """work() run on a thread while these workers are stopped (cleanly); they start again after it, and this
        returns once they serve (or MOVED_SERVING_WAIT passed)."""
        stopped = [self.workers[number] for number in numbers]
        held = asyncio.Event()
        for worker in stopped:
            worker.held = held
        try:
            await self._stop_workers(stopped)
            await asyncio.get_running_loop().run_in_executor(None, work)
        finally:
            for worker in stopped:
                worker.held = None
            held.set()
        await asyncio.wait([asyncio.ensure_future(worker.serving.wait()) for worker in stopped],
                           timeout=MOVED_SERVING_WAIT)

    def _lead(self, vhost: str, worker: int, loop: asyncio.AbstractEventLoop) -> None:
        """The placement names worker for vhost, durably: called on the mover's thread, done on the loop."""
        asyncio.run_coroutine_threadsafe(self._placed(vhost, worker), loop).result()

    async def _placed(self, vhost: str, worker: int) -> None:
        self.placement.leaders[vhost] = worker
        await self._placement_changed()

    async def _save_placement(self) -> None:
        """placement.json written (one save at a time: each writes the same temporary file)."""
        async with self.saving:
            await asyncio.get_running_loop().run_in_executor(None, self.placement.save)

    async def _finish_moving(self) -> None:
        """A move a stop interrupted is finished before any worker starts (broker.workers.moving); one that cannot
        be is logged, and tried again at the next start: the vhost (or queue) is whole where the placement (or its
        home's record) says meanwhile."""
        try:
            move = moving.pending(self.data_dir)
            if move is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, moving.finish, self.data_dir,
                                           lambda: self.placement.of(move["vhost"]),
                                           lambda: self._lead(move["vhost"], move["to"], loop))
        except (moving.MoveError, OSError) as error:
            log.error("could not finish moving a vhost or queue between workers: %s", error)

    async def _stop_workers(self, workers: list[WorkerProcess]) -> None:
        """Stop workers cleanly (SIGTERM, then SIGKILL after STOP_GRACE)."""
        running = [worker.process for worker in workers
                   if worker.process is not None and worker.process.returncode is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(process.wait()) for process in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=STOP_GRACE)
            for process in running:
                if process.returncode is None:
                    process.kill()
            if late:
                await asyncio.wait(late)

    async def stop(self) -> None:
        """Stop the workers (SIGTERM, then SIGKILL after STOP_GRACE) and give back the ports and the data dir; also
        after a start that failed part of the way."""
        self.stopping = True
        for worker in self.workers:
            if worker.held is not None:
                worker.held.set()  # (a move under way ends with the node: its journal finishes it at the next start)
        await self._stop_workers(self.workers)
        for listening in (self.listening, self.listening_tls, *self.listening_mqtt.values()):
            if listening is not None:
                listening.close()
        shutil.rmtree(self.private, ignore_errors=True)
        os.close(self.private_lock)
        self.lock.release()


async def supervise(config: Config, started: Callable[[], None]) -> None:
    """Run the workers until SIGTERM or SIGINT; ``started`` is called once they serve (a start refused before that
    prints its reason alone)."""
    supervisor = Supervisor(config)
    listeners: list[ManagementServer] = []
    try:
        supervisor.take_ports()
        if config.management_port:
            tls = server_context(config) if config.management_tls else None  # HTTPS with the amqps certificate
            listeners.append(await take(make_gateway_app(supervisor), config.management_host, config.management_port,
                                        "management API" + (" (HTTPS)" if tls is not None else ""), tls,
                                        config.management_max_connections))
            config.management_port = listeners[-1].port  # the workers' API names the ports the node is reached at
        if config.prometheus_port:
            listeners.append(await take(make_metrics_gateway_app(WorkerApis(supervisor)),
                                        config.prometheus_host, config.prometheus_port, "Prometheus metrics",
                                        max_connections=config.prometheus_max_connections))
            config.prometheus_port = listeners[-1].port
        stop = stop_on_signals()
        await supervisor.start()
        remove_stale_private_directories()  # (once started: a start refused prints its reason alone)
        started()
        for listener in listeners:
            await listener.serve()
        await stop.wait()
        log.info("shutting down")
    finally:
        for listener in listeners:
            await listener.stop()
        await supervisor.stop()
    log.info("Warren stopped")
