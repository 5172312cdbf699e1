"""`--workers N`: worker processes behind one AMQP port, each leading a share of the vhosts with a store of its own.

A connection is accepted by whichever worker the kernel wakes; once connection.open names a vhost another worker
leads, its socket is handed to that worker. These tests judge from outside: which worker's log grants the vhost,
what survives a restart, and what a kill -9 of one worker does to the clients of the others.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pika
import pytest
from pamqp import commands, frame

from tests.bench.workers import config_of
from tests.conftest import REPO_ROOT, free_port
from tests.integration.helpers import declare_queue, enqueue, wait_until
from tests.integration.management import add_user, add_vhost, request, set_permissions
from tests.integration.rawclient import RawClient, plain_response
from tests.integration.test_login_failures import refusal, start_ok
from tests.integration.test_warrenctl import ok
from tests.procfs import fd_links, socket_links
from tests.tls_certs import make_certificates
from tests.waiting import TIMER_GRAIN, wait_for

if os.environ.get("WARREN_TEST_URL"):
    pytest.skip("starts brokers of its own", allow_module_level=True)

VHOSTS = ("/", "v1", "v2")
# Placed in order of their names on the workers that lead fewest: "/" on 0, v1 on 1, v2 on 0.
LEADERS = {"/": 0, "v1": 1, "v2": 0}
CONFIG = config_of(list(VHOSTS))  # v1 and v2, with guest's permissions
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def workers(own_broker, tmp_path):
    """Start a broker of two workers."""
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG)

    def start(count: int = 2, data_dir: Path | None = None):
        return own_broker("--workers", str(count), "--config", str(config), data_dir=data_dir)

    return start


def url(broker, vhost: str) -> str:
    return f"amqp://guest:guest@{broker.host}:{broker.port}/{vhost.replace('/', '%2F')}"


def connect(broker, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url(broker, vhost)))


def worker_pids(broker) -> dict[int, int]:
    """Each serving worker's latest pid, from the supervisor's log."""
    return {int(number): int(pid) for number, pid in re.findall(r"worker (\d+) serves \(pid (\d+)\)", broker.log())}


def holders(broker, links: set[str]) -> set[int]:
    """The workers that hold a socket of those fd links (tests.procfs.socket_links)."""
    return {number for number, pid in worker_pids(broker).items() if fd_links(pid) & links}


def serving_worker(broker, client: RawClient) -> int:
    """The number of the worker process that holds the broker's end of the client's connection (once the worker
    that handed it over, if one did, has closed its copy)."""
    links = socket_links(broker.port, client.sock.getsockname()[1])
    (number,) = wait_for(lambda: holders(broker, links), 5, "one worker holding the connection",
                         until=lambda found: len(found) == 1)
    return number


def test_each_vhost_is_served_by_the_worker_that_leads_it(workers):
    broker = workers()
    placement = json.loads((broker.data_dir / "workers" / "placement.json").read_text())
    assert placement["vhosts"] == LEADERS
    served: dict[str, set[int]] = {vhost: set() for vhost in VHOSTS}
    for _ in range(6):  # whichever worker accepts each, a connection ends on the worker that leads its vhost
        for vhost in VHOSTS:
            with RawClient.connect(broker) as client:
                client.handshake(vhost=vhost)
                client.open_channel(1)
                served[vhost].add(serving_worker(broker, client))
    assert served == {vhost: {worker} for vhost, worker in LEADERS.items()}
    for vhost in VHOSTS:  # and works there
        with connect(broker, vhost) as conn:
            channel = conn.channel()
            channel.queue_declare("q", exclusive=True)
            channel.basic_publish("", "q", vhost.encode())
            assert channel.basic_get("q", auto_ack=True)[2] == vhost.encode()


def test_frames_sent_behind_connection_open_follow_the_socket_to_its_worker(workers, unique):
    broker = workers()
    for _ in range(6):
        with RawClient.connect(broker) as client:
            client.send_protocol_header()
            client.expect(commands.Connection.Start, channel=0)
            client.send(0, commands.Connection.StartOk(mechanism="PLAIN", response=plain_response("guest", "guest"),
                                                       locale="en_US"))
            tune = client.expect(commands.Connection.Tune, channel=0)
            client.send_raw(b"".join(frame.marshal(value, channel) for channel, value in (
                (0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0)),
                (0, commands.Connection.Open(virtual_host="v1")),
                (1, commands.Channel.Open()),
                (1, commands.Queue.Declare(queue=unique, exclusive=True)))))
            client.expect(commands.Connection.OpenOk, channel=0)
            client.expect(commands.Channel.OpenOk, channel=1)
            assert client.expect(commands.Queue.DeclareOk, channel=1).queue == unique
            assert serving_worker(broker, client) == 1


def test_amqps_connections_reach_the_worker_that_leads_their_vhost(own_broker, tmp_path):
    certificates = make_certificates(tmp_path / "certs")
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG + f"""
[tls]
certfile = "{certificates.path("server.pem")}"
keyfile = "{certificates.path("server.key")}"
""")
    port = free_port()
    broker = own_broker("--workers", "2", "--config", str(config), "--tls-port", str(port))
    tls = pika.SSLOptions(ssl.create_default_context(cafile=certificates.path("ca.pem")), "localhost")
    body = bytes(range(256)) * 1000  # through the worker that keeps the TLS session, whichever accepted it
    for round_ in range(6):
        for vhost in ("/", "v1"):  # led by worker 0 and worker 1: whichever accepts, some are handed over
            parameters = pika.ConnectionParameters("127.0.0.1", port, vhost, ssl_options=tls)
            with pika.BlockingConnection(parameters) as conn:
                channel = conn.channel()
                channel.queue_declare(f"tls-{round_}", exclusive=True)
                channel.basic_publish("", f"tls-{round_}", body)
                assert channel.basic_get(f"tls-{round_}", auto_ack=True)[2] == body
                listed = request(broker, "GET", "/api/connections?columns=vhost,ssl").body
                assert listed == [{"vhost": vhost, "ssl": True}]


def test_a_vhost_keeps_its_worker_and_its_messages_across_restarts(workers):
    broker = workers()
    for vhost in VHOSTS:
        with connect(broker, vhost) as conn:
            declare_queue(conn.channel(), "kept", durable=True)
            enqueue(conn, "kept", [f"in {vhost}".encode()], properties=PERSISTENT)
    broker.restart()
    for vhost in VHOSTS:
        with connect(broker, vhost) as conn:
            _, _, body = conn.channel().basic_get("kept", auto_ack=True)
            assert body == f"in {vhost}".encode()
    assert (broker.data_dir / "workers" / "1").is_dir()  # v1's store


def test_a_vhost_made_through_the_api_goes_to_the_worker_that_leads_fewest(workers):
    broker = workers()
    add_vhost(broker, "v3")
    set_permissions(broker, "v3", "guest")
    placement = json.loads((broker.data_dir / "workers" / "placement.json").read_text())["vhosts"]
    assert placement["v3"] == 1  # worker 0 leads / and v2, worker 1 leads v1
    with RawClient.connect(broker) as client:
        client.handshake(vhost="v3")
        assert serving_worker(broker, client) == 1
    for vhost in ("%2F", "v3"):
        assert request(broker, "PUT", f"/api/queues/{vhost}/listed", {"durable": True}).status == 201
    listed = request(broker, "GET", "/api/queues?columns=vhost,name").body
    assert [(queue["vhost"], queue["name"]) for queue in listed] == [("/", "listed"), ("v3", "listed")]
    page = request(broker, "GET", "/api/queues?page=1&page_size=1&name=listed").body
    assert (page["filtered_count"], page["page_count"], page["items"][0]["vhost"]) == (2, 2, "/")
    assert request(broker, "GET", "/api/overview").body["object_totals"]["queues"] == 2
    queues = request(broker, "GET", "/api/queues?columns=vhost,node").body
    host = socket.gethostname().split(".")[0]
    assert queues == [{"vhost": "/", "node": f"warren-0@{host}"}, {"vhost": "v3", "node": f"warren-1@{host}"}]
    nodes = [node["name"] for node in request(broker, "GET", "/api/nodes").body]
    assert nodes == [f"warren-0@{host}", f"warren-1@{host}"]  # a node per worker
    assert request(broker, "GET", f"/api/nodes/warren-1@{host}").body["name"] == f"warren-1@{host}"
    vhosts = request(broker, "GET", "/api/vhosts?columns=name").body
    assert [vhost["name"] for vhost in vhosts] == ["/", "v1", "v2", "v3"]  # each once, from the worker leading it
    assert request(broker, "DELETE", "/api/vhosts/v3").status == 204
    assert "v3" not in json.loads((broker.data_dir / "workers" / "placement.json").read_text())["vhosts"]


def test_each_worker_watches_its_share_of_the_memory_limit(own_broker, tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("[server]\nmemory_limit = 1000000000\n")
    broker = own_broker("--workers", "2", "--config", str(config))
    assert [node["mem_limit"] for node in request(broker, "GET", "/api/nodes").body] == [500_000_000] * 2


def test_a_user_made_through_the_api_logs_in_on_a_worker_started_again(workers):
    broker = workers()
    add_user(broker, "alice", "secret")
    set_permissions(broker, "v1", "alice")
    killed = worker_pids(broker)[1]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: worker_pids(broker).get(1) != killed, what="worker 1 started again")
    with RawClient.connect(broker) as client:  # (the supervisor says it serves once every worker knows it)
        client.handshake(username="alice", password="secret", vhost="v1")
        assert serving_worker(broker, client) == 1
    assert request(broker, "DELETE", "/api/users/alice").status == 204
    with RawClient.connect(broker) as client:  # refused whichever worker accepts
        client.send_protocol_header()
        client.expect(commands.Connection.Start, channel=0)
        client.send(0, commands.Connection.StartOk(mechanism="PLAIN", response=plain_response("alice", "secret"),
                                                   locale="en_US"))
        client.expect_closed()


def test_refused_logins_slow_down_for_the_whole_node_whichever_worker_refuses_them(own_broker, tmp_path):
    """An address's refused logins are counted once for the node: AMQP ones whichever worker accepted them (the
    other one stopped meanwhile, so that it accepts nothing), API ones whichever worker a request goes to (a listing
    asks every worker, and is counted and logged once)."""
    delay = 0.5
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG + f"\n[amqp]\nfailed_login_delay = {delay}\n")
    broker = own_broker("--workers", "2", "--config", str(config))
    pids = worker_pids(broker)
    waits = []
    for refusing in (1, 1, 0):
        os.kill(pids[1 - refusing], signal.SIGSTOP)
        try:
            with RawClient.connect(broker, timeout=15) as client:
                sent = start_ok(client, plain_response("guest", "wrong"))
                assert refusal(client) == "ACCESS_REFUSED"
                waits.append(time.monotonic() - sent)
        finally:
            os.kill(pids[1 - refusing], signal.SIGCONT)
    assert waits[1] + TIMER_GRAIN >= delay and waits[2] + TIMER_GRAIN >= 2 * delay, waits  # (the first: at once)
    waits = []
    for path in ("/api/queues", "/api/whoami", "/api/queues/v1"):  # every worker, then worker 0, then worker 1
        started = time.monotonic()
        assert request(broker, "GET", path, password="wrong").status == 401
        waits.append(time.monotonic() - started)
    assert waits[0] < delay <= waits[1] + TIMER_GRAIN < 2 * delay <= waits[2] + TIMER_GRAIN, waits  # counted twice, whoami would wait 2 d
    assert broker.log().count("HTTP login refused from 127.0.0.1") == 3  # (the listing's too, once)


def test_the_vhosts_of_a_worker_that_cannot_start_again_are_down_until_it_serves(workers):
    broker = workers()
    killed = worker_pids(broker)[1]
    os.kill(killed, signal.SIGKILL)
    # Its store's lock, taken before the supervisor starts it again (a second after its death): its start is refused
    lock = os.open(broker.data_dir / "workers" / "1" / ".lock", os.O_RDWR)
    try:
        wait_for(lambda: try_lock(lock), 1, "worker 1's store lock free")
        wait_for(lambda: "worker 1 could not start: data dir" in broker.log(), what="worker 1 refused")
        with RawClient.connect(broker) as client:
            client.handshake(vhost="v1", open_connection=False)
            client.send(0, commands.Connection.Open(virtual_host="v1"))
            close = client.expect(commands.Connection.Close, channel=0)
            assert (close.reply_code, close.reply_text) == (541, "INTERNAL_ERROR - access to vhost 'v1' refused for "
                                                                 "user 'guest': vhost 'v1' is down")
        with connect(broker, "v2") as conn:  # worker 0's vhosts are up
            assert conn.channel().queue_declare("", exclusive=True).method.queue
    finally:
        os.close(lock)
    wait_for(lambda: worker_pids(broker).get(1) not in (None, killed), what="worker 1 started again")
    with RawClient.connect(broker) as client:
        client.handshake(vhost="v1")
        assert serving_worker(broker, client) == 1


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def test_an_import_is_checked_by_every_worker_before_any_applies_it(workers):
    broker = workers()
    reply = request(broker, "POST", "/api/definitions", {
        "users": [{"name": "bob", "password": "pw", "tags": ""}],
        "queues": [{"name": "bad", "vhost": "v1", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": "many"}}]})
    assert reply.status == 400 and "bad" in reply.body["reason"]
    assert request(broker, "GET", "/api/users/bob").status == 404  # not made on worker 0 either
    reply = request(broker, "POST", "/api/definitions", {
        "vhosts": [{"name": "never"}], "queues": [{"name": "bad", "vhost": "never", "arguments": {"x-max-length": "x"}}]})
    assert reply.status == 400
    assert request(broker, "PUT", f"/api/vhosts/{'v' * 300}").status == 400
    placement = json.loads((broker.data_dir / "workers" / "placement.json").read_text())["vhosts"]
    assert set(placement) == set(LEADERS)  # what was refused was not placed either


def test_a_data_dir_of_one_process_keeps_its_vhosts_on_the_first_worker(workers, own_broker, tmp_path):
    data_dir = tmp_path / "data"
    single = own_broker("--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0", data_dir=data_dir)
    with connect(single, "/") as conn:
        declare_queue(conn.channel(), "before", durable=True)
        enqueue(conn, "before", [b"from one process"], properties=PERSISTENT)
    single.stop()
    broker = workers(data_dir=data_dir)
    with connect(broker, "/") as conn:
        _, _, body = conn.channel().basic_get("before", auto_ack=True)
        assert body == b"from one process"
    placement = json.loads((data_dir / "workers" / "placement.json").read_text())["vhosts"]
    assert placement["/"] == 0 and {placement["v1"], placement["v2"]} == {0, 1}


def test_fewer_workers_than_the_placement_needs_or_a_pin_it_contradicts_is_refused_with_the_reason(workers, tmp_path):
    broker = workers()
    broker.stop()
    broker.extra_args[1] = "1"  # --workers 1 would leave v1's store unread
    with pytest.raises(RuntimeError):
        broker.start()
    assert "vhost 'v1' lives in the store of worker 1, but there are only 1 workers" in broker.log()
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(CONFIG.replace('name = "v1"\n', 'name = "v1"\nworker = 0\n'))
    broker.extra_args[1:] = ["2", "--config", str(pinned)]
    with pytest.raises(RuntimeError):
        broker.start()
    assert "vhost 'v1' is pinned to worker 0 ([[vhosts]] worker), but it lives in the store of worker 1" in broker.log()
    pinned.write_text(CONFIG.replace('name = "v1"\n', 'name = "v1"\nworker = 1\n'))  # where it is: fine
    broker.start()
    with connect(broker, "v1") as conn:
        assert conn.channel().queue_declare("", exclusive=True).method.queue


class ConfirmedPublisher(threading.Thread):
    """Publishes persistent messages one by one with confirms, reconnecting after an error; records the ids the
    broker confirmed, each confirm's latency, and every time its connection was lost."""

    def __init__(self, broker, vhost: str, queue: str, stop: threading.Event, arguments: dict | None = None):
        super().__init__(daemon=True)
        self.broker, self.vhost, self.queue, self.stop = broker, vhost, queue, stop
        self.arguments = arguments  # the queue's, as it declares it
        self.confirmed: list[int] = []
        self.latencies: list[float] = []
        self.lost = 0  # connections lost
        self.error: BaseException | None = None

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            try:
                with connect(self.broker, self.vhost) as conn:
                    channel = conn.channel()
                    channel.confirm_delivery()
                    channel.queue_declare(self.queue, durable=True, arguments=self.arguments)
                    while not self.stop.is_set():
                        number += 1
                        started = time.perf_counter()
                        channel.basic_publish("", self.queue, str(number).encode(),
                                              PERSISTENT)
                        self.latencies.append(time.perf_counter() - started)
                        self.confirmed.append(number)
            except pika.exceptions.AMQPError:
                self.lost += 1
                time.sleep(0.05)
            except BaseException as error:  # reported by the test
                self.error = error
                return


