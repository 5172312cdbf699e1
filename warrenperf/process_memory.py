"""Find a broker's process and read its resident memory and CPU time, from /proc (Linux only)."""

from __future__ import annotations

import os

_TCP_LISTEN = "0A"  # socket state LISTEN in /proc/net/tcp


def resident_kib(pid: int) -> int:
    """The process's resident set size in KiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise LookupError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) spent so far by the process and its live descendants (Warren's disk writer)."""
    ticks = 0
    for process in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{process}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def listener_pid(port: int) -> int:
    """The process that listens on TCP `port` (for RabbitMQ this is beam.smp itself)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except FileNotFoundError:
            continue
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return int(pid)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    raise LookupError(f"no process listens on port {port}")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found
