"""A node's own cluster bookkeeping in its data dir (``cluster-state``, never replicated): the data dir's identity
and the newest leader epoch it has accepted frames of.

The identity is made once, when a data dir without one first takes part in a cluster, and is never reused: the ISR
vouches for data dirs by it (Kafka's directory ids, KIP-858; Raft's rule that a server with a new disk rejoins as a
new member). A node whose data dir was wiped, replaced or damaged comes back with a new identity, so it is not in
the ISR: it may not campaign and takes a full copy, whatever its node id. A follower's full copy keeps the file.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from storage.replica import CLUSTER_STATE
from storage.segments import fsync_directories, make_directories, write_durably


@dataclass(frozen=True)
class ClusterState:
    dir: str  # the data dir's identity
    epoch: int  # the newest leader epoch this data dir has accepted frames of (0: none)


def read_state(data_dir: Path) -> ClusterState | None:
    """What ``cluster-state`` holds; None when it is missing or damaged (the data dir then gets a new identity)."""
    try:
        fields = json.loads((data_dir / CLUSTER_STATE).read_bytes())
        state = ClusterState(fields["dir"], fields["epoch"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return state if isinstance(state.dir, str) and state.dir and type(state.epoch) is int else None


def identity(data_dir: Path) -> str:
    """The data dir's identity, made now (durably) if it has none."""
    state = read_state(data_dir)
    if state is None:
        state = ClusterState(uuid.uuid4().hex, 0)
        write_state(data_dir, state)
    return state.dir


def read_epoch(data_dir: Path) -> int:
    """The newest epoch this data dir has accepted frames of, 0 if none."""
    state = read_state(data_dir)
    return 0 if state is None else state.epoch


def write_epoch(data_dir: Path, epoch: int) -> None:
    """Durably record that this data dir follows epoch ``epoch`` now (before any of its frames is acked)."""
    write_state(data_dir, ClusterState(identity(data_dir), epoch))


def write_state(data_dir: Path, state: ClusterState) -> None:
    made: set[Path] = set()  # directories whose entries changed: each made directory's parent
    make_directories(data_dir, made)
    fsync_directories(made)
    write_durably(data_dir / CLUSTER_STATE, json.dumps(asdict(state)))  # (its temporary file is never replicated)
