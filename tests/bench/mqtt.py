"""Compare Warren's MQTT with RabbitMQ's (the rabbitmq_mqtt plugin), in one run, with the same clients.

    python -m tests.bench.mqtt [--messages N | --seconds S] [--scenario NAME ...] [--connections K] [--no-rabbitmq]

Starts Warren and a throwaway RabbitMQ (tools/rabbitmq-ref --mqtt) on free loopback ports and runs each scenario
against both, as tests.bench.compare does: brokers alternated W R R W and each broker's two figures averaged (the
idle connections once each, first, on fresh brokers), then prints both figures and the ratio Warren / RabbitMQ.

- idle: K MQTT 3.1.1 connections (raw sockets, a hand-written CONNECT, keepalive 60) opened from a few client
  processes and left idle; the broker's resident memory (VmRSS) before and after, in KiB per connection, and its
  CPU time per connection opened.
- qos0: a publisher process (paho-mqtt) publishes 16-byte messages at QoS 0 to a topic as fast as paho allows; a
  subscriber process, subscribed at QoS 0, counts them until it has them all (or none came for a while, or the run's
  time is up). Messages received per second, from the publisher's start to the last message received.
- qos1: the same at QoS 1: the publisher keeps a window of unacknowledged publishes (paho's max_inflight_messages),
  the subscriber is subscribed at QoS 1 (paho acknowledges each message).

Every rate comes with the broker's CPU time (its process and children, from /proc) per message received.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import multiprocessing
import os
import resource
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import paho.mqtt.client as mqtt

from tests.bench.brokers import BrokerUnavailable, RunningBroker, _tail, start_rabbitmq, start_warren
from tests.bench.compare import CPU_PER_MESSAGE, BenchRun, Row, _mean, print_table
from tests.conftest import free_port
from tests.waiting import wait_for
from warrenperf.process_memory import cpu_seconds, resident_kib

HOST = "127.0.0.1"
USER = PASSWORD = "guest"  # both brokers' default user, allowed from loopback
KEEPALIVE = 60  # seconds, of every connection
MQTT_READY_SECONDS = 60  # for a started broker's MQTT listener to answer a CONNECT
CLIENT_READY_SECONDS = 60  # for a client process to connect (and subscribe)
QUIET_SECONDS = 5.0  # the subscriber stops counting once nothing came for this long after the publisher finished
TICK = 0.05  # how often the subscriber's count is looked at once the publisher has finished
IDLE_PROCESSES = 4  # client processes holding the idle connections
OPEN_AT_ONCE = 25  # CONNECTs each of them sends before reading their CONNACKs (4 x 25: below a listen backlog of 100)
FD_MARGIN = 256  # file descriptors a broker or client process needs beside its connections
PING_EVERY = 30.0  # an idle connection's PINGREQ, well within its keepalive
SETTLE_SECONDS = 2.0  # after the last CONNACK, before reading the broker's memory
CONNECT_SECONDS = 30.0  # for one raw connection's TCP connect and CONNACK
JOIN_SECONDS = 15.0  # for a client process to end once told to
QUIET_CPU = 0.1  # a broker using less of a core than this has done with closed connections...
QUIET_WAIT_SECONDS = 60.0  # ...waited for this long at most, after the idle connections, before the next run

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
PINGREQ, PINGRESP, DISCONNECT = b"\xc0\x00", b"\xd0\x00", b"\xe0\x00"

_names = itertools.count()  # numbers the topics and client ids of a run


@dataclass
class MqttBroker:
    broker: RunningBroker
    mqtt_port: int

    @property
    def name(self) -> str:
        return self.broker.name


# --- raw MQTT 3.1.1, for the idle connections -----------------------------------------------------------------------

def _remaining_length(length: int) -> bytes:
    encoded = bytearray()
    while True:
        length, digit = divmod(length, 128)
        encoded.append(digit | (0x80 if length else 0))
        if not length:
            return bytes(encoded)


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("!H", len(data)) + data


def connect_packet(client_id: str, keepalive: int = KEEPALIVE) -> bytes:
    """CONNECT, MQTT 3.1.1, clean session, with the user name and password."""
    flags = 0x80 | 0x40 | 0x02  # user name, password, clean session
    body = _string("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive) \
        + _string(client_id) + _string(USER) + _string(PASSWORD)
    return b"\x10" + _remaining_length(len(body)) + body


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed by the broker after {data!r}")
        data += chunk
    return data


def _expect(sock: socket.socket, packet: bytes, what: str) -> None:
    answer = _read_exactly(sock, len(packet))
    if answer != packet:
        raise ConnectionError(f"{what}: expected {packet.hex()}, got {answer.hex()}")


def open_raw(port: int, client_id: str) -> socket.socket:
    """A connection that got its CONNACK (accepted), its socket's operations time-limited."""
    sock = socket.create_connection((HOST, port), timeout=CONNECT_SECONDS)
    try:
        sock.sendall(connect_packet(client_id))
        _expect(sock, CONNACK_ACCEPTED, "CONNACK")
    except BaseException:
        sock.close()
        raise
    return sock


