"""Three nodes of one worker or of two, and the client and API helpers of the tests that use them.

A node of one worker and a node of two run the same code (the supervisor and cluster.worker): worker k of every
node is a member of replication group k. With one worker there is one group, every vhost lives in it, and the API
names each node as itself (a@host); with two, the vhosts "one" and "two" live in groups 0 and 1, which are led by
different nodes, and the API names each worker after its node and number (a-0@host). The tests of what a user sees
the same way in both run over both (test_forwarding.py); those of the groups themselves take two (test_groups.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pika

from tests.cluster.nodes import Cluster, Observer, wait_for
from tests.conftest import REPO_ROOT, free_port

TABLES = "\n".join(
    f'[[vhosts]]\nname = "{name}"\nworker = {group}\n'
    f'[[permissions]]\nuser = "guest"\nvhost = "{name}"\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
    for name, group in (("one", 0), ("two", 1)))
VHOSTS = {1: ["/"], 2: ["one", "two"]}  # the vhost of each group, by workers per node


@dataclasses.dataclass
class Nodes:
    """Three nodes a, b and c of ``workers`` workers each, and an observer of each group's keys in etcd."""
    cluster: Cluster
    observers: list[Observer]

    @property
    def workers(self) -> int:
        return len(self.observers)

    @property
    def vhosts(self) -> list[str]:
        """The vhost of each group: "/" in the one group of nodes of one worker; "one" and "two" with two."""
        return VHOSTS[self.workers]

    def worker(self, node: str, group: int) -> str:
        """The name the API gives (before its @host) to the member of ``group`` on ``node``."""
        return node if self.workers == 1 else f"{node}-{group}"

    def leaders(self) -> list[str]:
        """Wait for a leader in each group, on different nodes; the node leading each group."""
        return wait_for(lambda: leaders(self.observers), 30, "a leader in each group, on different nodes")


@contextlib.contextmanager
def three_nodes(tmp_path, etcd_endpoint, workers: int, certificates=None, hostnames: dict[str, list[str]] | None = None,
                between_nodes: bool = False, prometheus: bool = False) -> Iterator[Nodes]:
    """Three nodes of ``workers`` workers (with two: the vhosts of TABLES), started; their logs printed should the
    block fail. With certificates, an amqps port each and the management API over HTTPS (and TLS between the nodes
    too with between_nodes); with hostnames, the management hostnames of a node; with prometheus, a Prometheus
    port on nodes of one worker too (nodes of several have one)."""
    name = f"t{uuid.uuid4().hex[:10]}"
    cluster = Cluster(tmp_path, name, etcd_endpoint, **({"workers": workers, "tables": TABLES} if workers > 1 else {}))
    for node, names in (hostnames or {}).items():
        config = cluster.nodes[node].config_path
        names_line = f"hostnames = {json.dumps(names)}\n"
        config.write_text(config.read_text().replace("[management]\n", "[management]\n" + names_line))
    for node in cluster.nodes.values() if prometheus and workers == 1 else ():
        node.prometheus_port = port_not_given(cluster, workers)
        node.config_path.write_text(node.config_path.read_text().replace(
            "[prometheus]\nport = 0\n", f"[prometheus]\nport = {node.prometheus_port}\n"))
    certificate = "node" if between_nodes else "server"  # (a node's is a client's too)
    for node in cluster.nodes.values() if certificates is not None else ():
        node.tls_port = port_not_given(cluster, workers)
        text = node.config_path.read_text().replace("[management]\n", "[management]\ntls = true\n")
        if between_nodes:
            text = text.replace("[cluster]\n", "[cluster]\ntls = true\n")
        node.config_path.write_text(text + f'[tls]\ncertfile = "{certificates.path(f"{certificate}.pem")}"\n'
                                    f'keyfile = "{certificates.path(f"{certificate}.key")}"\nport = {node.tls_port}\n'
                                    f'cacertfile = "{certificates.path("ca.pem")}"\n')
    observers = [cluster.observer, *(Observer(etcd_endpoint, name, group=group) for group in range(1, workers))]
    cluster.start()
    try:
        yield Nodes(cluster, observers)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
        for observer in observers[1:]:
            observer.close()


def port_not_given(cluster: Cluster, workers: int) -> int:
    """A free port that no node of the cluster was given yet (free_port() may give a port again before the node it
    went to listens on it)."""
    given = {port for node in cluster.nodes.values()
             for port in (node.port, node.management_port, node.prometheus_port, getattr(node, "tls_port", 0),
                          node.mqtt_port, node.mqtt_web_port,
                          *range(node.replication_port, node.replication_port + workers))}
    while (port := free_port()) in given:
        pass
    return port


def leaders(observers: list[Observer]) -> list[str] | None:
    """The node leading each group, once each has one and they are different nodes (leaders are spread)."""
    found = [observer.leader() for observer in observers]
    nodes = None if None in found else [leader[0] for leader in found]
    return nodes if nodes is not None and len(set(nodes)) == len(nodes) else None


def connect(cluster: Cluster, node: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", cluster.nodes[node].port, vhost, connection_attempts=50, retry_delay=0.2, socket_timeout=5))


def publish_confirmed(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def drained(connection: pika.BlockingConnection, queue: str) -> list[bytes]:
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append(got[2])
    return bodies


def api(cluster: Cluster, node: str, method: str, path: str, body: dict | None = None, user: str = "guest:guest",
        host: str | None = None):
    """(status, JSON or None) of a request to a node's management API (host: the Host header, if not its address)."""
    return cluster.nodes[node].api(method, path, body, user, host)


def api_ready(cluster: Cluster) -> None:
    """Wait until every node's API reaches every group."""
    for node in "abc":
        wait_for(lambda: api(cluster, node, "GET", "/api/vhosts")[0] == 200, 30, f"{node}'s API through every group")


def in_path(vhost: str) -> str:
    """A vhost's name as a segment of an API path ("/" is %2F)."""
    return quote(vhost, safe="")


def warrenctl(cluster: Cluster, node: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WARREN_MANAGEMENT_URL": f"http://127.0.0.1:{cluster.nodes[node].management_port}",
           "WARREN_MANAGEMENT_USER": "guest", "WARREN_MANAGEMENT_PASSWORD": "guest"}
    return subprocess.run([sys.executable, "-m", "warrenctl", *argv], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
