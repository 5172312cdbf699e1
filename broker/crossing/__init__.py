"""Queues of one vhost owned by several processes of a node: the links between the process that serves a vhost's
clients and those that own some of its queues (docs/workers.md)."""
