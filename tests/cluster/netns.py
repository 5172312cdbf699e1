"""A private network of Linux network namespaces for the cluster's partition tests, with links that can be cut.

    network = Network(["etcd", "a", "b", "c"])  # a bridge, one namespace per name; the test process is "clients"
    network.start()
    node_a = network.place("a")                 # Place(host="10.213.N.3", prefix=("ip", "netns", "exec", ...))
    network.cut("a", "b")                       # both ways; network.cut("a", "b", both_ways=False): a -> b only
    network.isolate("c")                        # c cut from everything, the test process included
    network.heal()                              # every link up again
    network.close()

A bridge in the root namespace carries a /24 chosen per run among 10.213.0.0/16 (one that no route of this machine
touches), with .1 on the bridge itself for the test process (publishers, drains, etcd observers: "clients"). Each
name gets a namespace of its own with a veth to the bridge and the next address. Nothing is routed beyond the
bridge: no default route, no forwarding, so nothing here reaches or is reached from the machine's real network.

A cut drops packets silently, as a broken switch or a partition does: no reset, no ICMP, no error to the sender.
Every interface carries an htb qdisc from the start whose unclassified packets pass straight through; a cut adds a
u32 filter that classifies the packets of the cut link into a class whose qdisc is a blackhole. A packet from a
namespace is dropped where it leaves that namespace, a packet from the test process on the bridge's port towards
its receiver. (This kernel has no gact action, so no `action drop`; a blackhole route would fail the sender's
send() with EINVAL, which no real partition does.)

Names carry the pid of the process that made them, so that the leftovers of a run that was killed (its pid dead)
are removed by the next run, processes still inside its namespaces included. Where the test process is not root,
or namespaces or tc cannot be used, network_or_skip() skips the test saying why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CLIENTS = "clients"  # the test process's own end of the network: the root namespace, on the bridge
INSIDE = "eth0"  # the name of each namespace's interface to the bridge
SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")  # where a run's /24 is chosen
SUBNET_ATTEMPTS = 64  # random /24s tried before giving up (each checked against every route of the machine)
DROP_CLASS = "1:66"  # the htb class whose qdisc is a blackhole: what a cut classifies into it is dropped
COMMAND_TIMEOUT = 10.0  # seconds an ip or tc command may take
# Names of a run: "warren-<pid>x<tag>-<name>" for namespaces, "wr<kind><pid>x<tag>[index]" for links (kind b: the
# bridge, v: a bridge port, i: a veth end not yet moved into its namespace), at most 15 characters.
NAMESPACE_NAME = re.compile(r"^warren-(\d+)x[0-9a-f]{3}-\w+$")
LINK_NAME = re.compile(r"^wr[bvi](\d+)x[0-9a-f]{3}\d?$")


class NetworkUnavailable(RuntimeError):
    """This machine (or this user) cannot make the namespaces, links or filters the tests need."""


@dataclass(frozen=True)
class Place:
    """Where a process of a test runs: the address it listens on, and the command prefix that runs it there."""

    host: str
    prefix: tuple[str, ...] = ()  # e.g. ("ip", "netns", "exec", NAME); empty: this process's own namespace


LOCAL = Place("127.0.0.1")  # the test process's namespace, on loopback: where the cluster tests ran before


@dataclass
class Endpoint:
    """One end of the private network."""

    name: str
    address: str
    namespace: str | None  # None for CLIENTS (the root namespace)
    port: str | None  # its veth on the bridge, in the root namespace (None for CLIENTS, who are the bridge)


@dataclass(frozen=True)
class Drop:
    """One filter of a cut, to be deleted by heal()."""

    namespace: str | None  # where the interface lives (None: the root namespace)
    device: str
    preference: int  # the filter's pref, unique on its device


def run(*command: str, namespace: str | None = None) -> str:
    """Run ip or tc (in ``namespace`` with -n); its stdout, or NetworkUnavailable with its stderr."""
    argv = [command[0], *(("-n", namespace) if namespace else ()), *command[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if done.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process still running in ``namespace`` (started there by a test), by pid."""
    try:
        pids = run("ip", "netns", "pids", namespace).split()
    except NetworkUnavailable:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_stale() -> list[str]:
    """Remove the namespaces and links of runs whose process is dead; the names removed."""
    removed = []
    for namespace in run("ip", "netns", "list").split("\n"):
        namespace = namespace.split(" ")[0]
        if (match := NAMESPACE_NAME.match(namespace)) and not _alive(int(match[1])):
            _kill_inside(namespace)
            run("ip", "netns", "delete", namespace)
            removed.append(namespace)
    for link in json.loads(run("ip", "-j", "link", "show") or "[]"):
        name = link.get("ifname", "")
        if (match := LINK_NAME.match(name)) and not _alive(int(match[1])):
            try:
                run("ip", "link", "delete", name)
            except NetworkUnavailable:  # one end of a pair whose other end went first: gone with it
                continue
            removed.append(name)
    return removed


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination this machine routes (the default route aside), from every routing table."""
    used = []
    for route in json.loads(run("ip", "-j", "-4", "route", "show", "table", "all") or "[]"):
        destination = route.get("dst", "default")
        if destination != "default":
            used.append(ipaddress.IPv4Network(destination, strict=False))
    return used


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUPERNET that no route of this machine overlaps (nor a concurrent run's bridge)."""
    used = _subnets_in_use()
    candidates = list(SUPERNET.subnets(new_prefix=24))
    for _ in range(SUBNET_ATTEMPTS):
        subnet = random.choice(candidates)
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NetworkUnavailable(f"no free /24 in {SUPERNET} after {SUBNET_ATTEMPTS} tries")


