"""A client that asks for large replies and never reads them: basic.get + basic.recover pairs on a 1 MiB message.
The broker stops reading that client once its unread output passes a bound, so the broker's memory stays flat
(before, each get-ok queued another copy of the message: 26 KB of requests took it from 34 MB to 871 MB), and
other clients are served meanwhile."""

from __future__ import annotations

from pathlib import Path

from pamqp import commands, frame

from tests.integration.rawclient import RawClient

MESSAGE = 1024 * 1024
PAIRS_PER_ROUND = 100  # get/recover pairs sent between two memory checks
ROUNDS = 30
RSS_BOUND = 100 * 1024 * 1024  # growth of the broker's resident memory allowed over the whole run


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def round_trip(client: RawClient, queue: str) -> None:
    client.send(1, commands.Queue.Declare(queue=queue, passive=True))
    client.expect(commands.Queue.DeclareOk, channel=1, timeout=10)


def test_a_client_that_never_reads_its_replies_cannot_grow_the_broker(own_broker, unique):
    broker = own_broker()
    pid = broker.process.pid
    with RawClient.connect(broker) as greedy, RawClient.connect(broker) as other:
        for client in (greedy, other):
            client.handshake()
            client.open_channel(1)
        greedy.send(1, commands.Queue.Declare(queue=unique))
        greedy.expect(commands.Queue.DeclareOk, channel=1)
        greedy.publish(1, "", unique, b"m" * MESSAGE)
        round_trip(other, unique)
        baseline = resident_bytes(pid)
        pair = b"".join(frame.marshal(method, 1) for method in (commands.Basic.Get(queue=unique),
                                                                 commands.Basic.Recover(requeue=True)))
        greedy.sock.settimeout(1.0)
        sent = 0
        for _ in range(ROUNDS):
            try:
                greedy.sock.sendall(pair * PAIRS_PER_ROUND)
            except TimeoutError:  # the broker stopped reading us: the rest of this round never goes out
                break
            sent += PAIRS_PER_ROUND
            round_trip(other, unique)  # served meanwhile, and a point where the broker has handled what it read
            growth = resident_bytes(pid) - baseline
            assert growth < RSS_BOUND, f"broker grew by {growth >> 20} MiB after {sent} get/recover pairs"
        round_trip(other, unique)
        growth = resident_bytes(pid) - baseline
        assert growth < RSS_BOUND, f"broker grew by {growth >> 20} MiB after {sent} get/recover pairs"
        assert sent >= PAIRS_PER_ROUND  # at least one round went out (and thousands fit in the socket buffers)
