"""Warren beyond one machine: a leader and its followers, coordinated through etcd.

etcd decides who leads (a lease and a key created once), who may lead (the in-sync replica set, written only by
the leader in a transaction fenced on its lease) and who is a member; Warren itself moves the bytes.
coordinator.py holds the interface the rest of the cluster code speaks and an in-memory fake of it; etcd.py the
etcd implementation; state.py a data dir's identity and epoch; frames.py and replication.py the stream of the
store's writes from the leader to its followers; proxy.py the forwarding of a follower's AMQP clients to the leader;
node.py a node's roles; __main__.py the operator's commands (force-leader).
"""