def drain(broker, vhost: str, queue: str) -> list[int]:
    with connect(broker, vhost) as conn:
        channel = conn.channel()
        found = []
        while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
            found.append(int(got[2]))
        return found


@pytest.mark.alone
def test_a_killed_worker_costs_the_other_vhosts_nothing_and_loses_nothing_confirmed(workers):
    broker = workers()
    stop = threading.Event()
    survivor = ConfirmedPublisher(broker, "/", "load", stop)  # on worker 0
    victim = ConfirmedPublisher(broker, "v1", "load", stop)  # on worker 1
    survivor.start()
    victim.start()
    wait_for(lambda: len(victim.confirmed) > 200 and len(survivor.confirmed) > 200, what="both publishing")
    killed = worker_pids(broker)[1]
    before = len(survivor.latencies)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: victim.lost >= 1, what="the victim's connection lost")
    after_the_kill(broker, killed, survivor, victim, stop, before, p99_limit=0.050)


def after_the_kill(broker, killed: int, survivor: ConfirmedPublisher, victim: ConfirmedPublisher,
                   stop: threading.Event, before: int, p99_limit: float) -> None:
    """Once worker 1 (pid killed) serves again and the victim's publishes are confirmed again, both stop: the
    survivor kept its connection and its confirms under p99_limit seconds from its before-th on, and no confirmed
    message of either is lost."""
    wait_for(lambda: worker_pids(broker)[1] != killed, what="worker 1 started again")
    confirmed_at_restart = len(victim.confirmed)
    wait_for(lambda: len(victim.confirmed) > confirmed_at_restart + 100, what="the victim publishing again")
    stop.set()
    survivor.join(10)
    victim.join(10)
    assert survivor.error is None and victim.error is None
    assert survivor.lost == 0  # its connection never closed
    during = sorted(survivor.latencies[before:])
    p99 = during[int(len(during) * 0.99)]
    print(f"survivor: {len(during)} confirms while worker 1 died and came back, p50 "
          f"{statistics.median(during) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms")
    assert p99 < p99_limit
    for publisher in (survivor, victim):
        found = set(drain(broker, publisher.vhost, publisher.queue))
        missing = set(publisher.confirmed) - found
        assert not missing, f"{len(missing)} confirmed messages lost in {publisher.queue} of {publisher.vhost}"