def _answers_connect(port: int) -> bool:
    try:
        with open_raw(port, f"bench-probe-{os.getpid()}") as sock:
            sock.sendall(DISCONNECT)
        return True
    except OSError:
        return False


def raise_open_files_limit() -> int:
    """The soft limit on open files raised to the hard one; returns it (brokers started later inherit it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return sys.maxsize if hard == resource.RLIM_INFINITY else hard


def _ping(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.sendall(PINGREQ)
    for sock in sockets:
        _expect(sock, PINGRESP, "PINGRESP")


def hold_idle(pipe: Connection, port: int, count: int, seconds: float) -> None:
    """Client process: open `count` connections, say how many, keep them (a PINGREQ each before their keepalive runs
    out) until told to close them or `seconds` pass."""
    sockets: list[socket.socket] = []
    try:
        limit = raise_open_files_limit()
        if limit < count + FD_MARGIN:
            pipe.send({"error": f"open-files limit {limit} is below the {count + FD_MARGIN} this client needs"})
            return
        deadline = time.monotonic() + seconds
        pinged = time.monotonic()
        for first in range(0, count, OPEN_AT_ONCE):
            batch = [socket.create_connection((HOST, port), timeout=CONNECT_SECONDS)
                     for _ in range(min(OPEN_AT_ONCE, count - first))]
            sockets.extend(batch)
            for number, sock in enumerate(batch, first):
                sock.sendall(connect_packet(f"bench-idle-{os.getpid()}-{number}"))
            for sock in batch:
                _expect(sock, CONNACK_ACCEPTED, "CONNACK")
            if time.monotonic() - pinged > PING_EVERY:
                _ping(sockets)
                pinged = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(sockets)} connections opened in {seconds:.0f} s, {count} asked")
        pipe.send({"opened": len(sockets)})
        while time.monotonic() < deadline and not pipe.poll(max(0.0, min(PING_EVERY, deadline - time.monotonic()))):
            _ping(sockets)
        pipe.send({"closed": len(sockets)})
    except Exception as error:
        pipe.send({"error": f"{type(error).__name__}: {error} ({len(sockets)} connections open)"})
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.sendall(DISCONNECT)  # (without it, the broker logs each close as unexpected)
            sock.close()


# --- paho clients, for the message runs ---------------------------------------------------------------------------

def _paho_client(client_id: str) -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                         clean_session=True)
    client.username_pw_set(USER, PASSWORD)
    return client


def _loop(client: mqtt.Client, timeout: float) -> None:
    """One turn of paho's network loop; a lost connection raises."""
    if code := client.loop(timeout):
        raise ConnectionError(f"paho: {mqtt.error_string(code)}")


