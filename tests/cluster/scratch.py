"""Directories for what the cluster tests sync to disk (etcd's data, the nodes' data dirs): in memory where the
machine has room.

etcd syncs its log before it answers, and a leader's store syncs every batch before it confirms and renews its lease
only while its writer finishes batches. With the suite's other tests writing to the same disk, an fdatasync took up
to 0.8 s here, and more: etcd stopped answering for seconds, and a leader's writer finished no batch for 1.2 s, so
that a leader lost its 2 s lease for a fault of the test machine, not of the cluster (production gives etcd and each
node a disk of their own: docs/clustering.md). A process killed keeps its writes all the same, in memory as on disk:
the tests kill processes, never the machine. The tests of disk faults give their nodes disks of their own.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

MEMORY_DIR = Path("/dev/shm")


def scratch_dir(prefix: str, room: int) -> Path:
    """A new directory in MEMORY_DIR where it has ``room`` bytes free, else in the temp dir; the caller removes it."""
    in_memory = MEMORY_DIR.is_dir() and shutil.disk_usage(MEMORY_DIR).free >= room
    return Path(tempfile.mkdtemp(prefix=prefix, dir=MEMORY_DIR if in_memory else None))