def test_a_vhost_moves_to_another_worker_with_what_a_restart_keeps(own_broker, tmp_path):
    """PUT /api/vhosts/{vhost}/group (warrenctl move_vhost) moves a vhost's durable state to another worker's group:
    the two workers stop and start again, the third one's clients notice nothing, and the vhost comes back whole
    on the worker named, as after a restart."""
    config = tmp_path / "warren.toml"
    config.write_text(config_of(["/", "v1", "v2"]) + '[[vhosts]]\nname = "pinned"\nworker = 1\n')
    broker = own_broker("--workers", "3", "--config", str(config))
    host = socket.gethostname().split(".")[0]
    # placed in order of their names: "/" on worker 0, "pinned" on 1, v1 on 2 (the one leading fewest), v2 on 0
    # (its group's leader: this node, the only one that can lead it)
    assert request(broker, "GET", "/api/vhosts/v1/leader").body == {"vhost": "v1", "group": 2, "node": "warren",
                                                                    "pinned": "warren"}
    with connect(broker, "v1") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.queue_declare("kept", durable=True)
        channel.queue_bind("kept", "orders", "new.*")
        channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
        for number in range(3):
            channel.basic_publish("orders", "new.order", f"order {number}".encode(),
                                  PERSISTENT)
            channel.basic_publish("", "log", f"entry {number}".encode(), PERSISTENT)
        channel.basic_publish("", "kept", b"transient", pika.BasicProperties(delivery_mode=1))
        channel.exchange_declare("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        channel.queue_declare("due", durable=True)
        channel.queue_bind("due", "later", "due")
        channel.basic_publish("later", "due", b"due after the move", pika.BasicProperties(
            delivery_mode=2, headers={"x-delay": 8000}))  # waiting in the exchange while the vhost moves
        delivered, _, _ = channel.basic_get("kept")  # order 0, given back: it comes back redelivered
        channel.basic_nack(delivered.delivery_tag, requeue=True)
    assert request(broker, "PUT", "/api/policies/v1/short", {"pattern": "^kept$", "definition": {"max-length": 10},
                                                            "apply-to": "queues"}).status == 201
    staying = connect(broker, "/")  # worker 0's: it takes no part in the move
    staying_channel = staying.channel()
    staying_channel.confirm_delivery()
    moved = connect(broker, "v1")

    assert request(broker, "PUT", "/api/vhosts/v1/group", {"group": 3}) == (400, {
        "error": "bad_request", "reason": "there is no group 3: this node runs 3 workers, groups 0 to 2"})
    assert request(broker, "PUT", "/api/vhosts/v1/group", {"group": "1"}).body["reason"] == (
        "group must be a number, got '1'")
    assert request(broker, "PUT", "/api/vhosts/pinned/group", {"group": 0}).body["reason"] == (
        "vhost 'pinned' is pinned to group 1 by the config ([[vhosts]] worker): change the pin to move it")
    assert request(broker, "PUT", "/api/vhosts/v1/leader", {"node": "nobody"}).body["reason"] == (
        "node 'nobody' is not a member of the cluster now (members: warren)")  # (leading, not moving: one node)
    assert request(broker, "GET", "/api/queues/v1/due").body["messages"] == 0  # not due yet
    assert ok(broker, "move_vhost", "1", "-p", "v1") == 'Moving vhost "v1" to group 1 ...\n'
    assert request(broker, "GET", "/api/vhosts/v1/leader").body["group"] == 1
    with pytest.raises(pika.exceptions.AMQPError):  # its worker stopped: the client connects again
        moved.channel().queue_declare("kept", passive=True)
    staying_channel.queue_declare("still here", durable=True)  # the same connection as before the move
    staying_channel.basic_publish("", "still here", b"hello", PERSISTENT)
    staying.close()

    with connect(broker, "v1") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        kept = request(broker, "GET", "/api/queues/v1/kept").body
        assert (kept["node"], kept["messages"], kept["policy"]) == (f"warren-1@{host}", 3, "short")  # not transient
        gets = [channel.basic_get("kept") for _ in range(3)]
        assert [(body, method.redelivered) for method, _, body in gets] == [
            (b"order 0", True), (b"order 1", False), (b"order 2", False)]
        channel.basic_publish("orders", "new.order", b"after the move", PERSISTENT)
        assert stream_of(channel, "log") == [b"entry 0", b"entry 1", b"entry 2"]
        wait_for(lambda: channel.queue_declare("due", passive=True).method.message_count == 1, 20,
                 "the delayed message routed once due")
    broker.restart()  # (the three gets were not acked: they come back, redelivered)
    assert not (broker.data_dir / "workers" / "moving.json").exists()
    with connect(broker, "v1") as conn:
        channel = conn.channel()
        gets = [channel.basic_get("kept", auto_ack=True) for _ in range(5)]
        assert [(body, method.redelivered) for method, _, body in gets[:4]] == [
            (b"order 0", True), (b"order 1", True), (b"order 2", True), (b"after the move", False)]
        assert gets[4][0] is None
        assert stream_of(channel, "log") == [b"entry 0", b"entry 1", b"entry 2"]
    with connect(broker, "/") as conn:
        assert conn.channel().basic_get("still here", auto_ack=True)[2] == b"hello"


def stream_of(channel, stream: str) -> list[bytes]:
    """Every message of a stream, read from its first offset."""
    bodies: list[bytes] = []
    channel.basic_qos(prefetch_count=100)
    tag = channel.basic_consume(stream, lambda ch, method, properties, body: bodies.append(body),
                                arguments={"x-stream-offset": "first"})
    wait_until(channel.connection, lambda: len(bodies) >= 3, 10)
    channel.basic_cancel(tag)
    return bodies


def test_a_move_a_stop_interrupted_is_finished_at_the_next_start(workers):
    broker = workers(3)  # "/" on worker 0, v1 on 1, v2 on 2
    with connect(broker, "v1") as conn:
        declare_queue(conn.channel(), "kept", durable=True)
        enqueue(conn, "kept", [b"hello"], properties=PERSISTENT)
    broker.stop()
    journal = broker.data_dir / "workers" / "moving.json"  # as a move to worker 2 leaves it before its first copy
    journal.write_text(json.dumps({"vhost": "v1", "from": 1, "to": 2}))
    broker.start()
    assert not journal.exists()
    assert request(broker, "GET", "/api/vhosts/v1/leader").body["group"] == 2
    with connect(broker, "v1") as conn:
        assert conn.channel().basic_get("kept", auto_ack=True)[2] == b"hello"
    assert "moved from worker 1 to worker 2" in broker.log()


def test_a_shovel_and_a_federation_link_run_once_in_the_worker_of_their_vhost(workers):
    """v1 is led by worker 1: its shovel and its federation link run there alone, and the API that merges every
    worker's answers lists each once."""
    broker = workers()
    for path, body in (
            ("/api/parameters/shovel/v1/move", {"value": {
                "src-uri": "amqp:///v1", "src-queue": "from", "dest-uri": "amqp:///v1", "dest-queue": "to"}}),
            ("/api/parameters/federation-upstream/v1/self", {"value": {"uri": "amqp:///v1", "exchange": "up"}}),
            ("/api/policies/v1/federated", {"pattern": "^down$", "apply-to": "exchanges",
                                            "definition": {"federation-upstream": "self"}})):
        assert request(broker, "PUT", path, body).status == 201, path
    with connect(broker, "v1") as conn:
        channel = conn.channel()
        channel.exchange_declare("up", "fanout")
        channel.exchange_declare("down", "fanout")
        declare_queue(channel, "federated")
        channel.queue_bind("federated", "down")
        declare_queue(channel, "from", durable=True)
        declare_queue(channel, "to", durable=True)
        wait_for(lambda: [link["status"] for link in request(broker, "GET", "/api/federation-links").body], 30,
                 "the federation link listed once, running", until=lambda states: states == ["running"])
        wait_for(lambda: request(broker, "GET", "/api/exchanges/v1/up/bindings/source").body, 30,
                 "the binding mirrored")
        channel.basic_publish("", "from", b"shovelled")
        channel.basic_publish("up", "", b"federated")
        for queue in ("to", "federated"):
            wait_for(lambda: channel.queue_declare(queue, passive=True).method.message_count, 30,
                     f"a message in {queue}", until=lambda count: count == 1)
    shovels = request(broker, "GET", "/api/shovels").body
    assert [(shovel["name"], shovel["state"]) for shovel in shovels] == [("move", "running")]
    assert "shovel 'move' in vhost 'v1'" not in broker.log()  # (it never failed, on either worker)


# Run as `python -c TAKE_TERMINAL -m broker ...` in a session of its own whose standard input is a terminal: makes
# that terminal the session's (its process group in the foreground), then runs the rest of the command line.
TAKE_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                 "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def test_workers_started_in_a_terminal_that_stops_background_writers_log_to_it_and_serve(tmp_path):
    """A node started from a terminal set with `stty tostop`, where a process in the background that writes to it is
    stopped: its workers, each in a process group of its own within the supervisor's session, behind the supervisor in
    the foreground, log to it and serve."""
    terminal, its_end = pty.openpty()
    modes = termios.tcgetattr(its_end)
    modes[3] |= termios.TOSTOP
    termios.tcsetattr(its_end, termios.TCSANOW, modes)
    port = free_port()
    config = tmp_path / "warren.toml"
    config.write_text(CONFIG)
    command = [sys.executable, "-c", TAKE_TERMINAL, "-m", "broker", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(tmp_path / "data"), "--log-level", "info", "--management-port", str(free_port()),
               "--prometheus-port", str(free_port()), "--mqtt-port", str(free_port()), "--workers", "2",
               "--config", str(config)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=its_end, stdout=its_end, stderr=its_end,
                               start_new_session=True)
    os.close(its_end)
    shown: list[bytes] = []  # what the terminal showed (read on, so that no writer waits for room)

    def show() -> None:
        while True:
            try:
                data = os.read(terminal, 65536)
            except OSError:  # (EIO: every process of the session has closed it)
                return
            if not data:
                return
            shown.append(data)

    node = SimpleNamespace(host="127.0.0.1", port=port, log=lambda: b"".join(shown).decode(errors="replace"))
    reader = threading.Thread(target=show, daemon=True)
    reader.start()
    try:
        wait_for(lambda: "with 2 worker processes" in node.log() or process.poll() is not None, 30,
                 "the node listening with its two workers")
        text = node.log()
        assert process.poll() is None, text
        assert "INFO worker 0 " in text and "INFO worker 1 " in text, text
        workers = worker_pids(node)
        assert sorted(workers) == [0, 1], text
        # each in a process group of its own (Ctrl-C goes to the supervisor's), in the supervisor's session (the
        # scheduler's group: docs/workers.md)
        assert ([(os.getpgid(pid), os.getsid(pid)) for pid in workers.values()]
                == [(pid, process.pid) for pid in workers.values()])
        for vhost in ("/", "v1"):  # one on each worker (LEADERS)
            connection = connect(node, vhost)
            try:
                declare_queue(connection.channel())
            finally:
                connection.close()
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:  # (a stopped worker outlasts its stop: the node is killed, they with it)
            process.kill()
            process.wait()
        reader.join(10)
        os.close(terminal)
