"""Which worker process, and so which replication group, leads each vhost: one rule, recorded.

A vhost stays where it was recorded: its queues and messages are in that worker's store. A vhost met for the first
time goes to the worker the config pins it to (``[[vhosts]] worker``), else to the worker that leads the fewest (the
lowest-numbered of those: ``place_new``), except that a vhost whose contents a store holds before it has a record
stays where its data is. The record is ``data_dir/workers/placement.json`` on a node outside a cluster
(``Placement``: the vhosts whose contents the first worker's store holds when the file does not exist yet stay
there, that store being the data dir of a broker that ran with one process), and a key per vhost in etcd in a
cluster (``ClusterPlacement``, kept by the node's first worker: cluster.groups). A pin that a store contradicts is
refused, naming both: a vhost's data moves between workers only when an operator moves it (broker.workers.moving),
and never in a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Awaitable, Callable

from broker.workers.board import PLACEMENT_KEY
from storage.replica import WORKERS_DIRECTORY
from storage.segments import fsync_directories, make_directories, write_durably

PLACEMENT_FILE = "placement.json"
FORMAT = 1  # the file's format, written in it


class PlacementError(Exception):
    """The placement file cannot be used, or does not fit the number of workers; the text says why."""


def workers_directory(data_dir: Path) -> Path:
    return data_dir / WORKERS_DIRECTORY


def pins_of(config_vhosts: list[dict]) -> dict[str, int]:
    """vhost -> the worker its [[vhosts]] table pins it to."""
    return {table["name"]: table["worker"] for table in config_vhosts if "worker" in table}


def place_new(leaders: dict[str, int], names: Iterable[str], workers: int, pins: dict[str, int]) -> dict[str, int]:
    """The worker each name that leaders do not hold goes to: its pin, else the one that leads the fewest of leaders
    and of the names placed before it (the lowest-numbered of those)."""
    counts = [0] * workers  # vhosts each worker leads, kept up to date as names are placed
    for worker in leaders.values():
        if worker < workers:
            counts[worker] += 1
    placed: dict[str, int] = {}
    for name in names:
        if name not in leaders and name not in placed:
            worker = pins.get(name)
            placed[name] = worker if worker is not None else counts.index(min(counts))
            counts[placed[name]] += 1
    return placed


class VhostLeaders:
    """A record of which worker leads each vhost, as one process holds it."""

    leaders: dict[str, int]  # vhost -> the worker (and group) that leads it

    def of(self, vhost: str) -> int:
        """The worker that leads a vhost (the first for one none leads)."""
        return self.leaders.get(vhost, 0)


def worker_data_dir(data_dir: Path, worker: int) -> Path:
    """Worker 0 keeps the data dir itself (where a one-process broker keeps its store); the others a folder each."""
    return data_dir if worker == 0 else workers_directory(data_dir) / str(worker)


class Placement(VhostLeaders):
    def __init__(self, path: Path, workers: int, pins: dict[str, int] | None = None):
        self.path = path
        self.workers = workers  # how many worker processes there are
        self.pins = pins or {}  # vhost name -> the worker the config pins it to
        self.leaders: dict[str, int] = {}  # vhost name -> the worker that leads it
        self.exists = False  # the file was there when loaded

    @classmethod
    def load(cls, data_dir: Path, workers: int, pins: dict[str, int] | None = None) -> "Placement":
        """The data dir's placement (empty if it has none); PlacementError if it cannot be used with ``workers``
        or ``pins``, OSError if it cannot be read."""
        placement = cls(workers_directory(data_dir) / PLACEMENT_FILE, workers, pins)
        try:
            document = json.loads(placement.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return placement
        except ValueError as error:
            raise PlacementError(f"cannot read the vhost placement {placement.path}: {error}") from None
        leaders = document.get("vhosts") if isinstance(document, dict) else None
        if not isinstance(leaders, dict) or document.get("format") != FORMAT or not all(
                isinstance(worker, int) and not isinstance(worker, bool) and worker >= 0
                for worker in leaders.values()):
            raise PlacementError(f"{placement.path} is not a vhost placement of format {FORMAT} "
                                 "({\"format\": 1, \"vhosts\": {name: worker number}})")
        beyond = sorted(name for name, worker in leaders.items() if worker >= workers)
        if beyond:
            names = ", ".join(repr(name) for name in beyond[:5])
            raise PlacementError(f"vhost {names} lives in the store of worker {leaders[beyond[0]]}, but there are "
                                 f"only {workers} workers: start with at least {max(leaders.values()) + 1}")
        placement.leaders = dict(leaders)
        placement.exists = True
        placement._check_pins()
        return placement

    def place(self, vhosts: list[str], found_in_first: list[str]) -> bool:
        """Give every vhost of ``vhosts`` a worker; ``found_in_first`` are those whose contents the first worker's
        store held before this start. True if anything was placed (then save())."""
        changed = False
        if not self.exists:
            for name in found_in_first:
                self.leaders.setdefault(name, 0)
                changed = True
            self._check_pins()
        placed = place_new(self.leaders, vhosts, self.workers, self.pins)
        self.leaders.update(placed)
        return changed or bool(placed)

    async def add(self, vhosts: list[str]) -> bool:
        """New vhosts placed (made through the API); True if any was (then save())."""
        return self.place(vhosts, [])

    async def remove(self, vhosts: list[str]) -> bool:
        """Deleted vhosts, or vhosts a refused change would have made, taken off; True if any was."""
        return bool([self.leaders.pop(name) for name in vhosts if name in self.leaders])

    def posted(self, board: dict[str, Any]) -> bool:
        return False  # (the file is the supervisor's own: nothing on the board changes it)


    def _check_pins(self) -> None:
        for name, pinned in self.pins.items():
            if self.leaders.get(name, pinned) != pinned:
                raise PlacementError(f"vhost '{name}' is pinned to worker {pinned} ([[vhosts]] worker), but it lives "
                                     f"in the store of worker {self.leaders[name]}: pin it to {self.leaders[name]} or "
                                     f"remove the pin, start, and move it (warrenctl move_vhost {pinned} -p VHOST) "
                                     f"before you pin it to {pinned}")

    def save(self) -> None:
        made: set[Path] = set()
        make_directories(self.path.parent, made)
        fsync_directories(made)
        write_durably(self.path, json.dumps({"format": FORMAT, "vhosts": self.leaders}, indent=1, sort_keys=True))
        self.exists = True


# A worker's way to have the vhosts it starts with recorded: (those vhosts, those its store held) -> the whole record
Recorder = Callable[[list[str], list[str]], Awaitable[dict[str, int]]]
MOVES_IN_A_CLUSTER = ("a vhost of a cluster stays in the group it was recorded in: it does not move between groups; "
                      "choose the node that leads its group instead (PUT .../leader)")
QUEUE_MOVES_IN_A_CLUSTER = ("a queue of a cluster stays in its vhost's group: it does not move between groups; choose "
                            "the node that leads the group instead (PUT /api/vhosts/{vhost}/leader)")


class RecordedPlacement(VhostLeaders):
    """A worker's copy of the record, as its supervisor last told it; a vhost not recorded goes to the first worker
    (which says that it does not exist, or holds it from the data dir of a broker that ran with one process)."""

    def __init__(self, leaders: dict[str, int], recorder: Recorder | None, workers: int, pins: dict[str, int],
                 movable: bool = True):
        self.leaders = leaders  # vhost -> the worker that leads it
        # how this worker has the vhosts of its store recorded as it starts (None: its supervisor told it all)
        self.recorder = recorder
        self.workers = workers  # how many the node runs
        self.pins = pins  # vhost -> the worker its [[vhosts]] table pins it to
        self.movable = movable  # a vhost's data may move to another group (not in a cluster)

    def told(self, leaders: dict[str, int]) -> None:
        self.leaders = leaders

    async def record(self, vhosts: list[str], found: list[str]) -> None:
        """The vhosts this worker starts with, recorded where they are not yet; found: those whose contents its
        store held."""
        if self.recorder is not None:
            self.leaders = await self.recorder(vhosts, found)

    def check_move(self, vhost: str, group: int) -> None:
        """ValueError naming why the vhost cannot move to that worker's group (broker.workers.moving moves it)."""
        self.check_group(group, MOVES_IN_A_CLUSTER)
        pinned = self.pins.get(vhost)
        if pinned is not None and pinned != group:
            raise ValueError(f"vhost '{vhost}' is pinned to group {pinned} by the config ([[vhosts]] worker): change "
                             "the pin to move it")


    def check_group(self, group: int, in_a_cluster: str = QUEUE_MOVES_IN_A_CLUSTER) -> None:
        """ValueError unless data may move to that worker's group: one this node runs, outside a cluster (whose
        refusal says in_a_cluster)."""
        if not self.movable:
            raise ValueError(in_a_cluster)
        if not 0 <= group < self.workers:
            raise ValueError(f"there is no group {group}: this node runs {self.workers} workers, groups 0 to "
                             f"{self.workers - 1}")


