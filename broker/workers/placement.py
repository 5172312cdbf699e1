"""Which worker process leads each vhost, kept in ``data_dir/workers/placement.json``.

A vhost stays where it was placed: its queues and messages are in that worker's store. A vhost met for the first
time goes to the worker the config pins it to (``[[vhosts]] worker``), else to the worker that leads the fewest (the
lowest-numbered of those), except that the vhosts found in the first worker's store when the file does not exist yet
stay there: that store is the data dir of a broker that ran with one process, and holds them. A pin that another
worker's store contradicts is refused, naming both: a vhost's data does not move between workers.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Awaitable, Callable

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


def worker_data_dir(data_dir: Path, worker: int) -> Path:
    """Worker 0 keeps the data dir itself (where a one-process broker keeps its store); the others a folder each."""
    return data_dir if worker == 0 else workers_directory(data_dir) / str(worker)


class Placement:
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

    def of(self, vhost: str) -> int:
        """The worker that leads a vhost (the first for one none leads)."""
        return self.leaders.get(vhost, 0)

    def place(self, vhosts: list[str], found_in_first: list[str]) -> bool:
        """Give every vhost of ``vhosts`` a worker; ``found_in_first`` are those the first worker's store held
        before this start. True if anything was placed (then save())."""
        changed = False
        if not self.exists:
            for name in found_in_first:
                self.leaders.setdefault(name, 0)
                changed = True
            self._check_pins()
        counts = [0] * self.workers  # vhosts each worker leads, kept up to date as vhosts are placed
        for worker in self.leaders.values():
            counts[worker] += 1
        for name in vhosts:
            if name not in self.leaders:
                worker = self.pins.get(name)
                if worker is None:
                    worker = counts.index(min(counts))  # the one that leads the fewest, the lowest-numbered of those
                self.leaders[name] = worker
                counts[worker] += 1
                changed = True
        return changed

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


class RecordedPlacement:
    """Where the workers of a node outside a cluster have a vhost: the worker the supervisor recorded for it (Placement,
    placement.json), as it last told them; a vhost it has not recorded goes to the first worker (which says that it
    does not exist, or holds it from the data dir of a broker that ran with one process)."""

    def __init__(self, leaders: dict[str, int], ask: Callable[[dict], Awaitable[dict]], workers: int,
                 pins: dict[str, int]):
        self.leaders = leaders  # vhost -> the worker that leads it
        self.ask = ask  # a request to the supervisor, and its answer
        self.workers = workers  # how many the node runs
        self.pins = pins  # vhost -> the worker its [[vhosts]] table pins it to

    def of(self, vhost: str) -> int:
        return self.leaders.get(vhost, 0)

    def told(self, leaders: dict[str, int]) -> None:
        self.leaders = leaders

    async def record(self, vhosts: list[str], found: list[str]) -> None:
        """The first worker's vhosts, once its store is read, placed by the supervisor where they are not yet;
        found: those its store held."""
        self.leaders = (await self.ask({"vhosts": vhosts, "found": found}))["placement"]

    def check_move(self, vhost: str, group: int) -> None:
        """ValueError naming why the vhost cannot move to that worker's group (broker.workers.moving moves it)."""
        if not 0 <= group < self.workers:
            raise ValueError(f"there is no group {group}: this node runs {self.workers} workers, groups 0 to "
                             f"{self.workers - 1}")
        pinned = self.pins.get(vhost)
        if pinned is not None and pinned != group:
            raise ValueError(f"vhost '{vhost}' is pinned to group {pinned} by the config ([[vhosts]] worker): change "
                             "the pin to move it")


class HashedPlacement:
    """Where a clustered node's workers place a vhost: the worker (and so the replication group) its [[vhosts]]
    table pins it to, else a hash of its name. The same on every node without asking anyone, and for any name:
    the worker a name maps to answers for it, existing or not (cluster.worker)."""

    def __init__(self, workers: int, pins: dict[str, int]):
        self.workers = workers
        self.pins = pins  # vhost -> worker, from [[vhosts]] worker = k
        self.leaders: dict[str, int] = {}  # (as Placement's: none is recorded)

    def place(self, vhosts: list[str], found_in_first: list[str]) -> bool:
        return False  # (as Placement's: a name's group needs no record)

    def save(self) -> None:
        pass

    async def record(self, vhosts: list[str], found: list[str]) -> None:
        pass  # (a name's group needs no record)

    def check_move(self, vhost: str, group: int) -> None:
        raise ValueError("a vhost of a cluster is in the group its name gives (or its [[vhosts]] pin): it does not "
                         "move between groups; choose the node that leads its group instead (PUT .../leader)")

    def of(self, vhost: str) -> int:
        pinned = self.pins.get(vhost)
        return pinned if pinned is not None else zlib.crc32(vhost.encode()) % self.workers