class Network:
    """A bridge, a namespace per name, and cuts between any two of the names and CLIENTS (see the module's doc)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        assert CLIENTS not in self.names and len(self.names) <= 10, "at most 10 names, none of them CLIENTS"
        self.tag = f"{os.getpid()}x{random.randrange(4096):03x}"  # in every name of this run
        self.bridge = f"wrb{self.tag}"
        self.subnet: ipaddress.IPv4Network | None = None  # chosen by start()
        self.endpoints: dict[str, Endpoint] = {}  # by name, CLIENTS included, once start() made them
        self._drops: list[Drop] = []  # the filters of the cuts in force
        self._next_preference = 10  # the pref of the next filter (unique per device because unique per network)

    # --- making and removing it ----------------------------------------------------------------------------
    def start(self) -> None:
        """Make the bridge and the namespaces (after removing what dead runs left); NetworkUnavailable if the
        machine does not allow it (whatever was made is removed again)."""
        remove_stale()
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        self.subnet = free_subnet()
        hosts = self.subnet.hosts()
        clients = str(next(hosts))
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "address", "add", f"{clients}/{self.subnet.prefixlen}", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        self.endpoints[CLIENTS] = Endpoint(CLIENTS, clients, None, None)
        for index, name in enumerate(self.names):
            namespace, port, inner = f"warren-{self.tag}-{name}", f"wrv{self.tag}{index}", f"wri{self.tag}{index}"
            endpoint = Endpoint(name, str(next(hosts)), namespace, port)
            run("ip", "netns", "add", namespace)
            self.endpoints[name] = endpoint
            run("ip", "link", "add", port, "type", "veth", "peer", "name", inner)
            run("ip", "link", "set", inner, "netns", namespace)
            run("ip", "link", "set", inner, "name", INSIDE, namespace=namespace)
            run("ip", "address", "add", f"{endpoint.address}/{self.subnet.prefixlen}", "dev", INSIDE,
                namespace=namespace)
            run("ip", "link", "set", "lo", "up", namespace=namespace)
            run("ip", "link", "set", INSIDE, "up", namespace=namespace)
            run("ip", "link", "set", port, "master", self.bridge, "up")
            self._prepare(namespace, INSIDE)
            self._prepare(None, port)

    @staticmethod
    def _prepare(namespace: str | None, device: str) -> None:
        """The qdiscs a cut's filters classify into: unclassified packets pass, DROP_CLASS is a blackhole."""
        run("tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", namespace=namespace)
        run("tc", "class", "add", "dev", device, "parent", "1:", "classid", DROP_CLASS, "htb", "rate", "1mbit",
            "quantum", "1514", namespace=namespace)
        run("tc", "qdisc", "add", "dev", device, "parent", DROP_CLASS, "handle", "66:", "blackhole",
            namespace=namespace)

    def close(self) -> None:
        """Remove everything this network made, ending any process still inside its namespaces."""
        self._drops.clear()
        for endpoint in self.endpoints.values():
            if endpoint.namespace is not None and endpoint.port is not None:
                _kill_inside(endpoint.namespace)
                for kind, name in (("link", endpoint.port), ("netns", endpoint.namespace)):
                    try:
                        run("ip", kind, "delete", name)
                    except NetworkUnavailable:
                        pass  # never made (start() failed half way)
        try:
            run("ip", "link", "delete", self.bridge)
        except NetworkUnavailable:
            pass  # never made
        self.endpoints.clear()

    # --- where things run -------------------------------------------------------------------------------------
    def address(self, name: str) -> str:
        return self.endpoints[name].address

    def place(self, name: str) -> Place:
        """Where a process of ``name`` runs: its address, and `ip netns exec` into its namespace."""
        endpoint = self.endpoints[name]
        if endpoint.namespace is None:
            return Place(endpoint.address)
        return Place(endpoint.address, ("ip", "netns", "exec", endpoint.namespace))

    # --- cuts -------------------------------------------------------------------------------------------------
    def cut(self, one: str, other: str, *, both_ways: bool = True) -> None:
        """Drop every packet from ``one`` to ``other`` (and back, unless both_ways is False)."""
        self._drop_from(one, self.endpoints[other].address)
        if both_ways:
            self._drop_from(other, self.endpoints[one].address)

    def isolate(self, name: str) -> None:
        """Cut ``name`` from everything, both ways."""
        for other in self.endpoints:
            if other != name:
                self.cut(name, other)

    def heal(self) -> None:
        """Delete every cut's filter: every link passes again."""
        while self._drops:
            drop = self._drops.pop()
            run("tc", "filter", "delete", "dev", drop.device, "parent", "1:", "pref", str(drop.preference),
                namespace=drop.namespace)

    def cuts(self) -> int:
        """How many filters are in force (0 once healed)."""
        return len(self._drops)

    def _drop_from(self, sender: str, destination: str) -> None:
        """Packets from ``sender`` to ``destination`` are dropped where they leave the sender's namespace, or,
        from CLIENTS, on the bridge's port towards the receiver."""
        endpoint = self.endpoints[sender]
        if endpoint.namespace is not None:
            self._filter(endpoint.namespace, INSIDE, "dst", destination)
        else:
            receiver = next(e for e in self.endpoints.values() if e.address == destination)
            assert receiver.port is not None
            self._filter(None, receiver.port, "src", endpoint.address)

    def _filter(self, namespace: str | None, device: str, field: str, address: str) -> None:
        preference = self._next_preference
        self._next_preference += 1
        run("tc", "filter", "add", "dev", device, "parent", "1:", "protocol", "ip", "pref", str(preference), "u32",
            "match", "ip", field, f"{address}/32", "classid", DROP_CLASS, namespace=namespace)
        self._drops.append(Drop(namespace, device, preference))


def network_or_skip(names: Iterable[str]) -> Iterator[Network]:
    """Yield a started Network, closing it afterwards whatever happens; skip the test where none can be made
    (a generator for fixtures)."""
    if os.geteuid() != 0:
        pytest.skip("the partition tests make network namespaces and tc filters: they need root")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("the partition tests need iproute2's ip and tc")
    network = Network(names)
    try:
        network.start()
    except NetworkUnavailable as error:
        pytest.skip(f"cannot make a private network of namespaces here: {error}")
    try:
        yield network
    finally:
        network.close()
