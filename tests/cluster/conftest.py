"""Fixtures of the cluster tests: an etcd to coordinate through (tests/cluster/etcd.py)."""

from tests.cluster.etcd import etcd_endpoint, etcd_prefix, etcd_server, own_etcd  # noqa: F401
