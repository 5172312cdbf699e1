"""Warren on several machines: coordination, replication, forwarding."""
