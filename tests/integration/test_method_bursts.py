"""A client that sends thousands of methods in one write (queue declares, binds and deletes without replies) holds
the broker's other clients a few milliseconds at a time: the frames of one read are processed for at most
broker.connection.connection.READ_SECONDS before the rest wait for the next loop turn (128 KiB of declares, the
most one read takes, held every other client 160 ms; 20,000 declares and as many deletes, 300 ms and more)."""

from __future__ import annotations

import pytest
from pamqp import commands

from protocol.codec import encode_method, make_method
from tests.integration.rawclient import RawClient
from tests.integration.test_large_settlements import ROUND_TRIP_BOUND, RoundTrips

COUNT = 20_000  # queues declared, bound and deleted
WRITE = 10_000  # methods a write holds


def in_writes(methods: list, channel: int = 1) -> list[bytes]:
    """The methods encoded on the channel, WRITE to a write (before the timing starts: encoding holds the GIL)."""
    return [b"".join(encode_method(channel, method) for method in methods[start:start + WRITE])
            for start in range(0, len(methods), WRITE)]


@pytest.mark.alone
def test_a_burst_of_declares_binds_and_deletes_holds_no_other_client(broker, unique):
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ")
    names = [f"{unique}-{number:05d}" for number in range(COUNT)]
    exchange = f"{unique}-x"
    writes = [*in_writes([make_method(commands.Queue.Declare, queue=name, nowait=True) for name in names]),
              *in_writes([make_method(commands.Queue.Bind, queue=name, exchange=exchange, routing_key=f"{name}.#",
                                      nowait=True) for name in names])]
    deletes = in_writes([make_method(commands.Queue.Delete, queue=name, nowait=True) for name in names], channel=2)
    with RawClient.connect(broker, timeout=60) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Exchange.Declare(exchange=exchange, exchange_type="topic"))
        client.expect(commands.Exchange.DeclareOk)
        round_trips = RoundTrips(broker)
        round_trips.start()
        try:
            for write in writes:
                client.send_raw(write)
            client.send(1, commands.Queue.Declare(queue=names[-1], passive=True))  # answered once all are made
            declared = client.expect(commands.Queue.DeclareOk, timeout=60)
            client.send(1, commands.Exchange.Delete(exchange=exchange, if_unused=True))
            client.expect_channel_error(1, 406, f"PRECONDITION_FAILED - exchange '{exchange}' in vhost '/' in use",
                                        40, 20)
            client.open_channel(2)
            for write in deletes:
                client.send_raw(write)
            client.send(2, commands.Exchange.Delete(exchange=exchange, if_unused=True))  # unused once all went
            client.expect(commands.Exchange.DeleteOk, timeout=60)
        finally:
            slowest = round_trips.stop()
    assert declared.queue == names[-1]
    assert slowest < ROUND_TRIP_BOUND, f"another client's slowest round trip: {slowest * 1000:.0f} ms"
