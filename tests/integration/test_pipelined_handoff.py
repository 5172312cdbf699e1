"""A client that pipelines its whole handshake (protocol header, start-ok, tune-ok and open in one write, without
waiting for the broker's frames) gets connection.start, connection.tune and connection.open-ok, in that order, as
from RabbitMQ; also when another worker process accepts it and hands it to the one that leads its vhost: what the
accepting worker owed the client must reach it before anything the leading worker writes."""

from __future__ import annotations

from pamqp import commands, frame

from tests.integration.rawclient import AMQP_0_9_1_HEADER, RawClient, plain_response
from tests.integration.test_workers import (  # noqa: F401 (workers: the fixture)
    LEADERS, holders, serving_worker, workers,
)
from tests.procfs import socket_links
from tests.waiting import wait_for

FRAME_MAX = 131072


def pipelined_handshake(vhost: str) -> bytes:
    """The whole handshake and a channel.open, as one write: nothing waits for the broker's answers."""
    return AMQP_0_9_1_HEADER + b"".join(frame.marshal(value, channel) for channel, value in (
        (0, commands.Connection.StartOk(client_properties={"product": "pipelining"}, mechanism="PLAIN",
                                        response=plain_response("guest", "guest"), locale="en_US")),
        (0, commands.Connection.TuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)),
        (0, commands.Connection.Open(virtual_host=vhost)),
        (1, commands.Channel.Open()),
    ))


def expect_the_whole_handshake(client: RawClient) -> None:
    client.expect(commands.Connection.Start, channel=0)
    client.expect(commands.Connection.Tune, channel=0)
    client.expect(commands.Connection.OpenOk, channel=0)
    client.expect(commands.Channel.OpenOk, channel=1)


def accepting_worker(broker, client: RawClient) -> int:
    """The worker that accepted the client's socket (before the client has sent a byte, so before any hand-off).
    The accept sends the client nothing it could wait for: the socket is looked for in the workers' fds (until a
    worker accepts it, the kernel lists it with no inode)."""
    port = client.sock.getsockname()[1]
    (number,) = wait_for(lambda: holders(broker, socket_links(broker.port, port)), 5,
                         "a worker accepting the connection", until=lambda found: len(found) == 1)
    return number


def test_a_pipelined_handshake_is_answered_whole_by_one_process(broker):
    for _ in range(5):
        with RawClient.connect(broker) as client:
            client.send_raw(pipelined_handshake("/"))
            expect_the_whole_handshake(client)
            client.close_connection()


def test_a_pipelined_handshake_handed_to_another_worker_gets_start_and_tune_first(workers):
    broker = workers()
    led_by = {worker: vhost for vhost, worker in LEADERS.items() if vhost != "v2"}  # 0: "/", 1: "v1"
    for _ in range(20):
        with RawClient.connect(broker) as client:
            # Every connection is handed over: it opens the vhost of the worker that did not accept it.
            accepter = accepting_worker(broker, client)
            client.send_raw(pipelined_handshake(led_by[1 - accepter]))
            expect_the_whole_handshake(client)
            assert serving_worker(broker, client) == 1 - accepter
            client.close_connection()