class ClusterPlacement(VhostLeaders):
    """A clustered node's supervisor's copy of the cluster's record: as its first worker posts it on the board, and
    as that worker answers when it records the vhosts made through this node's API (a request of the supervisor's:
    ``ask``, None when the worker does not serve)."""

    def __init__(self, pins: dict[str, int], ask: Callable[[dict], Awaitable[dict | None]]):
        self.pins = pins  # vhost -> worker, from [[vhosts]] worker = k
        self.ask = ask
        self.leaders: dict[str, int] = {}  # vhost -> the group it is recorded in

    def place(self, vhosts: list[str], found_in_first: list[str]) -> bool:
        return False  # (a clustered worker records the vhosts of its store itself)

    def save(self) -> None:
        pass  # (the record is etcd's: the first worker has written it)

    async def add(self, vhosts: list[str]) -> bool:
        return await self._asked({"record": vhosts})

    async def remove(self, vhosts: list[str]) -> bool:
        return await self._asked({"forget": vhosts})

    async def reread(self) -> bool:
        """The record read again from etcd (a vhost made through another node a moment ago, which this node's
        first worker has not seen change yet); True if it changed."""
        before = self.leaders
        await self._asked({"record": []})
        return self.leaders != before

    def posted(self, board: dict[str, Any]) -> bool:
        """The record as the board holds it, taken if it changed."""
        record = board.get(PLACEMENT_KEY)
        if not isinstance(record, dict) or record == self.leaders:
            return False
        self.leaders = dict(record)
        return True

    async def _asked(self, request: dict) -> bool:
        answer = await self.ask(request)
        if answer is None or "placement" not in answer:
            reason = answer["refused"] if answer is not None else "the node's first worker is not serving"
            raise PlacementError(f"the cluster's record of its vhosts cannot be changed now: {reason}")
        self.leaders = answer["placement"]
        return True
