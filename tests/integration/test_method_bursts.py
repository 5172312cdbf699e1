"""A client that sends thousands of costly frames in one write (publishes to a fanout exchange of 300 queues that
keep one message each) holds the broker's other clients a few milliseconds at a time: the frames of one read are
processed for at most broker.connection.connection.READ_SECONDS before the rest wait until the next loop turn has
written its replies (READ_BUDGET bounds a turn's bytes, not what they ask: other clients waited 583 to 1,004 ms here,
and 160 ms behind a read of queue.declare; 24 ms at the median and up to 73 ms while the rest went on ahead of those
replies, its time counted from the 32nd frame)."""

from __future__ import annotations

import pytest
from pamqp import body, commands, frame, header

from protocol.codec import encode_method, make_method
from tests.integration.rawclient import RawClient
from tests.round_trips import ROUND_TRIP_BOUND, RoundTrips, describe, slowest

QUEUES = 300  # bound to the fanout exchange: a publish enqueues a message in each
MESSAGES = 3_000  # published in one write
KEEP_ONE = {"x-max-length": 1}  # each queue's arguments: the messages do not pile up for the collector to walk


@pytest.mark.alone
def test_a_burst_of_costly_publishes_holds_no_other_client(broker, unique):
    if broker.external:
        pytest.skip("a bound of Warren's own, not measured against RabbitMQ")
    exchange = f"{unique}-x"
    one = b"".join(frame.marshal(value, 1) for value in (
        commands.Basic.Publish(exchange=exchange), header.ContentHeader(0, 16, commands.Basic.Properties()),
        body.ContentBody(b"x" * 16)))
    with RawClient.connect(broker, timeout=60) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Exchange.Declare(exchange=exchange, exchange_type="fanout"))
        client.expect(commands.Exchange.DeclareOk)
        client.send_raw(b"".join(encode_method(1, method) for number in range(QUEUES) for method in (
            make_method(commands.Queue.Declare, queue=f"{unique}-{number}", nowait=True, arguments=KEEP_ONE),
            make_method(commands.Queue.Bind, queue=f"{unique}-{number}", exchange=exchange, nowait=True))))
        client.send(1, commands.Basic.Qos(prefetch_count=0))  # answered once every queue is bound
        client.expect(commands.Basic.QosOk, timeout=60)
        round_trips = RoundTrips(broker)
        try:
            client.send_raw(one * MESSAGES)
            client.send(1, commands.Queue.Declare(queue=f"{unique}-{QUEUES - 1}", passive=True))
            counted = client.expect(commands.Queue.DeclareOk, timeout=60).message_count
        finally:
            times = round_trips.stop()
        for number in range(QUEUES):
            client.send(1, commands.Queue.Delete(queue=f"{unique}-{number}", nowait=True))
        client.send(1, commands.Exchange.Delete(exchange=exchange))
        client.expect(commands.Exchange.DeleteOk, timeout=60)
    assert counted == 1  # (every publish reached the last queue, which keeps the last)
    assert slowest(times) < ROUND_TRIP_BOUND, describe(times, broker.log())
