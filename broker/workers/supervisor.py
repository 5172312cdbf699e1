"""The supervisor of ``warren-server --workers N``: one AMQP socket, N worker processes that accept from it, each
leading a share of the vhosts with a store of its own, and a worker that dies started again.

Start: the first worker reads its store (the data dir itself) and names its vhosts; the supervisor places them
(broker.workers.placement) and answers; once the first worker serves, the others start with the placement and its
node-wide definitions (users, vhosts, permissions), which they copy. A worker started again goes through the same
steps, so it finds what the others have.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
import time
from pathlib import Path

from broker.config import Config
from broker.connection.handoff import handoff_pair
from broker.connection.server import StartupError, data_dir_error, prepare_data_dir, reason_of, stop_on_signals
from broker.workers.placement import Placement, PlacementError
from broker.workers.worker import CONTROL_LINE_LIMIT, receive, send

log = logging.getLogger(__name__)

RESTART_DELAY = 1.0  # seconds before a worker that died soon after its start is started again
STEADY = 10.0  # seconds a worker must have run for its death to be restarted at once
STOP_GRACE = 15.0  # seconds workers get to stop cleanly before they are killed


class WorkerProcess:
    """One worker as the supervisor sees it."""

    def __init__(self, number: int):
        self.number = number
        self.process: asyncio.subprocess.Process | None = None
        self.receiving, self.sending = handoff_pair()  # where its hand-offs wait (kept here across its restarts)
        self.started_at = 0.0  # monotonic seconds of its latest start


class Supervisor:
    def __init__(self, config: Config, workers: int):
        self.config = config
        self.data_dir = Path(config.data_dir).absolute()
        self.workers = [WorkerProcess(number) for number in range(workers)]
        self.placement: Placement | None = None
        self.node_wide: dict | None = None  # the first worker's users, vhosts and permissions
        self.listening: socket.socket | None = None
        self.stopping = False

    def take_port(self) -> None:
        host, port = self.config.host, self.config.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))  # the first worker listens once it serves: clients wait for nothing until then
        except OSError as error:
            sock.close()
            raise StartupError(f"cannot listen on {host}:{port}: {reason_of(error)}") from error
        sock.setblocking(False)
        self.listening = sock

    async def start(self) -> None:
        prepare_data_dir(self.data_dir)
        try:
            self.placement = Placement.load(self.data_dir, len(self.workers))
        except PlacementError as error:
            raise StartupError(str(error)) from error
        except OSError as error:
            raise data_dir_error(self.data_dir, error) from error
        for worker in self.workers:
            if not await self._start(worker):
                await self.stop()
                raise StartupError(f"worker {worker.number} could not start (see the lines above)")
        assert self.listening is not None
        host, port = self.listening.getsockname()[:2]
        log.info("Warren listening on %s:%d with %d worker processes", host, port, len(self.workers))

    async def _start(self, worker: WorkerProcess) -> bool:
        """Start one worker and wait until it serves; False if it exits first."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        assert self.listening is not None and self.placement is not None
        senders = {other.number: other.sending.fileno() for other in self.workers if other is not worker}
        inherited = [child.fileno(), self.listening.fileno(), worker.receiving.fileno(), *senders.values()]
        # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which stops the workers in turn.
        worker.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.workers.worker", str(child.fileno()), pass_fds=inherited,
            start_new_session=True)
        worker.started_at = time.monotonic()
        child.close()
        log.info("worker %d started (pid %d)", worker.number, worker.process.pid)
        reader, writer = await asyncio.open_connection(sock=parent, limit=CONTROL_LINE_LIMIT)
        first = worker.number == 0
        try:
            await send(writer, {
                "config": dataclasses.asdict(self.config), "worker": worker.number,
                "listening": self.listening.fileno(), "receiving": worker.receiving.fileno(), "senders": senders,
                "placement": None if first else self.placement.leaders, "node": None if first else self.node_wide})
            if first:
                named = await receive(reader)
                if self.placement.place(named["vhosts"], named["found"]):
                    await asyncio.get_running_loop().run_in_executor(None, self.placement.save)
                await send(writer, {"placement": self.placement.leaders})
            serving = await receive(reader)
        except (ConnectionError, OSError, ValueError) as error:
            log.debug("worker %d ended before it served: %s", worker.number, error)
            writer.close()
            await worker.process.wait()
            return False
        if first:
            self.node_wide = serving["node"]
        asyncio.get_running_loop().create_task(self._watch(worker, writer))
        return True

    async def _watch(self, worker: WorkerProcess, control: asyncio.StreamWriter) -> None:
        """Wait for the worker to end; unless the node is stopping, start it again (after RESTART_DELAY when it
        had run less than STEADY seconds)."""
        assert worker.process is not None
        code = await worker.process.wait()
        control.close()
        while not self.stopping:
            log.error("worker %d (pid %d) ended with %s; starting it again", worker.number, worker.process.pid,
                      f"signal {-code}" if code < 0 else f"exit code {code}")
            if time.monotonic() - worker.started_at < STEADY:
                await asyncio.sleep(RESTART_DELAY)
            if self.stopping or await self._start(worker):
                return
            code = worker.process.returncode or 0

    async def stop(self) -> None:
        self.stopping = True
        running = [worker.process for worker in self.workers
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
        if self.listening is not None:
            self.listening.close()
        log.info("Warren stopped")


async def supervise(config: Config, workers: int) -> None:
    supervisor = Supervisor(config, workers)
    supervisor.take_port()
    stop = stop_on_signals()
    await supervisor.start()
    await stop.wait()
    log.info("shutting down")
    await supervisor.stop()
