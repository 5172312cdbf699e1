"""`--workers N`: a change of the node's vhosts that is refused (wrong credentials, a user without the administrator
tag, an import another worker refuses) changes no placement, whenever it comes: a PUT refused by worker 0 writes
none, and none forgets the placement of the administrator's request that made the vhost meanwhile."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pamqp import commands

from tests.integration.management import add_user, request
from tests.integration.rawclient import RawClient, plain_response
from tests.integration.test_workers import CONFIG, worker_pids
from tests.waiting import TIMER_GRAIN

REFUSING_CLIENTS = 16  # clients sending refused changes at once
REFUSED_AFTER = 200  # refused changes sent after the administrator's PUT was answered, at the least


def refused_put(broker, vhost: str, number: int) -> int:
    """A PUT of vhost that worker 0 refuses, by a wrong password or by a user without the administrator tag."""
    user, password = ("guest", "wrong") if number % 2 else ("mallory", "mallory")
    return request(broker, "PUT", f"/api/vhosts/{vhost}", user=user, password=password).status


def refused_change(broker, vhost: str, number: int) -> int:
    """A refused PUT of vhost, or an import of it that worker 0 accepts and worker 1 refuses: a binding to a queue
    that worker 1 alone holds (worker 0 skips it), with a wrong x-match."""
    if number % 3:
        return refused_put(broker, vhost, number)
    return request(broker, "POST", "/api/definitions", {"vhosts": [{"name": vhost}], "bindings": [
        {"source": "amq.headers", "vhost": "v1", "destination": "kept", "destination_type": "queue",
         "routing_key": "", "arguments": {"x-match": "bogus"}}]}).status


def accepted_by(broker, worker: int, vhost: str) -> RawClient:
    """A connection to vhost that worker accepted (the other one stopped until it has sent connection.start), as
    guest, with channel 1 open."""
    other = worker_pids(broker)[1 - worker]
    os.kill(other, signal.SIGSTOP)
    try:
        client = RawClient.connect(broker)
        client.send_protocol_header()
        client.expect(commands.Connection.Start, channel=0)
    finally:
        os.kill(other, signal.SIGCONT)
    client.send(0, commands.Connection.StartOk(mechanism="PLAIN", response=plain_response("guest", "guest"),
                                               locale="en_US"))
    tune = client.expect(commands.Connection.Tune, channel=0)
    client.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0),
                commands.Connection.Open(virtual_host=vhost))
    client.expect(commands.Connection.OpenOk, channel=0)
    client.open_channel(1)
    return client


def depth_after_publishing(client: RawClient, queue: str) -> int:
    """Publish one message to queue (declared if need be), then its depth as the client's connection sees it."""
    client.send(1, commands.Queue.Declare(queue=queue))
    client.expect(commands.Queue.DeclareOk, channel=1)
    client.publish(1, "", queue, b"one")
    client.send(1, commands.Queue.Declare(queue=queue, passive=True))
    return client.expect(commands.Queue.DeclareOk, channel=1).message_count


def test_refused_changes_of_a_vhost_write_no_placement_nor_take_an_administrators(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG + "\n[amqp]\nfailed_login_delay = 0\n")  # (the wrong passwords answered at once)
    broker = own_broker("--workers", "2", "--config", str(config))
    add_user(broker, "mallory", "mallory", tags="management")  # may log in, may not make vhosts
    assert request(broker, "PUT", "/api/queues/v1/kept", {"durable": True}).status == 201  # (on worker 1)
    placement = broker.data_dir / "workers" / "placement.json"
    before = placement.stat()
    with ThreadPoolExecutor(REFUSING_CLIENTS) as pool:  # refused alone: nothing is written
        assert set(pool.map(lambda number: refused_put(broker, "orders", number), range(64))) == {401}
    assert (placement.stat().st_ino, placement.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    made = threading.Event()
    first_refused = threading.Event()
    refused_after = iter(range(REFUSED_AFTER))  # (next() is atomic: each number is taken once)

    def refusing(client: int) -> list[int]:
        statuses = []
        number = client
        while not made.is_set() or next(refused_after, None) is not None:
            statuses.append(refused_change(broker, "orders", number))
            first_refused.set()
            number += REFUSING_CLIENTS
        return statuses

    with ThreadPoolExecutor(REFUSING_CLIENTS) as pool:  # refused before, during and after the administrator's
        refusals = [pool.submit(refusing, client) for client in range(REFUSING_CLIENTS)]
        assert first_refused.wait(10)
        try:
            assert request(broker, "PUT", "/api/vhosts/orders").status == 201
        finally:
            made.set()
        assert {status for refused in refusals for status in refused.result()} == {400, 401}
    assert json.loads(placement.read_text())["vhosts"]["orders"] == 1  # (worker 0 leads two vhosts, worker 1 one)
    # every connection to the vhost reaches one queue, whichever worker accepted it
    with accepted_by(broker, 0, "orders") as first, accepted_by(broker, 1, "orders") as second:
        assert depth_after_publishing(first, "depth") == 1
        assert depth_after_publishing(second, "depth") == 2
        assert depth_after_publishing(first, "depth") == 3


def test_a_put_of_a_vhost_refused_by_worker_0s_check_counts_as_a_refused_login(own_broker, tmp_path):
    delay = 0.3
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG + f"\n[amqp]\nfailed_login_delay = {delay}\n")
    broker = own_broker("--workers", "2", "--config", str(config))
    waits = []
    for _ in range(2):
        started = time.monotonic()
        assert refused_put(broker, "orders", 1) == 401
        waits.append(time.monotonic() - started)
    assert waits[0] < delay <= waits[1] + TIMER_GRAIN, waits
    assert broker.log().count("HTTP login refused from 127.0.0.1") == 2