def publish(pipe: Connection, port: int, topic: str, qos: int, size: int, messages: int | None, seconds: float | None,
            window: int, limit: float) -> None:
    """Publisher process, driving paho's loop itself (one thread): connect, say "ready", await "go", then publish
    `messages` messages (or for `seconds`), at QoS 1 with at most `window` unacknowledged; report what it sent."""
    try:
        client = _paho_client(f"bench-pub-{os.getpid()}")
        client.max_inflight_messages_set(window)
        refused, acked = [], [0]
        client.on_connect = lambda _c, _u, _f, reason, _p: refused.append(reason) if reason.is_failure else None
        if qos:  # (at QoS 0 paho would call it for every packet written)
            client.on_publish = lambda *_: acked.__setitem__(0, acked[0] + 1)
        client.connect(HOST, port, keepalive=KEEPALIVE)
        deadline = time.monotonic() + CLIENT_READY_SECONDS
        while not client.is_connected() and not refused and time.monotonic() < deadline:
            _loop(client, 0.1)
        if not client.is_connected():
            pipe.send({"error": f"publisher not connected: {refused[0] if refused else 'no CONNACK'}"})
            return
        pipe.send("ready")
        if not pipe.poll(CLIENT_READY_SECONDS * 2):
            return
        pipe.recv()
        payload = b"x" * size
        start = time.perf_counter()
        end = start + (seconds if seconds is not None else limit)
        count = messages if messages is not None else sys.maxsize
        sent = 0
        while sent < count:
            if qos and sent - acked[0] >= window:
                if time.perf_counter() >= end:
                    break
                _loop(client, 1.0)  # reads PUBACKs
                continue
            if code := client.publish(topic, payload, qos).rc:
                raise ConnectionError(f"paho's publish: {mqtt.error_string(code)}")
            sent += 1
            if client.want_write():  # the socket is full: wait until paho could write it all
                while client.want_write() and time.perf_counter() < end:
                    _loop(client, 1.0)
            elif sent % 1000 == 0:
                _loop(client, 0)  # PINGRESPs, PUBACKs
            if sent % 100 == 0 and time.perf_counter() >= end:
                break
        limit_end = start + limit
        while (client.want_write() or (qos and acked[0] < sent)) and time.perf_counter() < limit_end:
            _loop(client, 1.0)
        elapsed = time.perf_counter() - start
        pipe.send({"sent": sent, "acked": acked[0] if qos else sent, "seconds": elapsed})
        client.disconnect()
        client.loop(0.1)
    except Exception as error:
        pipe.send({"error": f"publisher: {type(error).__name__}: {error}"})


def subscribe(pipe: Connection, port: int, topic: str, qos: int, received, last_received, limit: float) -> None:
    """Subscriber process: paho in its own thread counting messages into `received` (the time of the last one into
    `last_received`); says "ready" once subscribed, disconnects when told to stop."""
    try:
        client = _paho_client(f"bench-sub-{os.getpid()}")
        subscribed, outcome = threading.Event(), []

        def on_message(_client, _userdata, _message) -> None:
            received.value += 1
            last_received.value = time.perf_counter()

        def on_connect(_client, _userdata, _flags, reason, _properties) -> None:
            if reason.is_failure:
                outcome.append(f"subscriber not connected: {reason}")
                subscribed.set()
            else:
                client.subscribe(topic, qos)

        def on_subscribe(_client, _userdata, _mid, reasons, _properties) -> None:
            if reasons[0].is_failure:
                outcome.append(f"subscription refused: {reasons[0]}")
            subscribed.set()

        client.on_message, client.on_connect, client.on_subscribe = on_message, on_connect, on_subscribe
        client.connect(HOST, port, keepalive=KEEPALIVE)
        client.loop_start()
        try:
            if not subscribed.wait(CLIENT_READY_SECONDS):
                outcome.append("subscriber: no SUBACK")
            pipe.send({"error": outcome[0]} if outcome else "ready")
            if not outcome and pipe.poll(limit + CLIENT_READY_SECONDS * 2):
                pipe.recv()  # "stop"
            client.disconnect()
        finally:
            client.loop_stop()
        pipe.send("stopped")
    except Exception as error:
        pipe.send({"error": f"subscriber: {type(error).__name__}: {error}"})


