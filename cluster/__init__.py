"""Warren beyond one process: a node runs replication groups, each coordinated through etcd in a cluster (or won by
walkover outside one). docs/architecture.md's code map says which module holds what.
"""
