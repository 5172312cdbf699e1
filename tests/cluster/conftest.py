"""Fixtures of the cluster tests: an etcd to coordinate through (tests/cluster/etcd.py), and for the tests of what
crosses a network, etcd and the nodes a, b and c in network namespaces of their own (tests/cluster/netns.py)."""

import pytest

from tests.cluster.etcd import etcd_endpoint, etcd_prefix, etcd_server, own_etcd, started_etcd  # noqa: F401
from tests.cluster.netns import network_or_skip


@pytest.fixture
def network():
    """A private network of namespaces "etcd", "a", "b" and "c" (the test process on its bridge)."""
    yield from network_or_skip(["etcd", "a", "b", "c"])


@pytest.fixture
def etcd(network):
    """etcd in the "etcd" namespace of network."""
    yield from started_etcd(network.place("etcd"))
