"""The partition tests' network (tests/cluster/netns.py): its links pass, a cut drops silently what it should and
nothing else, a one-way cut only one way, a heal undoes every cut, and a dead run's leftovers are removed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.netns import CLIENTS, Network, network_or_skip, remove_stale, run
from tests.conftest import free_port
from tests.waiting import wait_for

PROBE_TIMEOUT = 1.0  # seconds a probe waits for a connection or a datagram: a cut link times out, a good one doesn't
ARRIVAL = 0.3  # seconds a probe may take to arrive once its sender is done (microseconds on a bridge)
LISTENER = """
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[2] == "tcp" else socket.SOCK_DGRAM
server = socket.socket(socket.AF_INET, kind)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[3])))
if kind == socket.SOCK_STREAM:
    server.listen()
print("ready", flush=True)
server.accept() if kind == socket.SOCK_STREAM else server.recv(64)
print("got", flush=True)
"""  # it ends at the first arrival, or is killed
SENDER = """
import socket, sys
try:
    if sys.argv[2] == "tcp":
        socket.create_connection((sys.argv[1], int(sys.argv[3])), timeout={timeout}).close()
    else:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"probe", (sys.argv[1], int(sys.argv[3])))
except OSError as error:
    sys.exit(f"{{error!r}}")
""".format(timeout=PROBE_TIMEOUT)


@pytest.fixture
def network():
    yield from network_or_skip(["x", "y"])


def python_at(network: Network, name: str, script: str, *args: str) -> list[str]:
    return [*network.place(name).prefix, sys.executable, "-c", script, *args]


def reaches(network: Network, sender: str, receiver: str, protocol: str = "tcp") -> bool:
    """Whether a TCP connection (or a UDP datagram) from ``sender`` gets to ``receiver``."""
    address, port = network.address(receiver), str(free_port())  # free here, and in a fresh namespace anyway
    listener = subprocess.Popen(python_at(network, receiver, LISTENER, address, protocol, port),
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline() == "ready\n"
        sent = subprocess.run(python_at(network, sender, SENDER, address, protocol, port), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT + 5)
        try:
            output, _ = listener.communicate(timeout=ARRIVAL)
        except subprocess.TimeoutExpired:
            output = ""
    finally:
        listener.kill()
        listener.wait()
    if protocol == "tcp":
        assert ("got" in output) == (sent.returncode == 0), (output, sent.stderr)
        assert sent.returncode == 0 or "timed out" in sent.stderr, f"not a silent drop: {sent.stderr}"
    else:
        assert sent.returncode == 0, f"a UDP send failed: {sent.stderr}"  # a cut never fails the sender
    return "got" in output


def test_every_link_passes_until_cut(network):
    assert all(reaches(network, one, other) for one, other in
               [("x", "y"), ("y", "x"), (CLIENTS, "x"), ("y", CLIENTS)])


def test_a_cut_drops_both_ways_and_nothing_else_and_a_heal_undoes_it(network):
    network.cut("x", "y")
    assert not reaches(network, "x", "y") and not reaches(network, "y", "x")
    assert reaches(network, CLIENTS, "y") and reaches(network, "x", CLIENTS)
    network.heal()
    assert network.cuts() == 0
    assert reaches(network, "x", "y") and reaches(network, "y", "x")


def test_a_one_way_cut_drops_one_direction_only(network):
    network.cut("x", "y", both_ways=False)
    assert not reaches(network, "x", "y", "udp")
    assert reaches(network, "y", "x", "udp")


def test_a_cut_from_the_test_process(network):
    network.cut(CLIENTS, "x", both_ways=False)
    assert not reaches(network, CLIENTS, "x", "udp")
    assert reaches(network, "x", CLIENTS, "udp") and reaches(network, "y", "x", "udp")


def test_an_isolated_namespace_reaches_nothing_and_nothing_reaches_it(network):
    network.isolate("x")
    assert not any(reaches(network, one, other, "udp") for one, other in
                   [("x", "y"), ("y", "x"), (CLIENTS, "x"), ("x", CLIENTS)])
    assert reaches(network, "y", CLIENTS)
    network.heal()
    assert reaches(network, CLIENTS, "x")


def test_the_leftovers_of_a_killed_run_are_removed(network):
    """A namespace named after a dead pid, with a process still inside, is removed with its process; the live run's
    namespaces stay."""
    dead = 2
    while os.path.exists(f"/proc/{dead}"):  # the lowest pid that is free now
        dead += 1
    namespace = f"warren-{dead}x0ab-z"
    run("ip", "netns", "add", namespace)
    leftover = subprocess.Popen(["ip", "netns", "exec", namespace, "sleep", "60"])
    try:
        def in_namespace() -> bool:  # it runs sleep by now
            if Path(f"/proc/{leftover.pid}/comm").read_text().strip() == "sleep":
                return True
            assert leftover.poll() is None, "ip netns exec did not start sleep"
            return False
        wait_for(in_namespace, 10, "ip netns exec starting sleep", 0.01)
        assert namespace in remove_stale()
        assert leftover.wait(5) == -9
        namespaces = run("ip", "netns", "list")
        assert namespace not in namespaces and network.endpoints["x"].namespace in namespaces
    finally:
        if leftover.poll() is None:
            leftover.kill()
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)


def test_the_network_is_private(network):
    """Nothing of a run is routed beyond its bridge: a namespace has its subnet's route and no other."""
    routes = run("ip", "-4", "route", "show", namespace=network.endpoints["x"].namespace).strip()
    assert routes == f"{network.subnet} dev eth0 proto kernel scope link src {network.address('x')}"