# --- the runs, in the bench's process -----------------------------------------------------------------------------

def _context():
    return multiprocessing.get_context("spawn")  # client processes start clean, whatever this one holds


def _answer(pipe: Connection, process, seconds: float) -> str | dict:
    """What a client process said next: "ready", its figures, or {"error": ...}."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pipe.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            try:
                return pipe.recv()
            except EOFError:
                break
        if not process.is_alive() and not pipe.poll():
            return {"error": f"client process exited with code {process.exitcode}"}
    return {"error": f"no answer from a client process within {seconds:.0f} s"}


def _reason(answer: str | dict) -> str:
    return answer["error"] if isinstance(answer, dict) and "error" in answer else f"unexpected answer {answer!r}"


def _end(processes) -> None:
    for process in processes:
        if process.pid is None:  # never started
            continue
        process.join(JOIN_SECONDS)
        if process.is_alive():
            process.kill()
            process.join(JOIN_SECONDS)


def run_pubsub(target: MqttBroker, qos: int, options: argparse.Namespace) -> dict[str, float] | str:
    """A subscriber process and a publisher process; the broker's CPU time from the go to the last message received
    (read when the subscriber's count last moved)."""
    context = _context()
    topic = f"bench/qos{qos}/{os.getpid()}-{next(_names)}"
    received, last_received = context.RawValue("q", 0), context.RawValue("d", 0.0)
    sub_pipe, sub_end = context.Pipe()
    pub_pipe, pub_end = context.Pipe()
    subscriber = context.Process(target=subscribe, args=(sub_end, target.mqtt_port, topic, qos, received,
                                                         last_received, options.timeout), daemon=True)
    publisher = context.Process(target=publish, args=(pub_end, target.mqtt_port, topic, qos, options.size,
                                                      options.messages, options.seconds, options.window,
                                                      options.timeout), daemon=True)
    pid = target.broker.pid
    try:
        for process, pipe in ((subscriber, sub_pipe), (publisher, pub_pipe)):
            process.start()
            answer = _answer(pipe, process, CLIENT_READY_SECONDS + 30)
            if answer != "ready":
                return _reason(answer)
        before = cpu_seconds(pid)
        go = time.perf_counter()
        pub_pipe.send("go")
        published = _answer(pub_pipe, publisher, options.timeout + 30)
        if not isinstance(published, dict) or "error" in published:
            return _reason(published)
        sent, deadline = published["sent"], go + options.timeout
        seen, cpu, moved = -1, 0.0, time.perf_counter()
        while True:
            count, now = received.value, time.perf_counter()
            if count != seen:
                seen, cpu, moved = count, cpu_seconds(pid) - before, now
            if count >= sent or now - moved > QUIET_SECONDS or now > deadline:
                break
            time.sleep(TICK)
        sub_pipe.send("stop")
        _answer(sub_pipe, subscriber, JOIN_SECONDS)
    finally:
        _end((subscriber, publisher))
    got = received.value
    seconds = last_received.value - go if got else 0.0
    return {"msg/s": got / seconds if seconds > 0 else 0.0, "cpu us/msg": cpu * 1e6 / got if got else 0.0,
            "sent": sent, "received": got, "publish msg/s": sent / published["seconds"]}


def _until_quiet(pid: int) -> None:
    """Wait (bounded) until the broker has done with the connections closed, so that the next run is not billed."""
    deadline = time.monotonic() + QUIET_WAIT_SECONDS
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(0.5)
        if cpu_seconds(pid) - before < QUIET_CPU * 0.5:
            return


def open_files_limit(pid: int) -> int:
    """A process's soft limit on open files (/proc/PID/limits)."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                soft = line[len("Max open files"):].split()[0]
                return sys.maxsize if soft == "unlimited" else int(soft)
    raise LookupError(f"no open-files limit for process {pid}")


def run_idle(target: MqttBroker, options: argparse.Namespace) -> dict[str, float] | str:
    """--connections idle connections from IDLE_PROCESSES client processes; the broker's RSS before they open and
    once they are all open, its CPU time while they open."""
    pid = target.broker.pid
    if (limit := open_files_limit(pid)) < options.connections + FD_MARGIN:
        return f"skipped: the broker's open-files limit is {limit}, below {options.connections + FD_MARGIN}"
    with open_raw(target.mqtt_port, f"bench-warm-up-{os.getpid()}") as warm_up:  # one-off allocations
        warm_up.sendall(DISCONNECT)
    time.sleep(SETTLE_SECONDS)
    context = _context()
    shares = [options.connections // IDLE_PROCESSES + (index < options.connections % IDLE_PROCESSES)
              for index in range(IDLE_PROCESSES)]
    clients = []
    for share in filter(None, shares):
        pipe, end = context.Pipe()
        clients.append((context.Process(target=hold_idle, args=(end, target.mqtt_port, share, options.timeout),
                                        daemon=True), pipe))
    before, cpu_before = resident_kib(pid), cpu_seconds(pid)
    try:
        for process, _ in clients:
            process.start()
        answers = [_answer(pipe, process, options.timeout + 30) for process, pipe in clients]
        cpu = cpu_seconds(pid) - cpu_before
        time.sleep(SETTLE_SECONDS)
        after = resident_kib(pid)
        for process, pipe in clients:
            if process.is_alive():
                pipe.send("close")
        closed = [_answer(pipe, process, JOIN_SECONDS) for process, pipe in clients if process.is_alive()]
    finally:
        _end([process for process, _ in clients])
        _until_quiet(pid)
    failures = [_reason(answer) for answer in (*answers, *closed) if not isinstance(answer, dict) or "error" in answer]
    if failures:
        return failures[0]
    opened = sum(answer["opened"] for answer in answers if isinstance(answer, dict))
    return {"KiB/conn": (after - before) / opened, "cpu us/conn": cpu * 1e6 / opened, "opened": opened,
            "rss before MiB": before / 1024, "rss after MiB": after / 1024}


def runs(options: argparse.Namespace) -> list[BenchRun]:
    what = f"{options.messages:,} messages" if options.messages is not None else f"{options.seconds:g} s"
    window = f"window {options.window}"
    every = {
        "idle": BenchRun("idle", "idle", (), (
            Row(f"memory per idle connection, {options.connections:,} connections (KiB)", "KiB/conn",
                higher_is_better=False),
            Row("  broker CPU per connection opened (µs)", "cpu us/conn", higher_is_better=False)), alternate=False),
        "qos0": BenchRun("qos0", "qos0", (), (
            Row(f"QoS 0 publish -> QoS 0 subscriber, {options.size} B, {what} (msg/s)", "msg/s"), CPU_PER_MESSAGE)),
        "qos1": BenchRun("qos1", "qos1", (), (
            Row(f"QoS 1 publish ({window}) -> QoS 1 subscriber, {options.size} B, {what} (msg/s)", "msg/s"),
            CPU_PER_MESSAGE)),
    }
    return [every[name] for name in SCENARIOS if name in (options.scenario or SCENARIOS)]


SCENARIOS = ("idle", "qos0", "qos1")  # idle first: after the message runs freed memory makes RSS growth meaningless


def run(target: MqttBroker, bench: BenchRun, options: argparse.Namespace) -> dict[str, float] | str:
    if bench.name == "idle":
        return run_idle(target, options)
    return run_pubsub(target, 0 if bench.name == "qos0" else 1, options)


def _await_mqtt(broker: RunningBroker, mqtt_port: int, log: Path) -> MqttBroker:
    try:
        wait_for(lambda: _answers_connect(mqtt_port), MQTT_READY_SECONDS, f"{broker.name}'s MQTT listener", 0.2)
    except AssertionError:
        broker.stop()
        raise BrokerUnavailable(f"{broker.name}'s MQTT listener on port {mqtt_port} did not accept a CONNECT within "
                                f"{MQTT_READY_SECONDS} s: {_tail(log)}") from None
    return MqttBroker(broker, mqtt_port)


def start_brokers(workdir: Path, with_rabbitmq: bool, started: list[MqttBroker]) -> None:
    """Warren, then RabbitMQ unless left out, each with its MQTT listener answering, into `started`."""
    port = free_port()
    try:
        started.append(_await_mqtt(start_warren(workdir, "--mqtt-port", str(port)), port, workdir / "warren.log"))
    except BrokerUnavailable as reason:
        print(f"not compared: {reason}", flush=True)
    if not with_rabbitmq:
        print("RabbitMQ: not run (--no-rabbitmq): Warren's figures alone", flush=True)
        return
    port = free_port()
    try:
        started.append(_await_mqtt(start_rabbitmq(workdir, f"--mqtt={port}"), port, workdir / "rabbitmq.log"))
    except BrokerUnavailable as reason:
        print(f"not compared: {reason} (--no-rabbitmq runs Warren alone)", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.mqtt", description=__doc__.split("\n\n")[0])
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--messages", type=int, help="messages each publisher sends (default 100,000)")
    amount.add_argument("--seconds", type=float, help="publish for this long instead of a number of messages")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="run only this scenario (repeatable; default: all)")
    parser.add_argument("--connections", type=int, default=10_000, help="idle connections (default 10,000)")
    parser.add_argument("--size", type=int, default=16, help="message body bytes (default 16)")
    parser.add_argument("--window", type=int, default=100, help="QoS 1 publishes unacknowledged (default 100)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="the longest one run may publish and receive, or open its connections (default 300 s)")
    parser.add_argument("--no-rabbitmq", action="store_true",
                        help="run Warren alone (e.g. where rabbitmq-server is not installed)")
    args = parser.parse_args(argv)
    if args.messages is None and args.seconds is None:
        args.messages = 100_000
    if (args.messages is not None and args.messages < 1) or (args.seconds is not None and args.seconds <= 0) \
            or args.connections < 1 or args.window < 1 or args.size < 0 or args.timeout <= 0:
        parser.error("--messages, --seconds, --connections, --window and --timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    benches = runs(args)
    open_files = raise_open_files_limit()  # before the brokers start: they inherit it
    if any(bench.name == "idle" for bench in benches) and open_files < args.connections + FD_MARGIN:
        print(f"idle skipped: the open-files limit (ulimit -Hn) is {open_files}, below the "
              f"{args.connections + FD_MARGIN} that {args.connections:,} connections need in the broker; "
              f"lower --connections or raise the hard limit", flush=True)
        benches = [bench for bench in benches if bench.name != "idle"]
    if not benches:
        return 1
    with tempfile.TemporaryDirectory(prefix="warren-bench-mqtt-") as workdir:
        os.chmod(workdir, 0o755)  # rabbitmq-server runs as the rabbitmq user and must reach its data dir
        brokers: list[MqttBroker] = []
        try:
            start_brokers(Path(workdir), not args.no_rabbitmq, brokers)
            if not brokers:
                return 1
            results: dict[str, dict[str, dict | str]] = {}
            for bench in benches:
                outcomes: dict[str, list] = {target.name: [] for target in brokers}
                for target in (brokers + brokers[::-1] if bench.alternate else brokers):  # W R R W
                    outcome = run(target, bench, args)
                    outcomes[target.name].append(outcome)
                    print(f"{bench.name} / {target.name}: {outcome}", file=sys.stderr, flush=True)
                results[bench.name] = {name: _mean(*figures) if len(figures) == 2 else figures[0]
                                       for name, figures in outcomes.items()}
            print_table(results, benches)
            for bench in benches:
                for name, figures in results[bench.name].items():
                    if isinstance(figures, dict) and "sent" in figures and figures["received"] < figures["sent"]:
                        print(f"{bench.name} / {name}: {figures['received']:,.0f} of {figures['sent']:,.0f} "
                              f"messages received (mean of the runs)")
        finally:
            for target in brokers:
                target.broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
