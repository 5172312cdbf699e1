"""Which process holds a TCP connection's socket, read from /proc (Linux); the standard library alone."""

from __future__ import annotations

import os


def socket_links(local_port: int, remote_port: int) -> set[str]:
    """What an fd of the TCP socket from local_port to remote_port links to ('socket:[inode]'), over IPv4 and IPv6;
    empty while no process has accepted it (the kernel lists it with inode 0)."""
    links = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                ports = (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16))
                if ports == (local_port, remote_port) and fields[9] != "0":
                    links.add(f"socket:[{fields[9]}]")
    return links


def fd_links(pid: int) -> set[str]:
    """What the fds of process pid link to; empty once it has ended or if it is not ours to look at. An fd that
    closes while the others are read is left out, not taken for the end of the process."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return links
